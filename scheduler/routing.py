"""Where a request goes: its session's home worker, or the shared queue when it carries no state.

Routing is a pure function of the session key and the set of live workers, so every pool replica
(and every restart) agrees on a session's home without shared state, and a session's cached
prefix stays on one worker for as long as the worker set does not change.
"""
from __future__ import annotations

import hashlib
import zlib
from typing import Sequence

from .constants import CONTENT_KEY_BYTES, CONTENT_KEY_DIGEST_SIZE


def _utf8(text: str) -> bytes:
    # surrogatepass: a lone surrogate must not crash routing; the encoder rejects such text later
    # with a proper error, and for valid text this is exactly UTF-8.
    return text.encode("utf-8", "surrogatepass")


def home_worker(session_key: str, live_workers: Sequence[str]) -> str:
    """Return the home worker of ``session_key``: CRC-32 of its UTF-8 bytes modulo the live count.

    Workers are sorted (and de-duplicated) first, so the answer does not depend on the order in
    which the caller lists them. Raises ValueError when no worker is live.
    """
    workers = sorted(set(live_workers))
    if not workers:
        raise ValueError("no live workers to route to")
    return workers[zlib.crc32(_utf8(session_key)) % len(workers)]


def content_key(text: str) -> str:
    """Return a session key derived from a keyless text: blake2b-128 hex of its first 4,096 UTF-8 bytes.

    Identical (or identically opening) keyless texts then share a home, so a repeated prompt finds
    its cached state; 4,096 bytes bound the hashing cost on huge texts.
    """
    # Each character is at least one byte, so the first 4,096 characters hold the first 4,096 bytes;
    # slicing first avoids encoding a whole megabyte text just to hash its start.
    head = _utf8(text[:CONTENT_KEY_BYTES])[:CONTENT_KEY_BYTES]
    return hashlib.blake2b(head, digest_size=CONTENT_KEY_DIGEST_SIZE).hexdigest()
