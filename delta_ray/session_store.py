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
from dataclasses import dataclass, field

import numpy as np

from . import constants as C


class SessionNotFound(KeyError):
    """``extend`` on a session the store does not hold (never created, or evicted)."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else "session not found"


_VERSIONS = itertools.count(int.from_bytes(os.urandom(6), "little") << 16)


def new_version() -> int:
    """A process-unique, randomly based state version (lets a client splice IDs it already holds)."""
    return next(_VERSIONS)


@dataclass(frozen=True)
class SessionState:
    """What a session keeps: its text, its IDs (no post-processing) and checkpoints.

    A checkpoint (pos, tok, ext) says: pos is a safe cut of ``text`` decided from ``text[:ext]``
    alone, and the IDs of ``text[:pos]`` are ``ids[:tok]``. It therefore holds for every text that
    shares at least ``ext`` leading characters with ``text``.
    """

    text: str
    ids: np.ndarray
    cp_pos: np.ndarray
    cp_tok: np.ndarray
    cp_ext: np.ndarray
    version: int = field(default_factory=new_version)

    @property
    def nbytes(self) -> int:
        return sys.getsizeof(self.text) + self.ids.nbytes + 3 * 8 * len(self.cp_pos)



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
