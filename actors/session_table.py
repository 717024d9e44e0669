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
from typing import Any

from delta_ray._core.session_store import arrow_parts

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


class SessionRecord:
    """What the pool believes about one session; read directly, written through the table (which
    keeps the byte count)."""

    __slots__ = ("worker", "version", "ids", "text", "start", "ids_nbytes", "text_nbytes")

    def __init__(self):
        self.worker = self.version = self.ids = self.text = self.start = None
        self.ids_nbytes = self.text_nbytes = 0

    @property
    def nbytes(self) -> int:
        return _RECORD_OVERHEAD + self.ids_nbytes + self.text_nbytes

    def empty(self) -> bool:
        return self.worker is None and self.version is None and self.ids is None and self.text is None \
            and self.start is None


class SessionTable:
    """session -> :class:`SessionRecord` (worker, version, ids, text, start), least recently used
    evicted first.

    ``max_bytes`` bounds the IDs and texts held plus a per-record overhead; a single value over
    half of it is not kept (the field stays empty). ``max_items`` bounds the number of records.
    A request reads its record once (:meth:`get`) and writes what it learned in one call
    (:meth:`answered`, :meth:`sent`): one digest, one LRU touch and one size update each, not one
    per field (a no-op call's share of the pool's overhead).
    """

    def __init__(self, max_bytes: int, max_items: int):
        self.max_bytes, self.max_items = max_bytes, max_items
        self._data: OrderedDict[bytes, SessionRecord] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def resident_bytes(self) -> int:
        return self._bytes


    def get(self, key: str) -> SessionRecord | None:
        """The session's record (marked recently used), or None."""
        kid = key_id(key)
        rec = self._data.get(kid)
        if rec is not None:
            self._data.move_to_end(kid)
        return rec

    def _record(self, key: str) -> tuple[bytes, SessionRecord]:
        kid = key_id(key)
        rec = self._data.get(kid)
        if rec is None:
            rec = self._data[kid] = SessionRecord()
            self._bytes += _RECORD_OVERHEAD
        else:
            self._data.move_to_end(kid)
        return kid, rec

    def _set_ids(self, rec: SessionRecord, value, size: int | None = None) -> None:
        if size is None:
            size = ids_bytes(value[1]) if value is not None else 0
        if size > self.max_bytes // 2:
            value, size = None, 0  # too large to mirror: served without (a whole answer next time)
        self._bytes += size - rec.ids_nbytes
        rec.ids, rec.ids_nbytes = value, size

    def _set_text(self, rec: SessionRecord, value) -> None:
        size = text_bytes(value[1]) if value is not None else 0
        if size > self.max_bytes // 2:
            value, size = None, 0
        self._bytes += size - rec.text_nbytes
        rec.text, rec.text_nbytes = value, size

    def _settle(self, kid: bytes, rec: SessionRecord) -> None:
        if rec.empty():
            self._drop(kid)
        else:
            self._evict()

    def answered(self, key: str, worker: str | None, version: int, id_parts: tuple, start: int,
                 chunks: tuple | None = None, n_ids: int | None = None) -> None:
        """A worker's session answer: who holds it, its state version, the IDs the caller got
        (``(version, id_parts, chunks)``: ``chunks`` the parts' zero-copy Arrow arrays, made here
        if not given; ``n_ids`` their count where the caller knows it, int32 parts, so their bytes
        need no walk) and the first ID that changed."""
        kid, rec = self._record(key)
        rec.worker, rec.version, rec.start = worker, version, start
        if chunks is None:
            chunks = arrow_parts(id_parts)
        self._set_ids(rec, (version, id_parts, chunks), None if n_ids is None else 4 * n_ids)
        self._evict()

    def sent(self, key: str, version: int | None, text_parts: tuple | None) -> None:
        """The text the session's state ``version`` holds (``text_parts`` None forgets it)."""
        if text_parts is None:
            self.set(key, "text", None)
            return
        kid, rec = self._record(key)
        self._set_text(rec, (version, text_parts))
        self._evict()

    def sent_now(self, key: str, text_parts: tuple) -> None:
        """The text of the state the record names now (the one the answer just recorded)."""
        kid, rec = self._record(key)
        self._set_text(rec, (rec.version, text_parts))
        self._evict()

    def set(self, key: str, name: str, value) -> Any:
        """Set a field (None clears it); returns the old value. Evicts old records past the bounds."""
        kid = key_id(key)
        rec = self._data.get(kid)
        if rec is None:
            if value is None:
                return None
            kid, rec = self._record(key)
        else:
            self._data.move_to_end(kid)
        old = getattr(rec, name)
        if name == "ids":
            self._set_ids(rec, value)
        elif name == "text":
            self._set_text(rec, value)
        else:
            setattr(rec, name, value)
        self._settle(kid, rec)
        return old

    def forget(self, key: str) -> None:
        """Drop everything known about a session."""
        self._drop(key_id(key))

    def _drop(self, kid: bytes) -> None:
        rec = self._data.pop(kid, None)
        if rec is not None:
            self._bytes -= rec.nbytes

    def _evict(self) -> None:
        while len(self._data) > 1 and (len(self._data) > self.max_items or self._bytes > self.max_bytes):
            _, old = self._data.popitem(last=False)
            self._bytes -= old.nbytes

