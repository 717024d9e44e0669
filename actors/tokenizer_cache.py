"""Per-process cache of loaded tokenizers, keyed by the configuration's SHA-256.

Configuration bytes travel through Ray's object store; every process checks the digest once and
then reuses the loaded tokenizer for every task it runs.
"""
from __future__ import annotations

import threading

from delta_ray.core.config import TokenizerConfig
from delta_ray.core.loading import LoadedTokenizer
from delta_ray.tokenizer_core import TokenizerCore

_CACHE: dict[tuple, TokenizerCore] = {}
_LOCK = threading.Lock()


def get_tokenizer(config_bytes: bytes, digest: str, config: TokenizerConfig) -> TokenizerCore:
    """The process's TokenizerCore for these bytes and options (digest-checked on first load)."""
    key = (digest, config)
    with _LOCK:
        dt = _CACHE.get(key)
        if dt is None:
            loaded = LoadedTokenizer.from_bytes(config_bytes, expected_digest=digest)
            dt = TokenizerCore(loaded, config)
            _CACHE[key] = dt
        return dt
