"""Stateless chunks as Ray tasks: encode pieces with no post-processing, return int32 buffers."""
from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np
import ray

from delta_ray._core.config import PoolConfig, TokenizerConfig
from delta_ray._tokenizer_core import TokenizerCore

from .calls import ENCODE_PIECES, ENCODE_WHOLE, Call
from .local_ray import WORKER_ENV
from .tokenizer_cache import get_tokenizer

# Chunk tasks run in processes of their own (a runtime env no other task shares), so lowering
# their CPU priority touches nothing but chunks.
CHUNK_ENV = {**WORKER_ENV, "DELTA_RAY_CHUNK_PROCESS": "1"}
_niced = False


def _lower_priority(nice: int) -> None:
    """Raise this process's niceness once, so session repairs on the same cores go first.

    Session workers never interrupt a running encode, but the OS can: with chunk processes at a
    higher niceness, a turn that lands on a busy node gets most of a core at once instead of a
    third of one. With idle cores it changes nothing.
    """
    global _niced
    if not _niced and nice > 0 and os.environ.get("DELTA_RAY_CHUNK_PROCESS") == "1":
        try:
            os.nice(nice)
        except OSError:  # not permitted here: run at normal priority
            pass
    _niced = True


def _tokenizer(config: tuple, digest: str, options: TokenizerConfig) -> TokenizerCore:
    """This process's tokenizer for ``options``; a chunk process (its own runtime env) freezes its
    heap after a build, so its full garbage collections do not stall the chunks it runs."""
    return get_tokenizer(_fetch(config), digest, options, settle=os.environ.get("DELTA_RAY_CHUNK_PROCESS") == "1")


def _fetch(config: tuple) -> Callable[[], bytes]:
    """What fetches the configuration's bytes from ``config``, a 1-tuple holding their object
    reference: Ray resolves a task's top-level references before it runs, nested ones only when
    asked, so a process that already holds the tokenizer never reads the 11 MB."""
    return lambda: ray.get(config[0])


@ray.remote(max_retries=3)
def encode_chunks(config: tuple, digest: str, pieces: list[str], options: TokenizerConfig,
                  nice: int = 0) -> list[np.ndarray]:
    """IDs of each piece (reference-exact, add_special_tokens=False) from a cached tokenizer."""
    _lower_priority(nice)
    return _tokenizer(config, digest, options).run_pieces(pieces)


@ray.remote(max_retries=3)
def encode_whole(config: tuple, digest: str, text: str, add_special_tokens: bool, options: TokenizerConfig,
                 nice: int = 0) -> np.ndarray:
    """A stateless text's IDs, post-processed: an unadmitted configuration's whole-text plan."""
    _lower_priority(nice)
    return _tokenizer(config, digest, options).encode_ids(text, add_special_tokens=add_special_tokens)


@ray.remote(max_retries=0)
def warm_chunk_process(config: tuple, digest: str, options: TokenizerConfig, nice: int, hold_s: float) -> int:
    """Load the tokenizer in a chunk-task process and hold it ``hold_s`` seconds, so that n warm-up
    tasks occupy n distinct processes at once instead of reusing the first one."""
    _lower_priority(nice)
    _tokenizer(config, digest, options).run_pieces(["warm up"])
    time.sleep(hold_s)
    return os.getpid()


class ChunkLauncher:
    """Launches a pool's shared calls (pieces of a long text; an unadmitted text whole) as Ray
    tasks: what :class:`~delta_ray.actors.transport.RayTransport` runs for ``wid=None``."""

    def __init__(self, config_ref, digest: str, config: PoolConfig):
        self._config_ref, self._digest, self._config = (config_ref,), digest, config  # boxed: see _fetch
        self._options = {"num_cpus": config.task_cpus, "scheduling_strategy": "SPREAD",
                         "runtime_env": {"env_vars": CHUNK_ENV}}

    def __call__(self, call: Call):
        cfg = self._config
        if call.kind is ENCODE_PIECES:
            return encode_chunks.options(**self._options).remote(self._config_ref, self._digest, call.args.pieces,
                                                                 cfg.tokenizer, cfg.task_nice)
        if call.kind is ENCODE_WHOLE:
            text, add = call.args.text, call.args.add_special_tokens
            return encode_whole.options(**self._options).remote(self._config_ref, self._digest, text, add,
                                                                cfg.tokenizer, cfg.task_nice)
        raise ValueError(f"{call.kind.method} is not a shared call")

    def warm(self, hold_s: float):
        """A task that loads the tokenizer in a chunk-task process and holds it ``hold_s`` seconds."""
        return warm_chunk_process.options(**self._options).remote(
            self._config_ref, self._digest, self._config.tokenizer, self._config.task_nice, hold_s)


def warm_distinct(run_round: Callable[[int, float], list[int]], n: int, deadline_s: float, *,
                  first_hold_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> int:
    """Run rounds of ``n`` warm-up tasks until one round ran in ``n`` distinct processes at once;
    returns the most distinct processes a round saw.

    A warm-up task holds its process ``hold_s`` after loading the tokenizer, so that the round's
    other tasks cannot reuse it; but a process Ray starts for a queued task takes longer than that
    on a busy node (seconds: Python, Ray, the tokenizer), so a fixed hold lets every task of the
    round run one after another in the one process already warm, and the first burst of chunks
    then waits for a cold process on the request path. Doubling the hold each round until the
    round sees ``n`` processes waits about as long as a process start, and no longer.
    """
    hold, best = first_hold_s, 0
    end = clock() + deadline_s
    while True:
        best = max(best, len(set(run_round(n, hold))))
        if best >= n or clock() + 2 * hold >= end:
            return best
        hold *= 2
