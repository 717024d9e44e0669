"""Confinement: a guarded code point sends only a small window around it to the reference.

The fast tier's guard refuses whole pieces: without this, one U+017F in a 1.5M-character chunk
sent the whole chunk to the reference (about a second instead of 8 ms). :func:`confine` is the one
function the engine (:class:`delta_ray._engine.engine.Engine`) cuts guarded windows with: a piece
the guard refuses is cut at safe cuts of that piece about ``window`` characters before and after
each guarded code point, so the fast engine encodes everything but those windows. Cuts of a piece
are decided on the piece alone and chained like the planner's (each one's evidence starts at or
after the previous cut, and the previous cut's evidence ends at or before it), so the sub-pieces'
IDs concatenate to the piece's (docs/proof.md §4); the piece lies between safe cuts of its text,
so nothing outside it changes.
"""
from __future__ import annotations

import bisect

import numpy as np

from .cut_predicate import CutPredicate
from .encoder import Guard
from .plan import split_at

WINDOW = 2048  # characters kept on each side of a guarded code point
MIN_PIECE = 4 * WINDOW  # shorter pieces go to the reference whole


def confine(piece: str, guard: Guard, predicate: CutPredicate, window: int = WINDOW) -> list[str]:
    """Safe sub-pieces of ``piece`` isolating its guarded code points (``[piece]`` if none, or if
    the piece is too short to be worth cutting).

    Guarded code points less than two windows apart form one cluster (their windows would
    overlap). A cluster gets the last safe cut at most ``window`` characters before its first
    code point, and the first window-long block after its last one that holds a safe cut gives
    its right cut (block after block, up to the next cluster). The cost is linear in the piece:
    numpy finds the clusters, and each position is tested at most once (:class:`_Scanned`), so
    a run with no safe cut costs one pass and then goes to the reference whole."""
    if len(piece) < MIN_PIECE or guard.allows(piece):
        return [piece]
    w, n = window, len(piece)
    pos = guard.positions(piece)
    gaps = np.flatnonzero(np.diff(pos) > 2 * w)
    firsts = pos[np.r_[0, gaps + 1]].tolist()
    lasts = pos[np.r_[gaps, len(pos) - 1]].tolist()
    scans = _Scanned(predicate, piece)
    cuts: list[int] = []
    prev, prev_ext = 0, 0
    for i, (first, last) in enumerate(zip(firsts, lasts)):
        if cuts and last < cuts[-1]:
            continue  # inside the window already cut out
        if not cuts or first >= cuts[-1]:
            stop = max(prev_ext, first - w, 1)
            found = scans.back(first, stop, prev) if first >= stop else None
            if found is not None:
                cuts.append(found[0])
                prev, prev_ext = found[0], found[2]
        end = firsts[i + 1] if i + 1 < len(firsts) else n  # the next cluster's first code point
        lo = max(prev_ext, last + 1)
        while lo < end:
            found = scans.back(min(end - 1, lo + w - 1), lo, prev)
            if found is not None:
                cuts.append(found[0])
                prev, prev_ext = found[0], found[2]
                break
            lo += w
    if not cuts:
        return [piece]
    return split_at(piece, cuts, predicate.piece_skip)


class _Scanned:
    """Backward scans for safe cuts over one text that never test a position twice.

    A position a scan tested without finding a cut (not safe, or its evidence starting before the
    scan's ``min_lo``) stays without one for every later scan of the same split: ``min_lo`` (the
    last cut made) only grows. The tested ranges are kept as sorted disjoint intervals, merged as
    they touch, and a scan jumps over them."""

    def __init__(self, predicate: CutPredicate, text: str):
        self._pred = predicate
        self._text = text
        self._lo: list[int] = []  # interval starts, ascending
        self._hi: list[int] = []  # interval ends (inclusive)

    def back(self, start: int, stop: int, min_lo: int) -> tuple[int, int, int] | None:
        """:meth:`CutPredicate.scan_back` over [stop, start], skipping tested positions."""
        b = start
        while b >= stop:
            i = bisect.bisect_right(self._lo, b) - 1
            if i >= 0 and self._hi[i] >= b:  # b was tested: jump below its interval
                b = self._lo[i] - 1
                continue
            floor = stop if i < 0 else max(stop, self._hi[i] + 1)  # untested down to here
            found = self._pred.scan_back(self._text, b, floor, min_lo=min_lo)
            if found is not None:
                self._add(found[0] + 1, b)
                return found
            self._add(floor, b)
            b = floor - 1
        return None

    def _add(self, lo: int, hi: int) -> None:
        if hi < lo:
            return
        los, his = self._lo, self._hi
        i = bisect.bisect_left(his, lo - 1)  # first interval that ends at or after lo - 1
        j = bisect.bisect_right(los, hi + 1)  # intervals before j start at or before hi + 1
        if i < j:  # touching or overlapping: merge them all with [lo, hi]
            lo, hi = min(lo, los[i]), max(hi, his[j - 1])
        los[i:j] = [lo]
        his[i:j] = [hi]
