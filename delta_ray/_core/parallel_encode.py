"""Consecutive pieces encoded as one flat buffer on several threads (the fast engine drops the GIL)."""
from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import numpy as np

from .encoder import Encoder
from .id_lists import int_list

MIN_PARALLEL_CHARS = 65536  # below this a second thread costs more than it saves
STRAGGLER_SLACK_S = 0.0002  # encode_list: added to a late helper's expected time before the caller takes over
LIST_PIECES_PER_THREAD = 2  # encode_list: pieces per thread (a piece's conversion overlaps the next one's encode)


def ids_list(encoder: Encoder, pieces: list[str]) -> list[int]:
    """The pieces' IDs, concatenated in order, as one Python list, in one engine call: the engine's own
    lists where the encoder has them for these pieces (``encode_lists``: the guarded fast engine's
    direct path, docs/dropin.md §14), else its flat int32 values converted."""
    lists = encoder.encode_lists(pieces)
    if lists is None:
        return int_list(encoder.encode_flat(pieces)[0])
    out = lists[0]
    for part in lists[1:]:
        out += part
    return out


def _groups(pieces: list[str], total: int, threads: int) -> list[list[str]]:
    """Consecutive pieces in at most ``threads`` contiguous groups of about equal length."""
    cum = np.cumsum([len(p) for p in pieces])
    cuts = np.searchsorted(cum, [total * i / threads for i in range(1, threads)])
    bounds = [0] + sorted(set(int(c) + 1 for c in cuts if 0 <= c < len(pieces) - 1)) + [len(pieces)]
    return [pieces[a:b] for a, b in zip(bounds, bounds[1:])]


class PieceThreads:
    """A lazily grown thread pool that encodes pieces in contiguous groups of about equal length.

    The groups' flat outputs are concatenated in order, so the values and offsets are exactly
    those of encoding the pieces one after another (the encoder's own ``encode_flat``).
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._size = 0
        self._lock = threading.Lock()

    def encode_flat(self, encoder: Encoder, pieces: list[str], threads: int,
                    parallel: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """int32 values and int64 offsets (len(pieces) + 1) of the pieces; on ``threads`` threads
        when ``parallel`` (an engine that releases the GIL) and the work is large enough."""
        total = sum(map(len, pieces))
        if not parallel or threads <= 1 or len(pieces) < 2 or total < MIN_PARALLEL_CHARS:
            return encoder.encode_flat(pieces)
        groups = _groups(pieces, total, threads)
        parts = list(self._executor(threads).map(lambda g: encoder.encode_flat(g), groups))
        values = np.concatenate([v for v, _ in parts]).astype(np.int32, copy=False)
        offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
        pos, base = 1, 0
        for v, o in parts:
            offsets[pos:pos + len(o) - 1] = o[1:] + base
            pos += len(o) - 1
            base += len(v)
        return values, offsets

    def encode_list(self, encoder: Encoder, pieces: list[str], threads: int, parallel: bool = True) -> list[int]:
        """The pieces' IDs, concatenated in order, as one Python list (what transformers returns).

        The same engine on the same pieces as :meth:`encode_flat`; only the container differs. The
        pieces are shared out as they are taken: the calling thread and ``threads - 1`` helpers
        each take the next piece not yet taken, encode it (native, GIL released) and convert it
        to a list on the spot (under the GIL), so one piece's conversion overlaps another's encode.
        On a loaded machine a helper may be descheduled while it holds a piece: once the calling
        thread has no piece left, it waits for a helper's piece twice as long as that piece would
        take it (its own time per character), then encodes the piece itself (the same engine on
        the same piece gives the same IDs; whichever copy lands is used), so a late helper costs
        about one piece, not a time slice. The lists are joined in piece order.
        """
        total = sum(map(len, pieces))
        if not parallel or threads <= 1 or len(pieces) < 2 or total < MIN_PARALLEL_CHARS:
            return ids_list(encoder, pieces)
        n = len(pieces)
        results: list[list[int] | None] = [None] * n
        done = [threading.Event() for _ in range(n)]
        taken = itertools.count()  # next() on a count is atomic under the GIL: each index goes once

        def encode(i: int) -> list[int]:
            return ids_list(encoder, [pieces[i]])

        def work() -> int:
            chars = 0
            while (i := next(taken)) < n:
                try:
                    results[i] = encode(i)
                finally:
                    done[i].set()  # even on an error: the caller then encodes the piece, and raises, itself
                chars += len(pieces[i])
            return chars

        pool = self._executor(threads - 1)
        for _ in range(min(threads, n) - 1):
            pool.submit(work)
        t0 = time.perf_counter()
        mine = work()
        per_char = (time.perf_counter() - t0) / mine if mine else None
        for i in range(n):
            if results[i] is None:
                # a helper's piece: wait twice as long as it would take here, then encode it here
                wait = None if per_char is None else 2 * per_char * len(pieces[i]) + STRAGGLER_SLACK_S
                if not done[i].wait(wait) or results[i] is None:
                    results[i] = encode(i)
        filled = cast("list[list[int]]", results)  # every piece was encoded above
        out = filled[0]
        for part in filled[1:]:
            out += part
        return out

    def _executor(self, threads: int) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._size < threads:
                self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="delta-ray-encode")
                self._size = threads
            return self._pool
