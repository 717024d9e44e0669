"""The per-process cache of tokenizers (pool workers, chunk tasks, Ray Data tasks), bounded.

Configuration bytes travel through Ray's object store; a process checks their SHA-256 once, builds
a :class:`TokenizerCore` and reuses it for every task it runs (building one costs seconds of CPU:
the fast engine and the reference each parse the configuration). One cache for every kind of task,
least recently used first out, at most :data:`MAX_ENTRIES` configurations: a long-lived Ray worker
process that meets many tokenizers keeps the latest ones, not all of them. Entries with the same
bytes share one :class:`LoadedTokenizer` (one reference, built once).
"""
from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import Callable, Union

from delta_ray._core.config import TokenizerConfig
from delta_ray._core.loading import LoadedTokenizer
from delta_ray._engine.native import FastEngineUnavailable
from delta_ray._runtime.heap import freeze_heap
from delta_ray._tokenizer_core import TokenizerCore

MAX_ENTRIES = 2  # configurations per process (each holds its engines: ~100-300 MB)

# The configuration's bytes, or what fetches them: a chunk task receives its configuration's object
# reference unresolved and fetches the bytes only when its process lacks the tokenizer (resolving
# a configuration of megabytes for every task would cost a node's CPU on every task).
ConfigSource = Union[bytes, Callable[[], bytes]]

_CACHE: OrderedDict[tuple, TokenizerCore] = OrderedDict()
_LOCK = threading.Lock()


def build_tokenizer(config_bytes: bytes, digest: str, config: TokenizerConfig, *, lazy: bool = False,
                    fallback: bool = False, loaded: LoadedTokenizer | None = None) -> TokenizerCore:
    """A new TokenizerCore for these bytes (digest-checked) and options.

    ``lazy``: build the reference only when something needs it (a guarded text, a fallback, the
    shadow check's background thread): a Ray Data worker whose texts all go to an admitted fast
    tier saves about a CPU-second, and exactness is unchanged (every path that needs the reference
    builds it first). ``fallback``: when the fast tier is unavailable here, encode with the
    reference instead of raising :class:`FastEngineUnavailable`."""
    if loaded is None:
        loaded = LoadedTokenizer.from_bytes(config_bytes, expected_digest=digest, lazy=lazy)
    elif not lazy:
        loaded.tokenizer  # noqa: B018 - an eager caller sharing a lazy entry's bytes: build it now
    try:
        return TokenizerCore(loaded, config)
    except FastEngineUnavailable:
        if not fallback:
            raise
        return TokenizerCore(loaded, dataclasses.replace(config, engine="reference"))


def get_tokenizer(config_bytes: ConfigSource, digest: str, config: TokenizerConfig, *, lazy: bool = False,
                  fallback: bool = False, settle: bool = False) -> TokenizerCore:
    """The process's TokenizerCore for these bytes and options (built on first use, see
    :func:`build_tokenizer`; then the most recently used entry). ``config_bytes`` may be a function
    that fetches them: called only when no entry of this process holds ``digest``'s bytes, whose
    SHA-256 the build then checks as always. ``settle``: after a build, freeze the process's heap
    (:func:`~delta_ray._runtime.heap.freeze_heap`), in a process delta-ray owns (a pool worker, a
    chunk-task process): its full garbage collections then skip the tokenizer and Ray."""
    key = (digest, config, fallback)
    with _LOCK:
        core = _CACHE.get(key)
        if core is None:
            same_bytes = next((c.loaded for (d, _, _), c in _CACHE.items() if d == digest), None)
            if same_bytes is None and callable(config_bytes):
                config_bytes = config_bytes()
            core = build_tokenizer(config_bytes, digest, config, lazy=lazy, fallback=fallback, loaded=same_bytes)
            while len(_CACHE) >= MAX_ENTRIES:
                _CACHE.popitem(last=False)  # the least recently used
            _CACHE[key] = core
            if settle:
                freeze_heap()
        else:
            _CACHE.move_to_end(key)
        return core


def cached(digest: str, config: TokenizerConfig, fallback: bool = False) -> bool:
    """Whether the cache holds this configuration now (no build, no wait)."""
    return (digest, config, fallback) in _CACHE


def clear() -> None:
    """Forget every cached tokenizer (tests; a process that wants its memory back)."""
    with _LOCK:
        _CACHE.clear()
