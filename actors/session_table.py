"""The pool's per-session records: one LRU, bounded by count and by bytes, keyed by a digest.

For each session the orchestrator remembers the worker believed to hold it, the version of that
worker's state, the IDs it last returned (to splice a worker's delta answer), the text it last
sent (so a whole-transcript turn ships only its suffix) and where its last answer started to
differ. These used to be five tables, one of them never trimmed; as one record per session they
are evicted together, so nothing about a session outlives the rest, and the bound covers all of it.

Evicting a record costs time, never exactness: the next turn sends the whole text (no version, so
the worker answers all IDs), or re-initializes a long session in chunks. Ray-free.
"""
from __future__ import annotations

import hashlib
import sys
from collections import OrderedDict
from typing import Any, Callable

_RECORD_OVERHEAD = 200  # bytes per record besides its values (dict slot, record, digest, tuples)
_KID_CACHE_CHARS = 1 << 20  # key characters the digest cache may hold (keys may be megabytes)
_KID_CACHE_ITEMS = 256
_kid_cache: "OrderedDict[str, bytes]" = OrderedDict()
_kid_cache_chars = 0


def key_id(key: str) -> bytes:
    """A fixed-size stand-in for a session key in the pool's tables (16 bytes of BLAKE2b).

    One request looks its key up several times, so recent keys' digests are cached, bounded by the
    keys' total length as well as their number: the cache never keeps megabytes of keys alive.
    """
    global _kid_cache_chars
    kid = _kid_cache.get(key)
    if kid is not None:
        return kid
    kid = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    if len(key) <= _KID_CACHE_CHARS // 8:
        try:
            _kid_cache[key] = kid
            _kid_cache_chars += len(key)
            while len(_kid_cache) > _KID_CACHE_ITEMS or _kid_cache_chars > _KID_CACHE_CHARS:
                old, _ = _kid_cache.popitem(last=False)
                _kid_cache_chars -= len(old)
        except KeyError:  # another thread emptied it meanwhile: a cache, nothing to keep consistent
            pass
    return kid


def ids_bytes(parts) -> int:
    return sum(p.nbytes for p in parts)


def text_bytes(parts) -> int:
    return sum(map(sys.getsizeof, parts))


class _Record:
    __slots__ = ("worker", "version", "ids", "text", "start", "nbytes")

    def __init__(self):
        self.worker = self.version = self.ids = self.text = self.start = None
        self.nbytes = _RECORD_OVERHEAD

    def empty(self) -> bool:
        return self.worker is None and self.version is None and self.ids is None and self.text is None \
            and self.start is None


class SessionTable:
    """session -> record (worker, version, ids, text, start), least recently used evicted first.

    ``max_bytes`` bounds the IDs and texts held plus a per-record overhead; a single value over
    half of it is not kept (the field stays empty). ``max_items`` bounds the number of records.
    """

    SIZES: dict[str, Callable[[Any], int]] = {"ids": lambda v: ids_bytes(v[1]), "text": lambda v: text_bytes(v[1])}

    def __init__(self, max_bytes: int, max_items: int):
        self.max_bytes, self.max_items = max_bytes, max_items
        self._data: OrderedDict[bytes, _Record] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def resident_bytes(self) -> int:
        return self._bytes

    def field(self, name: str) -> "_Field":
        """A view of one field with the get/put/pop of a separate table."""
        return _Field(self, name)

    def get(self, key: str, name: str):
        rec = self._data.get(key_id(key))
        if rec is None:
            return None
        self._data.move_to_end(key_id(key))
        return getattr(rec, name)

    def set(self, key: str, name: str, value) -> Any:
        """Set a field (None clears it); returns the old value. Evicts old records past the bounds."""
        kid = key_id(key)
        rec = self._data.get(kid)
        if rec is None:
            if value is None:
                return None
            rec = self._data[kid] = _Record()
            self._bytes += rec.nbytes
        else:
            self._data.move_to_end(kid)
        old = getattr(rec, name)
        size_of = self.SIZES.get(name)
        if size_of is not None:
            if old is not None:
                self._resize(rec, -size_of(old))
            if value is not None:
                size = size_of(value)
                if size > self.max_bytes // 2:
                    value = None  # too large to mirror: served without (a whole answer next time)
                else:
                    self._resize(rec, size)
        setattr(rec, name, value)
        if rec.empty():
            self._drop(kid)
        else:
            self._evict()
        return old

    def forget(self, key: str) -> None:
        """Drop everything known about a session."""
        self._drop(key_id(key))

    def _resize(self, rec: _Record, delta: int) -> None:
        rec.nbytes += delta
        self._bytes += delta

    def _drop(self, kid: bytes) -> None:
        rec = self._data.pop(kid, None)
        if rec is not None:
            self._bytes -= rec.nbytes

    def _evict(self) -> None:
        while len(self._data) > 1 and (len(self._data) > self.max_items or self._bytes > self.max_bytes):
            _, old = self._data.popitem(last=False)
            self._bytes -= old.nbytes


class _Field:
    """One field of a :class:`SessionTable`'s records, used like the separate table it replaced:
    ``get(key)``, ``put(key, value)`` or ``put(key, version, parts)``, ``pop(key)``."""

    __slots__ = ("_table", "_name")

    def __init__(self, table: SessionTable, name: str):
        self._table, self._name = table, name

    def get(self, key: str, default=None):
        value = self._table.get(key, self._name)
        return default if value is None else value

    def put(self, key: str, *value) -> None:
        self._table.set(key, self._name, value[0] if len(value) == 1 else tuple(value))

    def pop(self, key: str, default=None):
        old = self._table.set(key, self._name, None)
        return default if old is None else old
