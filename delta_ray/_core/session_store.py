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
from typing import Any, Callable, Iterable, Sequence, cast

import numpy as np
from numpy.typing import NDArray

from delta_ray._core import constants as C

from .assembly import to_arrow
from .errors import DeltaRayError
from .keys import keyless_head
from .rope import MERGE_IDS_BELOW, CheckpointLog, merge_start, prefix_parts, rope_is_prefix, suffix_parts


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

# What the compact turn keeps of a state (:meth:`SessionState.turn_head`): Arrow chunks holding the IDs
# up to its last checkpoint, their lengths, whether they show every buffer of the state's IDs, the
# window's start w0 and the text from w0 on.
TurnHead = tuple[tuple[Any, ...], tuple[int, ...], bool, int, str]
CheckpointColumns = tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]
# A turn's kept list (SessionStore.install): (new state, IDs kept of the old one, the engine's buffer
# of the IDs after them or None) -> (the list of the new state's IDs, its bytes)
KeepList = Callable[["SessionState", int, "bytes | None"], tuple[list[int], int]]

_CACHES = frozenset({"_text", "_ids", "_cp", "_arrow", "_arrow_from", "_nbytes", "_bytes", "_id_parts", "_head"})


def buffer_owner(a: np.ndarray) -> object:
    """The object whose memory a view ``a`` shows (numpy points every view at the owner)."""
    return a.base if a.base is not None else a


def _is_prefix_view(p: np.ndarray, old: np.ndarray) -> bool:
    """Whether ``p`` shows exactly ``old[:len(p)]``: a shorter view of the same memory, starting at
    the same address with the same layout (a turn's view of a kept part, :func:`prefix_parts`)."""
    return (p.base is not None and p.base is buffer_owner(old) and len(p) < len(old) and p.dtype == old.dtype
            and p.strides == old.strides
            and p.__array_interface__["data"][0] == old.__array_interface__["data"][0])


def arrow_parts(parts: Iterable[np.ndarray], old_parts: Sequence[np.ndarray] = (),
                old_chunks: Sequence[Any] = ()) -> tuple[Any, ...]:
    """``parts`` (int32 numpy arrays) as zero-copy pyarrow arrays, reusing ``old_chunks`` (the
    arrays of ``old_parts``, index for index): a part that is the old part at its index keeps its
    array, one that shows a prefix of it gets the array's zero-copy slice, any other is wrapped.
    The merge policy only joins a suffix of a rope, so a kept part stays at its index."""
    m = min(len(old_parts), len(old_chunks))
    out = []
    for i, p in enumerate(parts):
        if i < m and old_parts[i] is p:
            out.append(old_chunks[i])
        elif i < m and _is_prefix_view(p, old_parts[i]):
            out.append(old_chunks[i].slice(0, len(p)))
        else:
            out.append(_to_arrow(p))
    return tuple(out)


def splice_arrow(parts: tuple[np.ndarray, ...], chunks: tuple[Any, ...], k: int,
                 tail: np.ndarray) -> tuple[tuple[np.ndarray, ...], tuple[Any, ...]]:
    """The rope ``parts[:k] + tail`` and its Arrow chunks, in one walk from the rope's end: the same
    parts as ``merge_id_parts(prefix_parts(parts, k) + (tail,))`` and the same chunks as
    :func:`arrow_parts` gives them (a kept part keeps its array, the cut one gets the zero-copy slice
    of its array, a new or joined part is wrapped), without testing every part for reuse: the walk
    knows which part it cut. ``chunks`` not the parts' own (index for index) are not reused; empty
    parts are dropped, as the merge rule drops them. ``ValueError`` where ``k`` exceeds the rope (an
    answer about IDs the caller does not hold). A pool's splice of a worker's answer."""
    sizes = list(map(len, parts))
    total = sum(sizes)
    if k > total:
        raise ValueError(f"an answer keeps {k} IDs of a rope of {total}")
    if len(chunks) != len(parts):
        chunks = arrow_parts(parts)
    if 0 in sizes:
        parts, chunks = (tuple(x for x, size in zip(xs, sizes) if size) for xs in (parts, chunks))
        sizes = [size for size in sizes if size]
    i, end = len(parts), total
    while i and end - sizes[i - 1] >= k:  # the parts wholly after the kept prefix
        end -= sizes[i - 1]
        i -= 1
    kept, kept_chunks = parts[:i], chunks[:i]
    if i and end > k:  # the last kept part is cut: its array's slice, no new wrap
        r = k - (end - sizes[i - 1])
        kept, kept_chunks = parts[:i - 1] + (parts[i - 1][:r],), chunks[:i - 1] + (chunks[i - 1].slice(0, r),)
        sizes[i - 1] = r
    sizes = sizes[:i]
    if len(tail):
        kept, kept_chunks = kept + (tail,), kept_chunks + (None,)
        sizes.append(len(tail))
    j = merge_start(sizes, MERGE_IDS_BELOW)
    if j < len(kept) - 1:
        joined = np.concatenate(kept[j:]).astype(np.int32, copy=False)
        kept, kept_chunks = kept[:j] + (joined,), kept_chunks[:j] + (None,)
    if kept_chunks and kept_chunks[-1] is None:
        kept_chunks = kept_chunks[:-1] + (_to_arrow(kept[-1]),)
    return kept, kept_chunks


def _to_arrow(ids: np.ndarray) -> Any:
    # assembly imports this module's neighbours: imported on first use, then bound here (an import
    # statement per call walked importlib's machinery on every turn)
    global _to_arrow
    _to_arrow = to_arrow
    return to_arrow(ids)


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

    __slots__ = ("text_parts", "_id_parts", "_head", "version", "n_chars", "n_ids", "last_checkpoint", "n_checkpoints",
                 "_text", "_ids", "_cp_log", "_cp_start", "_cp", "_arrow", "_arrow_from", "_nbytes", "_bytes")
    text_parts: tuple[str, ...]
    _id_parts: tuple[np.ndarray, ...] | None  # None: a compact turn's state, views of _arrow made on first use
    _head: TurnHead | None
    version: int
    n_chars: int
    n_ids: int
    last_checkpoint: tuple[int, ...] | None  # (pos, tok, ext)
    n_checkpoints: int
    _text: str | None
    _ids: np.ndarray | None
    _cp_log: CheckpointLog | None
    _cp_start: int
    _cp: CheckpointColumns | None  # None: columns of _cp_log, built on first use
    _arrow: tuple[Any, ...] | None
    _arrow_from: tuple[tuple[np.ndarray, ...], tuple[Any, ...]] | None
    _nbytes: int | None
    _bytes: tuple[int | None, int | None]

    def __init__(self, text: str | None, ids: np.ndarray | None, cp_pos: np.ndarray | None,
                 cp_tok: np.ndarray | None, cp_ext: np.ndarray | None, version: int | None = None, *,
                 text_parts: tuple[str, ...] | None = None, id_parts: tuple[np.ndarray, ...] | None = None,
                 checkpoints: tuple[CheckpointLog, int, int] | None = None, n_chars: int | None = None,
                 n_ids: int | None = None, arrow_from: tuple[tuple[np.ndarray, ...], tuple[Any, ...]] | None = None,
                 part_bytes: tuple[int | None, int | None] = (None, None), last: tuple[int, ...] | None = None):
        set_ = object.__setattr__  # a turn builds one state: skip the immutability guard here
        text_parts = tuple(text_parts) if text_parts is not None else ((text,) if text else ())
        if id_parts is not None:
            id_parts = tuple(id_parts)
        else:
            id_parts = (np.asarray(ids, dtype=np.int32),) if ids is not None and len(ids) else ()
        set_(self, "text_parts", text_parts)
        set_(self, "_id_parts", id_parts)
        set_(self, "_head", None)
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

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _CACHES or not hasattr(self, "_nbytes"):
            object.__setattr__(self, name, value)
        else:
            raise AttributeError("SessionState is immutable")

    def _checkpoint_columns(self) -> CheckpointColumns:
        cp = self._cp
        if cp is None:
            a = self._cp_start
            log = cast(CheckpointLog, self._cp_log)  # a state without columns has a log (__init__, compact)
            flat = np.frombuffer(log.data[3 * a:3 * (a + self.n_checkpoints)], dtype=np.int64)
            rows = flat.reshape(-1, 3)
            cp = self._cp = (rows[:, 0], rows[:, 1], rows[:, 2])
        return cp

    @property
    def cp_pos(self) -> NDArray[np.int64]:
        """Checkpoint positions (int64, strictly increasing)."""
        return self._checkpoint_columns()[0]

    @property
    def cp_tok(self) -> NDArray[np.int64]:
        """Checkpoint token indices (``ids[:tok]`` are the IDs of ``text[:pos]``)."""
        return self._checkpoint_columns()[1]

    @property
    def cp_ext(self) -> NDArray[np.int64]:
        """Checkpoint evidence ends (strictly increasing: the checkpoints are chained)."""
        return self._checkpoint_columns()[2]

    def arrow_chunks(self) -> tuple[Any, ...]:
        """The ID parts as zero-copy pyarrow arrays, built once per part: a part this state shares
        with the state it was made from reuses that state's array (:func:`arrow_parts`), so a turn
        wraps only its new parts, not the whole rope."""
        chunks = self._arrow
        if chunks is None:
            chunks = self._arrow = arrow_parts(self.id_parts, *(self._arrow_from or ((), ())))
            self._arrow_from = None
        return chunks

    def arrow_source(self) -> tuple[tuple[np.ndarray, ...], tuple[Any, ...]] | None:
        """What a state made from this one passes as ``arrow_from`` (None before any Arrow output)."""
        return (self.id_parts, self._arrow) if self._arrow is not None else None

    @property
    def id_parts(self) -> tuple[np.ndarray, ...]:
        """The ID rope as int32 numpy arrays. A state made by the compact turn holds Arrow chunks
        only; their numpy views are made here on first use (never on the turn's path)."""
        parts = self._id_parts
        if parts is None:
            parts = self._id_parts = arrow_views(self._arrow)
        return parts

    @classmethod
    def compact(cls, text_parts: tuple[str, ...], n_chars: int, n_ids: int,
                checkpoints: tuple[CheckpointLog, int, int], last: tuple[int, ...], chunks: tuple[Any, ...],
                head: TurnHead, part_bytes: tuple[int | None, int | None]) -> "SessionState":
        """A state from the compact turn (:mod:`delta_ray._core.turn_path`): its IDs are the Arrow
        ``chunks`` (numpy views on demand), ``head`` is (chunks, lengths, exact) of ``ids[:tok]``
        of its last checkpoint; every other field as :meth:`__init__` sets it, without its checks."""
        # Built as a _Fresh (the same slots, plain attribute stores: a turn's stores compile to
        # direct slot writes instead of 17 generic setattr lookups), then made a SessionState,
        # immutable from here on like any other.
        self: SessionState = _Fresh.__new__(_Fresh)
        log, a, b = checkpoints
        self.text_parts = text_parts
        self._id_parts = None
        self._head = head
        self.version = next(_VERSIONS)
        self.n_chars = n_chars
        self.n_ids = n_ids
        self.last_checkpoint = last
        self.n_checkpoints = b - a
        self._text = self._ids = self._cp = self._arrow_from = self._nbytes = None
        self._cp_log = log
        self._cp_start = a
        self._arrow = chunks
        self._bytes = part_bytes
        self.__class__ = cls
        return self

    @property
    def checkpoint_log(self) -> tuple[CheckpointLog | None, int, int]:
        """(log, start, end): this state's checkpoints are the log's entries ``[start:end]`` (log
        None: a state built from checkpoint columns, not a log)."""
        return self._cp_log, self._cp_start, self._cp_start + self.n_checkpoints

    def turn_head(self, back: int) -> TurnHead:
        """What the compact turn keeps of this state, made once and cached: (Arrow chunks holding
        ``ids[:tok]`` of the last checkpoint, their lengths, exact, w0, ``text[w0:]``) with ``w0``
        ``back`` characters before that checkpoint (the predicate's reach). ``exact``: the chunks
        show every buffer the state's IDs do (a state the compact turn made); a state the general
        turn made may show fewer, so a state kept from them has its bytes recounted."""
        head = self._head
        if head is None:
            kept, lens, exact = self.head_chunks()
            last = cast("tuple[int, ...]", self.last_checkpoint)  # the compact turn runs from a checkpoint
            w0 = max(0, last[0] - back)
            head = self._head = (kept, lens, exact, w0, "".join(suffix_parts(self.text_parts, w0, self.n_chars)))
        return head

    def head_chunks(self) -> tuple[tuple[Any, ...], tuple[int, ...], bool]:
        """(Arrow chunks, their lengths, False) holding ``ids[:tok]`` of the last checkpoint (the
        compact turn's kept IDs, for a state the general turn made). False: they may show fewer
        buffers than the state's IDs do (the byte count of a state kept from them is recounted)."""
        left = self.last_checkpoint[1] if self.last_checkpoint is not None else 0
        out: list[Any] = []
        lens: list[int] = []
        for c in self.arrow_chunks():
            if left <= 0:
                break
            m = len(c)
            if m:
                out.append(c if m <= left else c.slice(0, left))
                lens.append(min(m, left))
                left -= m
        return tuple(out), tuple(lens), False

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

    def prefix_of(self, text: str) -> bool:
        """Whether this state's text is a prefix of ``text`` (memcmp per part, no copies)."""
        return rope_is_prefix(self.text_parts, self.n_chars, text)

    @property
    def nbytes(self) -> int:
        """Memory this state keeps alive: its text parts, every buffer its ID parts show (a slice
        keeps its whole buffer alive: each counted once), and its checkpoints."""
        if self._nbytes is None:
            head = self._head  # a compact turn's window text, if any (turn_path)
            self._nbytes = (self.text_bytes + self.id_bytes + 3 * 8 * self.n_checkpoints
                            + (sys.getsizeof(head[4]) if head is not None else 0))
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
        return (f"SessionState({self.n_chars} chars, {self.n_ids} ids, {self.n_checkpoints} checkpoints, "
                f"v{self.version})")


class _Fresh(SessionState):
    """A SessionState under construction (:meth:`SessionState.compact`): same layout, no guard."""

    __slots__ = ()
    # mypy reads object.__setattr__ taken from the class as a bound method; it is the unbound slot
    # wrapper, the same signature as SessionState.__setattr__ (mypy's limitation, not this code's)
    __setattr__ = object.__setattr__  # type: ignore[assignment]


def arrow_views(chunks: Iterable[Any] | None) -> tuple[np.ndarray, ...]:
    """Zero-copy int32 numpy views of Arrow chunks; chunks over one buffer are views of one array
    (so :func:`owners_bytes` counts that buffer once)."""
    whole: dict[int, np.ndarray] = {}
    out: list[np.ndarray] = []
    for c in chunks or ():  # one view per chunk, empty ones included: arrow_chunks pairs them by index
        buf = c.buffers()[1]
        if buf is None:
            out.append(_I32_EMPTY)
            continue
        arr = whole.get(buf.address)
        if arr is None:
            arr = whole[buf.address] = np.frombuffer(buf, dtype=np.int32)
        out.append(arr[c.offset:c.offset + len(c)])
    return tuple(out)


def _buffer_bytes(owner: object) -> int:
    return owner.nbytes if isinstance(owner, (np.ndarray, memoryview)) else sys.getsizeof(owner)


def owners_bytes(parts: Iterable[np.ndarray]) -> int:
    """Bytes of the distinct buffers the arrays ``parts`` show (an engine's bytes object, an
    array): a view keeps its whole buffer alive, so that is what it costs."""
    seen: set[int] = set()
    total = 0
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
    """The one owner of a process's session state: a thread-safe LRU map from key to state, bounded
    by bytes (keys included) and count, with each key's lock, its keyless candidates and an optional
    kept list.

    A single state larger than ``max_state_bytes`` (default a quarter of ``max_bytes``) is not
    stored: its request is still served, and it evicts nothing, so one huge session cannot flush
    every other one.

    - **Locks:** :meth:`lock_for` is the key's lock; a turn's read-encode-install runs under it, so
      two threads on one key serialize and never lose an update.
    - **Keyless candidates:** a keyless conversation's key (:func:`~delta_ray._core.keys.keyless_key`)
      names the head it was found under; :meth:`candidates` lists a head's held conversations,
      most recent first, at most ``max_candidates`` (the oldest goes).
    - **Kept lists:** :meth:`attach` keeps a Python list of a state's IDs beside it (the drop-in's
      O(change) list), counted in the entry's bytes and forgotten with the state it belongs to: any
      new state under the key, an eviction or a purge. :meth:`attach_offsets` keeps the character
      offsets of those IDs the same way (a caller that asked for offsets).
    """

    def __init__(self, max_bytes: int = C.MAX_SESSION_BYTES, max_sessions: int = C.MAX_SESSIONS,
                 max_state_bytes: int | None = None, max_candidates: int = C.KEYLESS_CANDIDATES):
        if max_bytes < 1 or max_sessions < 1 or max_candidates < 1:
            raise ValueError("session store bounds must be positive")
        self.max_bytes = max_bytes
        self.max_sessions = max_sessions
        self.max_state_bytes = max_state_bytes if max_state_bytes is not None else max(1, max_bytes // 4)
        self.max_candidates = max_candidates
        self._data: OrderedDict[str, SessionState] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._kept: dict[str, tuple[int, list[int], int]] = {}  # key -> (state version, list, its bytes)
        self._offsets: dict[str, tuple[int, np.ndarray]] = {}  # key -> (state version, (n, 2) offsets)
        self._heads: dict[str, list[str]] = {}  # keyless head -> its held conversations, most recent first
        self._bytes = 0
        self._lock = threading.Lock()  # the table: entries, sizes, kept lists and offsets, heads
        self._key_locks = [threading.Lock() for _ in range(C.SESSION_LOCK_STRIPES)]
        self.evictions = 0
        self.refused = 0

    def lock_for(self, key: str) -> threading.Lock:
        """The lock a turn of ``key`` runs under (striped: str hashes are cached and stable in a process)."""
        return self._key_locks[hash(key) % len(self._key_locks)]

    def get(self, key: str) -> SessionState | None:
        """The state of a session (marking it recently used), or None."""
        with self._lock:
            st = self._data.get(key)
            if st is not None:
                self._data.move_to_end(key)
            return st

    def peek(self, key: str) -> SessionState | None:
        """The state of a session without marking it used (one dict read, atomic under the GIL):
        for a caller that installs a new state for it next or marks it with :meth:`get`."""
        return self._data.get(key)

    def put(self, key: str, state: SessionState, size: int | None = None,
            kept: tuple[list[int], int] | None = None) -> bool:
        """Install a new state, evicting least recently used sessions beyond the bounds; ``size``:
        its :func:`entry_bytes` when the caller knows them (a compact turn); ``kept``: a list of its
        IDs and that list's bytes, kept beside it (:meth:`attach`), else the key's old list goes.

        Returns False (and forgets the key's old state, which the caller has moved past) when the
        state alone is over ``max_state_bytes``.
        """
        if size is None:
            size = entry_bytes(key, state)
        if kept is not None:
            size += kept[1]
        with self._lock:
            self._pop_locked(key)
            if size > self.max_state_bytes or size > self.max_bytes:
                self.refused += 1
                return False
            self._data[key] = state
            self._sizes[key] = size
            self._bytes += size
            if kept is not None:
                self._kept[key] = (state.version, kept[0], kept[1])
            head = keyless_head(key)
            if head is not None:  # a keyless conversation: its head's most recent
                self._list_locked(key, head)
            self._evict_locked()
            return True

    def attach(self, key: str, version: int, kept: list[int], nbytes: int) -> bool:
        """Keep ``kept`` (a list of the IDs of state ``version``, counted at ``nbytes``) beside that
        state while it is the key's; False (nothing kept) if the key holds another state now, or if
        the entry would then be over ``max_state_bytes`` (the entry goes, as :meth:`put` refuses)."""
        with self._lock:
            state = self._data.get(key)
            if state is None or state.version != version:
                return False
            old = self._kept.pop(key, None)
            if old is not None:
                self._sizes[key] -= old[2]
                self._bytes -= old[2]
            if self._sizes[key] + nbytes > self.max_state_bytes:
                self._pop_locked(key)
                self.refused += 1
                return False
            self._kept[key] = (version, kept, nbytes)
            self._sizes[key] += nbytes
            self._bytes += nbytes
            self._evict_locked()
            return key in self._data

    def kept(self, key: str, version: int) -> list[int] | None:
        """The list kept beside state ``version`` of ``key`` (None: none, or another state's)."""
        entry = self._kept.get(key)
        return entry[1] if entry is not None and entry[0] == version else None

    def attach_offsets(self, key: str, version: int, offsets: np.ndarray) -> bool:
        """Keep ``offsets`` (an (n, 2) array: the character offsets of state ``version``'s IDs)
        beside that state while it is the key's, counted in the entry's bytes; False (nothing kept)
        if the key holds another state now, or if the entry would then be over ``max_state_bytes``
        (the state and its list stay)."""
        nbytes = offsets.nbytes
        with self._lock:
            state = self._data.get(key)
            if state is None or state.version != version:
                return False
            old = self._offsets.pop(key, None)
            if old is not None:
                self._sizes[key] -= old[1].nbytes
                self._bytes -= old[1].nbytes
            if self._sizes[key] + nbytes > self.max_state_bytes:
                return False
            self._offsets[key] = (version, offsets)
            self._sizes[key] += nbytes
            self._bytes += nbytes
            self._evict_locked()
            return key in self._data

    def kept_offsets(self, key: str, version: int) -> np.ndarray | None:
        """The offsets kept beside state ``version`` of ``key`` (None: none, or another state's)."""
        entry = self._offsets.get(key)
        return entry[1] if entry is not None and entry[0] == version else None

    def candidates(self, head: str) -> list[tuple[str, SessionState]]:
        """The held keyless conversations found under ``head``, most recent first. Read without the
        table's lock, as :meth:`peek` (a list's copy and each dict read are atomic under the GIL): a
        conversation evicted meanwhile is left out, and a choice only names a session, whose turn
        reads its state again under the key's lock."""
        keys = list(self._heads.get(head, ()))
        data = self._data
        return [(key, st) for key in keys if (st := data.get(key)) is not None]

    def install(self, key: str, state: SessionState, current: bool, size: int | None = None,
                keep: KeepList | None = None, reused: int = 0, tail: bytes | None = None) -> None:
        """A turn's new state: stored if it is ``current`` (the engine that made it is still the one
        in use: the generation it read is unchanged), else the key's old state is forgotten too,
        since it may be the switched-away engine's. ``keep``: the turn's caller keeps a list of
        the IDs, made from the new state, the ``reused`` IDs it kept of the old one and the
        engine's ``tail`` buffer (None: read from the state), and stored with it in one step."""
        if current:
            self.put(key, state, size, keep(state, reused, tail) if keep is not None else None)
        else:
            self.pop(key)

    def _list_locked(self, key: str, head: str) -> None:
        keys = self._heads.setdefault(head, [])
        keys.insert(0, key)
        while len(keys) > self.max_candidates:  # the head's oldest conversation goes
            self._pop_locked(keys[-1])
            self.evictions += 1

    def _evict_locked(self) -> None:
        while self._data and (self._bytes > self.max_bytes or len(self._data) > self.max_sessions):
            self._pop_locked(next(iter(self._data)))
            self.evictions += 1

    def _pop_locked(self, key: str) -> None:
        """Remove ``key``'s entry: its state, its kept list and offsets, its listing under its head."""
        if self._data.pop(key, None) is None:
            return
        self._bytes -= self._sizes.pop(key)
        self._kept.pop(key, None)
        self._offsets.pop(key, None)
        head = keyless_head(key) if self._heads else None
        keys = self._heads.get(head) if head is not None else None
        if keys is not None and key in keys:
            keys.remove(key)
            if not keys:
                del self._heads[cast(str, head)]

    def pop(self, key: str) -> SessionState | None:
        """Remove a session (a client that ends its conversation)."""
        with self._lock:
            st = self._data.get(key)
            self._pop_locked(key)
            return st

    def clear(self) -> int:
        """Forget every session (the engine that produced them was found wrong); returns how many."""
        with self._lock:
            n = len(self._data)
            self._data.clear()
            self._sizes.clear()
            self._kept.clear()
            self._offsets.clear()
            self._heads.clear()
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

    def kept_lists(self) -> list[list[int]]:
        """The lists kept now (to measure and inspect them: a caller that mutates one corrupts
        its session's next answer)."""
        with self._lock:
            return [ids for _, ids, _ in self._kept.values()]

    @property
    def kept_ids(self) -> int:
        """How many IDs the kept lists hold (a metric: what a full collection would walk if tracked)."""
        return sum(map(len, self.kept_lists()))
