"""The stateless planner: where to cut a long text so its chunks can be encoded in parallel."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from delta_ray._core import constants as C

from .cut_predicate import CutPredicate


@dataclass(frozen=True)
class PlannerConfig:
    """Chunking knobs; the defaults are the documented ones."""

    chunk_size: int = C.CHUNK_SIZE
    cut_threshold: int = C.CUT_THRESHOLD
    max_chunks: int = C.MAX_CHUNKS
    min_cut_text: int = C.MIN_CUT_TEXT
    scan_far: int = C.SCAN_FAR

    def __post_init__(self) -> None:
        for name in ("chunk_size", "cut_threshold", "max_chunks"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")


def chunk_count(n: int, cfg: PlannerConfig, workers: int) -> int:
    """k = min(ceil(N / chunk_size), max_chunks, workers); 1 below the thresholds."""
    if n < max(cfg.cut_threshold, cfg.min_cut_text):
        return 1
    return max(1, min(-(-n // cfg.chunk_size), cfg.max_chunks, workers))


class Cut(NamedTuple):
    """A safe cut at ``pos`` whose decision read only ``text[lo:ext]`` (a tuple: a session turn
    makes one, so it is built at a tuple's cost)."""

    pos: int
    lo: int
    ext: int


def plan_cuts(text: str, predicate: CutPredicate, cfg: PlannerConfig, workers: int, *,
              start: int = 0, start_ext: int = 0, k: int | None = None) -> list[Cut]:
    """Safe cuts of ``text[start:]`` near start + floor(i*N/k), scanning backward up to ``scan_far``.

    A target with no accepted cut in its window is skipped, so its neighbours absorb it; chunks are
    never shorter than max(16, min(1024, N // 4k)). Consecutive cuts are chained: each one's
    evidence starts at or after the previous cut and the previous cut's evidence ends at or before
    it, so the pieces' encodings concatenate to the whole's and every cut is a valid checkpoint.
    ``start``/``start_ext`` describe a cut already made (a session's reused prefix).
    """
    n = len(text)
    span = n - start
    if k is None:
        k = chunk_count(span, cfg, workers)
    if k <= 1 or span < cfg.min_cut_text:
        return []
    min_len = max(C.MIN_CHUNK_FLOOR, min(C.MIN_CHUNK_CAP, span // (4 * k)))
    cuts: list[Cut] = []
    prev, prev_ext = start, start_ext
    for i in range(1, k):
        target = start + i * span // k
        lo = max(prev + min_len, prev_ext, target - cfg.scan_far)
        if target < lo:
            continue
        found = predicate.scan_back(text, target, lo, min_lo=prev)
        if found is None or n - found[0] < min_len:
            continue
        cut = Cut(*found)
        cuts.append(cut)
        prev, prev_ext = cut.pos, cut.ext
    return cuts


def tail_cut(text: str, predicate: CutPredicate, margin: int, *, after: int = 0, after_ext: int = 0,
             window: int = C.REPAIR_WINDOW, doublings: int = C.REPAIR_DOUBLINGS) -> Cut | None:
    """The last cut at least ``margin`` before the end that stays safe however the text continues.

    Searched in windows of ``window`` characters doubling at most ``doublings`` times (the windows
    nest, so this is one backward scan); its evidence must lie inside the text.
    """
    n = len(text)
    start = n - margin
    stop = max(after + 1, after_ext, start - window * (1 << doublings))
    if start < stop:
        return None
    found = predicate.scan_back(text, start, stop, open_end=True, min_lo=after, max_ext=n)
    return Cut(*found) if found is not None else None
