"""Keeping a process's long-lived objects out of Python's full garbage collections.

A full (generation 2) collection traces every container object the process holds, with the GIL
held. With Ray imported and initialized that is about 100K objects, and on this project's 2-core
VM each full collection took 60-125 ms (2026-12-03): in a pool's calling process every session
call and chunk waited that long at once (a worker's or a chunk process's would hold up the call it
runs). They come every few seconds to minutes, as allocations survive.
``gc.freeze()`` moves the objects alive now (modules, the tokenizer, Ray's own) to a permanent
generation that collections skip; what is created later is collected as before, and reference
counting still frees frozen objects that are not in cycles.
"""
from __future__ import annotations

import gc


def freeze_heap() -> int:
    """Collect, then freeze every object alive now, so later full collections skip them; returns
    how many are frozen.

    For a process that has finished its set-up: delta-ray calls it in the processes it owns (pool
    workers, chunk-task processes, Serve replicas, the scale-out bench's caller); a process that calls
    a pool from its own code may call it once its set-up is done (vLLM freezes its engine's heap
    after start-up the same way). Calling it again first unfreezes, so what became garbage since
    (a closed pool, an evicted tokenizer) is collected and not kept frozen.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
