"""The session store: each session's text, IDs and checkpoints, bounded and LRU-evicted.

A state is immutable once stored; an update installs a new state object, so a failed call can
never leave a session half-updated, and eviction only ever costs a re-encode, never IDs.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
from collections import OrderedDict

import numpy as np

from . import constants as C
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
MERGE_TEXT_BELOW = 1 << 16  # trailing text parts shorter than this are joined (few, large parts)


def _merge_parts(parts: list, size, join, small: int) -> tuple:
    """Keep a rope shallow: join the last two parts while the older one is not much larger (a
    binary counter, so every element is copied O(log n) times over a session's life) or both are
    small."""
    parts = [p for p in parts if size(p)]
    while len(parts) >= 2 and (size(parts[-2]) <= 2 * size(parts[-1]) or size(parts[-2]) + size(parts[-1]) <= small):
        parts[-2:] = [join(parts[-2:])]
    return tuple(parts)


def prefix_parts(parts: tuple[np.ndarray, ...], k: int) -> tuple[np.ndarray, ...]:
    """The parts holding the first ``k`` elements of a rope, the last one a zero-copy slice."""
    out, left = [], k
    for p in parts:
        if left <= 0:
            break
        out.append(p if len(p) <= left else p[:left])
        left -= len(p)
    return tuple(out)


def suffix_parts(parts: tuple, start: int) -> list:
    """The parts holding elements ``start:`` of a rope, the first one a slice."""
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


def merge_text_parts(parts) -> tuple[str, ...]:
    return _merge_parts(list(parts), len, "".join, MERGE_TEXT_BELOW)


def merge_id_parts(parts) -> tuple[np.ndarray, ...]:
    return _merge_parts(list(parts), len, lambda ps: np.concatenate(ps).astype(np.int32, copy=False), 4096)


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

    __slots__ = ("text_parts", "id_parts", "cp_pos", "cp_tok", "cp_ext", "version", "n_chars", "n_ids",
                 "_text", "_ids")

    def __init__(self, text: str | None, ids: np.ndarray | None, cp_pos: np.ndarray, cp_tok: np.ndarray,
                 cp_ext: np.ndarray, version: int | None = None, *, text_parts: tuple[str, ...] | None = None,
                 id_parts: tuple[np.ndarray, ...] | None = None):
        set_ = object.__setattr__  # a turn builds one state: skip the immutability guard here
        text_parts = tuple(text_parts) if text_parts is not None else ((text,) if text else ())
        if id_parts is not None:
            id_parts = tuple(id_parts)
        else:
            id_parts = (np.asarray(ids, dtype=np.int32),) if ids is not None and len(ids) else ()
        set_(self, "text_parts", text_parts)
        set_(self, "id_parts", id_parts)
        set_(self, "cp_pos", cp_pos)
        set_(self, "cp_tok", cp_tok)
        set_(self, "cp_ext", cp_ext)
        set_(self, "version", new_version() if version is None else version)
        set_(self, "n_chars", sum(map(len, text_parts)))
        set_(self, "n_ids", sum(map(len, id_parts)))
        set_(self, "_text", text if text is not None and text_parts is None else None)
        set_(self, "_ids", None)

    def __setattr__(self, name, value):
        if name in ("_text", "_ids") or not hasattr(self, "_ids"):
            object.__setattr__(self, name, value)
        else:
            raise AttributeError("SessionState is immutable")

    def __getstate__(self):
        return (self.text_parts, self.id_parts, self.cp_pos, self.cp_tok, self.cp_ext, self.version)

    def __setstate__(self, st):
        text_parts, id_parts, cp_pos, cp_tok, cp_ext, version = st
        SessionState.__init__(self, None, None, cp_pos, cp_tok, cp_ext, version,
                              text_parts=text_parts, id_parts=id_parts)

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
        return prefix_parts(self.id_parts, k)

    def ids_from(self, k: int) -> np.ndarray:
        """``ids[k:]`` as one array, touching only the parts after ``k``."""
        out = suffix_parts(self.id_parts, k)
        if not out:
            return _I32_EMPTY
        return out[0] if len(out) == 1 else np.concatenate(out).astype(np.int32, copy=False)

    def text_from(self, start: int) -> str:
        """``text[start:]``, touching only the parts after ``start``."""
        out = suffix_parts(self.text_parts, start)
        return out[0] if len(out) == 1 else "".join(out)

    def prefix_of(self, text: str) -> bool:
        """Whether this state's text is a prefix of ``text`` (memcmp per part, no copies)."""
        return rope_is_prefix(self.text_parts, self.n_chars, text)

    @property
    def nbytes(self) -> int:
        seen, total = set(), 0
        for p in self.id_parts:  # a slice keeps its whole base buffer alive: count each base once
            base = p.base if isinstance(p.base, np.ndarray) else p
            if id(base) not in seen:
                seen.add(id(base))
                total += base.nbytes
        return sum(map(sys.getsizeof, self.text_parts)) + total + 3 * 8 * len(self.cp_pos)

    def __repr__(self) -> str:
        return f"SessionState({self.n_chars} chars, {self.n_ids} ids, {len(self.cp_pos)} checkpoints, v{self.version})"


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
