"""fastokens in the caller's process, loaded once and reused, as a user would hold it in a server.

It re-encodes the whole text every call (``encode_batch_flat``: IDs as a buffer, no Python list),
optionally with its segment cache (``enable_segment_cache``: for chat, it reuses the text between
added tokens seen in earlier requests). The demo's sections and bench_turns' idle protocol time it.
"""
from __future__ import annotations

import numpy as np

SEGMENT_CACHE_BYTES = 512 << 20


def fastokens_version() -> str | None:
    """The installed fastokens' version, or None."""
    from delta_ray._engine.native import package_version
    return package_version("fastokens")


def _load_fastokens(path: str, segment_cache: bool, cache_bytes: int):
    import fastokens
    tok = fastokens.Tokenizer.from_file(path)
    if hasattr(tok, "enable_segment_cache"):
        tok.enable_segment_cache(cache_bytes if segment_cache else 0)
    elif segment_cache:
        return None
    return tok


class Fastokens:
    """One fastokens tokenizer as a user would hold it in a server: loaded once, reused; with its
    segment cache of ``cache_bytes`` when ``segment_cache``."""

    def __init__(self, path: str, segment_cache: bool = False, cache_bytes: int = SEGMENT_CACHE_BYTES):
        self.tok = _load_fastokens(path, segment_cache, cache_bytes)
        if self.tok is None:
            raise ImportError("this fastokens has no segment cache")

    def ids(self, text: str) -> np.ndarray:
        buf, _ = self.tok.encode_batch_flat([text], add_special_tokens=True)
        return np.frombuffer(buf, dtype="<u4").view("<i4")
