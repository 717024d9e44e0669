"""Keyless reuse: find a stored text that is a prefix of a new request, by content.

Each stored text is indexed by keyed BLAKE2b-128 digests of its UTF-8 prefixes at byte offsets
4096, 8192, 16384, ... and at its end. One pass over a request hashes the same offsets and proposes
the longest stored prefix; the caller confirms it by comparing the texts before any IDs are reused,
so a digest collision can cost time, never exactness. The key is per process and secret, so
nobody can craft collisions.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict

from delta_ray.core import constants as C


def prefix_offsets(n_bytes: int, start: int = C.CONTENT_MIN_BYTES) -> list[int]:
    """Byte offsets indexed for a text of n_bytes: doubling from ``start``, then the end."""
    offs = []
    o = start
    while o < n_bytes:
        offs.append(o)
        o *= 2
    if n_bytes >= start:
        offs.append(n_bytes)
    return offs


class ContentIndex:
    """Digest -> entry key, for the prefixes of at most ``max_entries`` stored texts (oldest dropped)."""

    def __init__(self, max_entries: int = C.CONTENT_MAX_ENTRIES, min_bytes: int = C.CONTENT_MIN_BYTES):
        self.max_entries = max_entries
        self.min_bytes = min_bytes
        self._key = os.urandom(32)
        self._by_digest: dict[bytes, str] = {}
        self._entries: OrderedDict[str, list[bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def _digests(self, data: bytes) -> list[tuple[int, bytes]]:
        h = hashlib.blake2b(digest_size=16, key=self._key)
        out, pos = [], 0
        for off in prefix_offsets(len(data), self.min_bytes):
            h.update(memoryview(data)[pos:off])
            pos = off
            out.append((off, h.copy().digest()))
        return out

    def lookup(self, data: bytes) -> str | None:
        """The entry whose longest indexed prefix matches a prefix of ``data`` (unconfirmed)."""
        if len(data) < self.min_bytes:
            return None
        best = None
        digests = self._digests(data)
        with self._lock:
            for _off, d in digests:
                key = self._by_digest.get(d)
                if key is not None:
                    best = key
        return best

    def add(self, entry: str, data: bytes) -> list[str]:
        """Index a stored text under ``entry``; returns the entries dropped to stay within bounds."""
        digests = [d for _o, d in self._digests(data)]
        dropped = []
        with self._lock:
            self._remove_locked(entry)
            self._entries[entry] = digests
            for d in digests:
                self._by_digest[d] = entry
            while len(self._entries) > self.max_entries:
                old, _ = next(iter(self._entries.items()))
                self._remove_locked(old)
                dropped.append(old)
        return dropped

    def remove(self, entry: str) -> None:
        with self._lock:
            self._remove_locked(entry)

    def _remove_locked(self, entry: str) -> None:
        digests = self._entries.pop(entry, None)
        for d in digests or ():
            if self._by_digest.get(d) == entry:
                del self._by_digest[d]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_digest.clear()

    def __len__(self) -> int:
        return len(self._entries)
