"""Keeping a process's long-lived objects out of Python's full garbage collections.

A full (generation 2) collection traces every container object the process holds, with the GIL
held, and with Ray and a tokenizer loaded that stalls every call the process serves for tens of
milliseconds. ``gc.freeze()`` moves the objects alive now (modules, the tokenizer, Ray's own) to a
permanent generation that collections skip; what is created later is collected as before, and
reference counting still frees frozen objects that are not in cycles.

The permanent generation is the whole process's: a host application (vLLM's ``freeze_gc_heap``, a
server's start-up) may freeze its own objects too, and ``gc.unfreeze()`` would thaw those as well.
So :func:`freeze_heap` thaws only what it froze itself: only while everything frozen in the
process was frozen by its own calls.
"""
from __future__ import annotations

import gc
import threading

__all__ = ["freeze_heap"]

_lock = threading.Lock()
_marker: list | None = None  # made just after freeze_heap's last freeze: anyone's later gc.freeze() freezes it too
_owned = False  # everything frozen at freeze_heap's last return was frozen by freeze_heap


def _frozen(obj) -> bool:
    """Whether ``obj`` (a tracked container) is in the permanent generation: collections, and so
    ``gc.get_objects()``, list only the three collected generations."""
    return not any(o is obj for o in gc.get_objects())


def freeze_heap() -> int:
    """Collect, then freeze every object alive now, so later full collections skip them; returns
    how many objects the process has frozen (its own and any other code's).

    For a process that has finished its set-up: delta-ray calls it in the processes it owns (pool
    workers, chunk-task processes, Serve replicas, the scale-out bench's caller); a process that calls
    a pool from its own code may call it once its set-up is done (vLLM freezes its engine's heap
    after start-up the same way).

    Calling it again: when everything frozen in the process was frozen by this function, it first
    unfreezes, so that what became garbage since (a closed pool, an evicted tokenizer) is collected
    and not kept frozen. When anything else froze objects (before its first call, or since its last
    one), it thaws nothing: it collects and freezes what is new, as ``gc.collect(); gc.freeze()``
    does, and frozen garbage in cycles stays until that code unfreezes.
    """
    global _marker, _owned
    with _lock:
        if gc.get_freeze_count() == 0:
            owned = True
        else:
            owned = _owned and _marker is not None and not _frozen(_marker)
        if owned:
            gc.unfreeze()
        gc.collect()
        gc.freeze()
        _marker = []
        _owned = owned
        return gc.get_freeze_count()
