"""How many chunks a long stateless text is cut into."""
from __future__ import annotations

import math
from typing import Optional


def chunk_count(
    n_chars: int,
    chunk_size: int,
    max_chunks: int,
    workers: int,
    cap_by_idle: bool = False,
    idle_workers: Optional[int] = None,
) -> int:
    """Return k = min(ceil(n_chars / chunk_size), max_chunks, workers), and never less than 1.

    With ``cap_by_idle`` k is further capped by ``idle_workers`` (still at least 1): when the pool
    is busy, extra chunks would only wait in the queue while each adds a repair seam, so fewer,
    larger chunks finish as soon. ``idle_workers`` is then required (see
    ``Dispatcher.idle_worker_count``).
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    if max_chunks < 1:
        raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
    k = min(math.ceil(n_chars / chunk_size), max_chunks, workers)
    if cap_by_idle:
        if idle_workers is None:
            raise ValueError("cap_by_idle=True needs idle_workers")
        k = min(k, idle_workers)
    return max(1, k)
