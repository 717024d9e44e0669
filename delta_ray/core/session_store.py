"""The session store: each session's text, IDs and checkpoints, bounded and LRU-evicted.

A state is immutable once stored; an update installs a new state object, so a failed call can
never leave a session half-updated, and eviction only ever costs a re-encode, never IDs.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
from array import array
from collections import OrderedDict

import numpy as np

from delta_ray.core import constants as C
from .errors import DeltaRayError


class SessionNotFound(DeltaRayError, KeyError):
    """``extend`` on a session the store does not hold (never created, or evicted)."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else "session not found"


_VERSIONS = itertools.count(int.from_bytes(os.urandom(6), "little") << 16)


def new_version() -> int:
    """A process-unique, randomly based state version (lets a client splice IDs it already holds)."""
    return next(_VERSIONS)


_I32_EMPTY = np.zeros(0, dtype=np.int32)
_I64_EMPTY = np.zeros(0, dtype=np.int64)
# Trailing text parts whose sum is under this are joined. Small: every turn reads the rope from its
# end only (a window, never the whole tuple), so more parts cost nothing per turn, while a large
# bound made each turn copy its last part again (up to 64K characters, 32K on average).
MERGE_TEXT_BELOW = 1 << 12


YOUNG_PARTS = 8  # recently appended small parts wait to be joined together, 8 at a time


def _merge_parts(parts: list, size, join, small: int) -> tuple:
    """Keep a rope shallow at O(1) amortized copies per appended element and part.

    Parts under ``small`` at the end (a turn's appends) are left alone until there are
    ``YOUNG_PARTS`` of them, then joined in one copy: most turns copy nothing (joining the last
    small part with the new one on every turn copied up to ``small`` elements per turn). The older
    parts form a binary counter (the last two are joined while the older is not more than twice the
    newer), so every element is copied O(log n) times over a session's life and a rope has
    O(log n) + ``YOUNG_PARTS`` parts."""
    parts = [p for p in parts if size(p)]
    young = 0
    while young < len(parts) and size(parts[-1 - young]) < small:
        young += 1
    if young >= YOUNG_PARTS:
        parts[-young:] = [join(parts[-young:])]
    elif young:
        return tuple(parts)
    while len(parts) >= 2 and size(parts[-2]) <= 2 * size(parts[-1]):
        parts[-2:] = [join(parts[-2:])]
    return tuple(parts)


def prefix_parts(parts: tuple[np.ndarray, ...], k: int, total: int | None = None) -> tuple[np.ndarray, ...]:
    """The parts holding the first ``k`` elements of a rope, the last one a zero-copy slice.

    With ``total`` (the rope's length) the parts are walked from the end: a prefix that ends near
    the end (a turn's kept IDs) touches only the parts after it, whatever the rope's depth."""
    if total is not None:
        i, end = len(parts), total
        while i and end - len(parts[i - 1]) >= k:
            end -= len(parts[i - 1])
            i -= 1
        if not i:
            return ()
        last = parts[i - 1]
        pos = end - len(last)
        return parts[:i] if k - pos == len(last) else parts[:i - 1] + (last[:k - pos],)
    out, left = [], k
    for p in parts:
        if left <= 0:
            break
        out.append(p if len(p) <= left else p[:left])
        left -= len(p)
    return tuple(out)


def suffix_parts(parts: tuple, start: int, total: int | None = None) -> list:
    """The parts holding elements ``start:`` of a rope, the first one a slice.

    With ``total`` (the rope's length) the parts are walked from the end, so a suffix near the end
    (a turn's window) touches only the parts it returns, whatever the rope's depth."""
    if total is not None:
        out, end = [], total
        for i in range(len(parts) - 1, -1, -1):
            p = parts[i]
            pos = end - len(p)
            if end <= start:
                break
            out.append(p if pos >= start else p[start - pos:])
            end = pos
        out.reverse()
        return out
    out, pos = [], 0
    for p in parts:
        end = pos + len(p)
        if end > start:
            out.append(p if pos >= start else p[start - pos:])
        pos = end
    return out


def rope_is_prefix(parts: tuple[str, ...], n_chars: int, text: str) -> bool:
    """Whether the rope's text (``n_chars`` long) is a prefix of ``text``: memcmp per part, no copy."""
    if len(text) < n_chars:
        return False
    pos = 0
    for p in parts:
        if not text.startswith(p, pos):
            return False
        pos += len(p)
    return True


class CheckpointLog:
    """Append-only checkpoints (pos, tok, ext, flat in one ``array('q')``) shared by the
    consecutive states of a session.

    A state's checkpoints are entries ``[start:end]`` of a log. A turn that keeps all of its base's
    checkpoints, when its base is the log's newest writer, appends in place; anything else (a
    divergence dropped some, an older state is extended again, a long dead prefix) copies into a
    new log. Entries are never written again once appended, so every state's checkpoints stay
    unchanged: states are as immutable as before, and a turn's checkpoint bookkeeping is
    O(new checkpoints) in plain Python ints (the three numpy arrays used to be rebuilt by
    concatenation on every turn: O(all checkpoints), and numpy calls on the turn's path).
    """

    __slots__ = ("data",)
    _lock = threading.Lock()  # appends: check-and-write is atomic across states sharing a log

    def __init__(self, data: array):
        self.data = data

    @staticmethod
    def extend(base: "SessionState | None", n_keep: int, new: list[int]) -> tuple["CheckpointLog", int, int]:
        """(log, start, end) holding ``base``'s first ``n_keep`` checkpoints followed by ``new``
        (flat pos, tok, ext triples)."""
        k = len(new) // 3
        if base is not None and base._cp_log is not None:
            log, start = base._cp_log, base._cp_start
            at = start + n_keep
            if start <= C.MAX_CHECKPOINTS:  # else copy: the log's dead prefix is dropped
                with CheckpointLog._lock:
                    if 3 * at == len(log.data):
                        log.data.extend(new)
                        return log, start, at + k
            data = log.data[3 * start:3 * at]
        elif n_keep:
            cols = np.stack([base.cp_pos[:n_keep], base.cp_tok[:n_keep], base.cp_ext[:n_keep]], axis=1)
            data = array("q", np.ascontiguousarray(cols, dtype=np.int64).tobytes())
        else:
            data = array("q")
        data.extend(new)
        return CheckpointLog(data), 0, n_keep + k


def merge_text_parts(parts) -> tuple[str, ...]:
    return _merge_parts(list(parts), len, "".join, MERGE_TEXT_BELOW)


def merge_id_parts(parts) -> tuple[np.ndarray, ...]:
    return _merge_parts(list(parts), len, lambda ps: np.concatenate(ps).astype(np.int32, copy=False), 4096)


_CACHES = frozenset({"_text", "_ids", "_cp", "_arrow", "_arrow_from", "_nbytes", "_bytes"})


def buffer_owner(a: np.ndarray):
    """The object whose memory a view ``a`` shows (numpy points every view at the owner)."""
    return a.base if a.base is not None else a


def _to_arrow(p: np.ndarray):
    # assembly imports this module's neighbours: imported on first use, then bound here (an import
    # statement per call walked importlib's machinery on every turn)
    global _to_arrow
    from .assembly import to_arrow
    _to_arrow = to_arrow
    return to_arrow(p)


class SessionState:
    """What a session keeps: its text, its IDs (no post-processing) and checkpoints.

    A checkpoint (pos, tok, ext) says: pos is a safe cut of ``text`` decided from ``text[:ext]``
    alone, and the IDs of ``text[:pos]`` are ``ids[:tok]``. It therefore holds for every text that
    shares at least ``ext`` leading characters with ``text``.

    Text and IDs are kept as short ropes of immutable parts (str and int32 arrays that are never
    written after creation): a turn keeps a prefix of the parts (a zero-copy slice of the last one)
    and appends its new pieces, so it costs O(append), not O(context). ``text`` and ``ids`` join
    the parts on first use (and cache the result) for callers that need one contiguous value.
    States are immutable: an update builds a new state.
    """

    __slots__ = ("text_parts", "id_parts", "version", "n_chars", "n_ids", "last_checkpoint", "n_checkpoints",
                 "_text", "_ids", "_cp_log", "_cp_start", "_cp", "_arrow", "_arrow_from", "_nbytes", "_bytes")

    def __init__(self, text: str | None, ids: np.ndarray | None, cp_pos: np.ndarray | None,
                 cp_tok: np.ndarray | None, cp_ext: np.ndarray | None, version: int | None = None, *,
                 text_parts: tuple[str, ...] | None = None, id_parts: tuple[np.ndarray, ...] | None = None,
                 checkpoints: tuple[CheckpointLog, int, int] | None = None, n_chars: int | None = None,
                 n_ids: int | None = None, arrow_from: tuple | None = None,
                 part_bytes: tuple[int | None, int | None] = (None, None), last: tuple | None = None):
        set_ = object.__setattr__  # a turn builds one state: skip the immutability guard here
        text_parts = tuple(text_parts) if text_parts is not None else ((text,) if text else ())
        if id_parts is not None:
            id_parts = tuple(id_parts)
        else:
            id_parts = (np.asarray(ids, dtype=np.int32),) if ids is not None and len(ids) else ()
        set_(self, "text_parts", text_parts)
        set_(self, "id_parts", id_parts)
        if checkpoints is not None:  # entries of a shared append-only log (see CheckpointLog)
            log, a, b = checkpoints
            set_(self, "_cp_log", log)
            set_(self, "_cp_start", a)
            set_(self, "_cp", None)  # numpy columns, built on first use (not on a turn's path)
            set_(self, "n_checkpoints", b - a)
            # ``last``: the caller's own last (pos, tok, ext) triple (a turn has it as ints), sparing
            # an array slice of the log
            set_(self, "last_checkpoint", (last if last is not None else tuple(log.data[3 * b - 3:3 * b]))
                 if b > a else None)
        else:
            cp = tuple(np.asarray(c if c is not None else _I64_EMPTY, dtype=np.int64) for c in (cp_pos, cp_tok, cp_ext))
            set_(self, "_cp_log", None)
            set_(self, "_cp_start", 0)
            set_(self, "_cp", cp)
            set_(self, "n_checkpoints", len(cp[0]))
            set_(self, "last_checkpoint", tuple(int(c[-1]) for c in cp) if len(cp[0]) else None)
        set_(self, "version", new_version() if version is None else version)
        # The caller that built the rope knows its lengths (a turn: kept + appended), sparing a
        # walk over every part; otherwise they are summed here.
        set_(self, "n_chars", sum(map(len, text_parts)) if n_chars is None else n_chars)
        set_(self, "n_ids", sum(map(len, id_parts)) if n_ids is None else n_ids)
        set_(self, "_text", text if text is not None and text_parts is None else None)
        set_(self, "_ids", None)
        set_(self, "_arrow", None)
        set_(self, "_arrow_from", arrow_from)
        set_(self, "_bytes", part_bytes)  # (text, IDs): given when a turn knows them, else counted once
        set_(self, "_nbytes", None)

    def __setattr__(self, name, value):
        if name in _CACHES or not hasattr(self, "_nbytes"):
            object.__setattr__(self, name, value)
        else:
            raise AttributeError("SessionState is immutable")

    def _checkpoint_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cp = self._cp
        if cp is None:
            a = self._cp_start
            flat = np.frombuffer(self._cp_log.data[3 * a:3 * (a + self.n_checkpoints)], dtype=np.int64)
            rows = flat.reshape(-1, 3)
            cp = self._cp = (rows[:, 0], rows[:, 1], rows[:, 2])
        return cp

    @property
    def cp_pos(self) -> np.ndarray:
        """Checkpoint positions (int64, strictly increasing)."""
        return self._checkpoint_columns()[0]

    @property
    def cp_tok(self) -> np.ndarray:
        """Checkpoint token indices (``ids[:tok]`` are the IDs of ``text[:pos]``)."""
        return self._checkpoint_columns()[1]

    @property
    def cp_ext(self) -> np.ndarray:
        """Checkpoint evidence ends (strictly increasing: the checkpoints are chained)."""
        return self._checkpoint_columns()[2]

    def arrow_chunks(self) -> tuple:
        """The ID parts as zero-copy pyarrow arrays, built once per part: a part this state shares
        with the state it was made from (same array object) reuses that state's array, so a turn
        wraps only its new parts (and the kept part it sliced), not the whole rope."""
        chunks = self._arrow
        if chunks is None:
            old_parts, old_chunks = self._arrow_from or ((), ())
            m = min(len(old_parts), len(old_chunks))
            out = []
            for i, p in enumerate(self.id_parts):
                if i < m and old_parts[i] is p:
                    out.append(old_chunks[i])
                elif i < m and p.base is not None and p.base is buffer_owner(old_parts[i]) and len(p) < len(old_parts[i]):
                    # the kept prefix cut inside the old part: a turn's only view of an old part is
                    # ``old[:k]`` (prefix_parts), so its Arrow array is the old one's zero-copy slice
                    out.append(old_chunks[i].slice(0, len(p)))
                else:
                    out.append(_to_arrow(p))
            chunks = self._arrow = tuple(out)
            self._arrow_from = None
        return chunks

    def arrow_source(self) -> tuple | None:
        """What a state made from this one passes as ``arrow_from`` (None before any Arrow output)."""
        return (self.id_parts, self._arrow) if self._arrow is not None else None

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self.text_parts[0] if len(self.text_parts) == 1 else "".join(self.text_parts)
        return self._text

    @property
    def ids(self) -> np.ndarray:
        if self._ids is None:
            parts = self.id_parts
            self._ids = parts[0] if len(parts) == 1 else (np.concatenate(parts).astype(np.int32, copy=False)
                                                          if parts else _I32_EMPTY)
        return self._ids

    def id_prefix_parts(self, k: int) -> tuple[np.ndarray, ...]:
        """The parts holding ``ids[:k]``, the last one a zero-copy slice."""
        return prefix_parts(self.id_parts, k, self.n_ids)

    def ids_from(self, k: int) -> np.ndarray:
        """``ids[k:]`` as one array, touching only the parts after ``k``."""
        out = suffix_parts(self.id_parts, k, self.n_ids)
        if not out:
            return _I32_EMPTY
        return out[0] if len(out) == 1 else np.concatenate(out).astype(np.int32, copy=False)

    def text_from(self, start: int) -> str:
        """``text[start:]``, touching only the parts after ``start``."""
        out = suffix_parts(self.text_parts, start, self.n_chars)
        return out[0] if len(out) == 1 else "".join(out)

    def prefix_of(self, text: str) -> bool:
        """Whether this state's text is a prefix of ``text`` (memcmp per part, no copies)."""
        return rope_is_prefix(self.text_parts, self.n_chars, text)

    @property
    def nbytes(self) -> int:
        """Memory this state keeps alive: its text parts, every buffer its ID parts show (a slice
        keeps its whole buffer alive: each counted once), and its checkpoints."""
        if self._nbytes is None:
            self._nbytes = self.text_bytes + self.id_bytes + 3 * 8 * self.n_checkpoints
        return self._nbytes

    @property
    def known_bytes(self) -> tuple[int | None, int | None]:
        """(text, IDs) bytes if counted already (a turn derives its own from them), else None each."""
        return self._bytes

    @property
    def text_bytes(self) -> int:
        tb = self._bytes[0]
        if tb is None:
            tb = sum(map(sys.getsizeof, self.text_parts))
            self._bytes = (tb, self._bytes[1])
        return tb

    @property
    def id_bytes(self) -> int:
        ib = self._bytes[1]
        if ib is None:
            ib = owners_bytes(self.id_parts)
            self._bytes = (self._bytes[0], ib)
        return ib

    def __repr__(self) -> str:
        return f"SessionState({self.n_chars} chars, {self.n_ids} ids, {self.n_checkpoints} checkpoints, v{self.version})"


def _buffer_bytes(owner) -> int:
    return owner.nbytes if isinstance(owner, (np.ndarray, memoryview)) else sys.getsizeof(owner)


def owners_bytes(parts) -> int:
    """Bytes of the distinct buffers the arrays ``parts`` show (an engine's bytes object, an
    array): a view keeps its whole buffer alive, so that is what it costs."""
    seen, total = set(), 0
    for p in parts:
        owner = buffer_owner(p)
        if id(owner) not in seen:
            seen.add(id(owner))
            total += _buffer_bytes(owner)
    return total


def entry_bytes(key: str, state: SessionState) -> int:
    """What one stored session costs: its key counts as much as its text (1 MiB keys are memory too)."""
    return sys.getsizeof(key) + state.nbytes


class SessionStore:
    """Thread-safe LRU map from session key to state, bounded by bytes (keys included) and count.

    A single state larger than ``max_state_bytes`` (default a quarter of ``max_bytes``) is not
    stored: its request is still served, and it evicts nothing, so one huge session cannot flush
    every other one.
    """

    def __init__(self, max_bytes: int = C.MAX_SESSION_BYTES, max_sessions: int = C.MAX_SESSIONS,
                 max_state_bytes: int | None = None):
        if max_bytes < 1 or max_sessions < 1:
            raise ValueError("session store bounds must be positive")
        self.max_bytes = max_bytes
        self.max_sessions = max_sessions
        self.max_state_bytes = max_state_bytes if max_state_bytes is not None else max(1, max_bytes // 4)
        self._data: OrderedDict[str, SessionState] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0
        self.refused = 0

    def get(self, key: str) -> SessionState | None:
        """The state of a session (marking it recently used), or None."""
        with self._lock:
            st = self._data.get(key)
            if st is not None:
                self._data.move_to_end(key)
            return st

    def put(self, key: str, state: SessionState) -> bool:
        """Install a new state, evicting least recently used sessions beyond the bounds.

        Returns False (and forgets the key's old state, which the caller has moved past) when the
        state alone is over ``max_state_bytes``.
        """
        size = entry_bytes(key, state)
        with self._lock:
            self._pop_locked(key)
            if size > self.max_state_bytes or size > self.max_bytes:
                self.refused += 1
                return False
            self._data[key] = state
            self._sizes[key] = size
            self._bytes += size
            while self._data and (self._bytes > self.max_bytes or len(self._data) > self.max_sessions):
                k, _ = self._data.popitem(last=False)
                self._bytes -= self._sizes.pop(k)
                self.evictions += 1
            return True

    def _pop_locked(self, key: str) -> SessionState | None:
        st = self._data.pop(key, None)
        if st is not None:
            self._bytes -= self._sizes.pop(key)
        return st

    def pop(self, key: str) -> SessionState | None:
        """Remove a session (a client that ends its conversation)."""
        with self._lock:
            return self._pop_locked(key)

    def clear(self) -> int:
        """Forget every session (the engine that produced them was found wrong); returns how many."""
        with self._lock:
            n = len(self._data)
            self._data.clear()
            self._sizes.clear()
            self._bytes = 0
            return n

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    @property
    def resident_bytes(self) -> int:
        return self._bytes
