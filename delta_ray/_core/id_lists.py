"""int32 IDs as the Python list transformers and the engines hand on, built from shared int objects.

``ndarray.tolist()`` allocates one int object per ID above CPython's small-int cache: at a
long text's 250K+ tokens that allocation is most of the conversion, and costs more than the
encode itself (the native engines' own list entry points avoid it by keeping their ints). Here one
process-wide table holds the int objects ``0 .. n-1`` (an object array), and a long array of IDs
becomes a list by one gather from it: the same values (``table[i] == i``), no allocation per ID
(ints are immutable: a caller that mutates its list replaces an element, never changes a shared
int). The table grows to the largest ID seen, in steps of :data:`_STEP`, up to :data:`MAX_SHARED`;
above it, for a short array (where the gather's fixed microsecond exceeds the allocation) and for a
non-int32 array, ``tolist``.

A list made here holds ints scattered over the table, in the order of the vocabulary, not of the
text: copying it touches them at random. A list kept and copied every turn (a drop-in session's
IDs) is made with ``tolist`` instead, whose ints lie in the list's order, and taken out of the cyclic
collector's sight (:func:`untrack_ints`).
"""
from __future__ import annotations

import gc
import platform
import sys
from typing import Callable, cast

import numpy as np

__all__ = ["MAX_SHARED", "int_list", "list_bytes", "untrack_ints"]

MAX_SHARED = 1 << 20  # the largest vocabulary whose ints are shared (about 40 MB of table at most)
_GATHER_MIN = 4096  # below: ``tolist`` is as fast as the gather
_STEP = 1 << 14
_table = np.zeros(0, dtype=object)
_I32 = np.dtype(np.int32)
_INT_BYTES = sys.getsizeof(1 << 20)  # a token ID above the small-int cache: its own int object


def list_bytes(ids: list[int]) -> int:
    """What a kept list of IDs holds: the list (its pointer array) and one int object per ID (the
    few IDs under 257 are shared singletons: counted anyway, an upper bound)."""
    return sys.getsizeof(ids) + _INT_BYTES * len(ids)


def _grown(needed: int) -> np.ndarray:
    """The table, grown to hold ``needed`` ints (threads that grow it at once build equal tables;
    whichever is kept, every reader's table maps ``i`` to ``i``)."""
    global _table
    table = _table
    if needed > len(table):
        size = -(-needed // _STEP) * _STEP
        table = np.empty(size, dtype=object)
        table[:] = range(size)
        _table = table
    return table


def int_list(ids: np.ndarray) -> list[int]:
    """``ids`` (a 1-D array of IDs) as a new Python list equal to ``ids.tolist()``: through the
    shared table where that is faster (a long int32 array), else ``tolist``."""
    if len(ids) < _GATHER_MIN or ids.dtype != _I32:
        return cast("list[int]", ids.tolist())
    index = ids.view(np.uint32)  # a negative ID (never an engine's) reads as >= 2**31: out of range
    try:
        return cast("list[int]", _table[index].tolist())  # the table maps i to the int i
    except IndexError:
        top = int(index.max())
        if top >= MAX_SHARED:
            return cast("list[int]", ids.tolist())
        return cast("list[int]", _grown(top + 1)[index].tolist())


def _untracker() -> Callable[[object], object] | None:
    """CPython's ``PyObject_GC_UnTrack`` through ``ctypes`` (None elsewhere: nothing to do there)."""
    if platform.python_implementation() != "CPython":
        return None
    try:
        import ctypes  # lazy: only CPython untracks, and only once per process
        fn = ctypes.pythonapi.PyObject_GC_UnTrack
    except (ImportError, AttributeError):  # a build without ctypes, or without the symbol exported
        return None
    fn.argtypes, fn.restype = [ctypes.py_object], None
    return fn


_UNTRACK = _untracker()


def untrack_ints(ids: list[int]) -> list[int]:
    """``ids`` itself, out of the cyclic garbage collector's sight: ``gc.is_tracked(ids)`` is False
    afterwards (on CPython; elsewhere it is returned as it is).

    A list is a tracked container, and every collection of its generation visits each of its
    pointers: a kept list's IDs cost every full collection time in proportion (docs/performance.md),
    paid by every thread of a serving process, for as long as the list is kept. The collector exists to find reference
    cycles, and a list whose items are all ints can never be on one: an int refers to nothing. So this is sound for a
    list that holds only ints and that its owner never makes hold anything else (the caller's promise: a
    drop-in session's kept list, built from an integer array's ``tolist``, later only cut with
    ``del`` and extended with more such ints). Untracking changes nothing else: the list is freed by
    reference counting as before (list dealloc untracks again, which is idempotent), a mutation
    does not track it again, and a copy (``list.copy``, ``+``) is a new tracked list, as a caller's
    list should be. ``PyObject_GC_UnTrack`` is itself idempotent; it is called with the GIL held
    (``ctypes.pythonapi``), in a fraction of a microsecond.
    """
    if _UNTRACK is not None and type(ids) is list and gc.is_tracked(ids):
        _UNTRACK(ids)
    return ids
