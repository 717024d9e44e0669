"""The worker actor: one loaded tokenizer and one session store, serving its sessions.

Workers hold sticky session state (text, IDs, checkpoints); the pool routes each session to its
home worker by CRC-32 of the key. An idle worker also runs stateless chunks from the shared queue.
Session answers are *deltas* when the caller already holds the previous IDs (same state version):
returning a 100K-token transcript every turn would cost more than the repair itself.
"""
from __future__ import annotations

import functools
import os
import threading

import numpy as np
import ray

from delta_ray._core.config import TokenizerConfig
from delta_ray._core.hosts import SessionHost
from delta_ray._core.keys import describe, is_keyless_head
from delta_ray._core.session_store import SessionState
from delta_ray._core.state_seal import verify_state

from . import metrics, worker_channel
from .calls import CHANNEL_METHODS
from .tokenizer_cache import get_tokenizer


def _locked(method):
    """Run under the worker's lock: Ray calls and side-channel calls share one tokenizer."""
    @functools.wraps(method)
    def run(self, *args):
        with self._lock:
            return method(self, *args)
    return run


class WorkerService:
    """What a worker does, without Ray: one tokenizer and one session store, behind a lock.

    Its public methods are the :mod:`~delta_ray.actors.calls` kinds; the Ray actor below adds only
    the side channel and readiness. Tests run it in process behind a fake transport.
    """

    def __init__(self, tokenizer: SessionHost, secret: bytes):
        self._lock = threading.Lock()
        self._secret = secret  # the pool's: authenticates the side channel and sealed session states
        self.core = tokenizer  # the stateless encoder
        self.sessions = tokenizer.sessions  # the session owner

    @_locked
    def encode_session(self, key: str, text: str, known_version: int | None) -> tuple[int, int, np.ndarray]:
        """(version, k, tail): IDs (no post-processing) = caller's IDs of known_version[:k] + tail.
        ``key`` a keyless head (the pool's keyless texts): the conversation ``text`` continues
        under it, by the core's keyless policy (the caller then names no version)."""
        if is_keyless_head(key):
            choice = self.sessions.choose_keyless(text, head=key)
            if choice is not None:
                key = choice.key
        return self.sessions.encode_session_delta(key, text, known_version)

    @_locked
    def extend(self, key: str, delta: str, known_version: int | None,
               expect_version: int | None = None) -> tuple[int, int, np.ndarray]:
        """Like encode_session for the stored text plus delta; SessionNotFound if not held, or if the
        held state is not the version the caller extends (a stale extend that outlived its timeout)."""
        return self.sessions.encode_session_delta(key, "", known_version, delta=delta, expect_version=expect_version)

    @_locked
    def install(self, key: str, state: SessionState, seal: bytes) -> bool:
        """Adopt a state the pool computed (chunked initialization); refused unless its seal verifies."""
        if not verify_state(self._secret, key, state, seal):
            raise PermissionError(f"refused to install {describe(key)}: the state is not sealed by this pool")
        self.sessions.install_session(key, state)
        return True

    @_locked
    def encode_pieces(self, pieces: list[str]) -> list[np.ndarray]:
        return self.core.run_pieces(pieces)

    @_locked
    def encode_whole(self, text: str, add_special_tokens: bool) -> np.ndarray:
        """A stateless text's IDs, post-processed (an unadmitted configuration's whole-text plan)."""
        return self.core.encode_ids(text, add_special_tokens=add_special_tokens)

    @_locked
    def has_session(self, key: str) -> bool:
        return self.sessions.has_session(key)

    @_locked
    def drop_session(self, key: str) -> bool:
        return self.sessions.drop_session(key)

    @_locked
    def stats(self) -> dict:
        sh = self.core.shadow
        return {"paths": dict(self.core.stats), "sessions": len(self.sessions.store),
                "resident_bytes": self.sessions.store.resident_bytes, "pid": os.getpid(),
                "engine": self.core.admission.engine,
                "shadow": {"comparisons": sh.comparisons, "mismatches": sh.mismatches}}


@ray.remote(max_restarts=0, max_concurrency=1)
class TokenizerWorker(WorkerService):
    """Ray actor: a :class:`WorkerService` plus its authenticated same-node side channel."""

    def __init__(self, config_bytes: bytes, digest: str, config: TokenizerConfig, secret: bytes):
        super().__init__(get_tokenizer(config_bytes, digest, config, settle=True), secret)
        self.core.shadow.add_listener(metrics.record_shadow)  # comparisons and mismatches as metrics
        self._channel = (worker_channel.ChannelServer(self._channel_call, secret, methods=CHANNEL_METHODS)
                         if worker_channel.supported() else None)

    def _channel_call(self, method: str, args: tuple):
        return getattr(self, method)(*args)  # the server checked the whitelist

    def channel(self) -> dict:
        """Where this worker's side channel listens (None when unsupported), on which node, which pid."""
        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "address": self._channel.address if self._channel is not None else None}

    def ready(self) -> dict:
        """Loaded and serving: the process id and node, for placement checks."""
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
                "digest": self.core.digest, "admitted": self.core.admission.admitted}
