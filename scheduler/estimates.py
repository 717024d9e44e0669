"""Service-time estimates: a + b_kind * N * (1 + 5 s), with b learned online per task kind.

The estimate only has to rank tasks (shortest-first) and stay roughly calibrated, so a linear
model with one learned slope per kind is enough; an EWMA keeps it adapting to the machine and
load without storing history.
"""
from __future__ import annotations

from typing import Mapping, Optional

from .constants import (
    EWMA_WEIGHT,
    EXACT_SCAN_CHARS,
    FIXED_COST_MS,
    INITIAL_MS_PER_CHAR,
    NONASCII_WEIGHT,
    SAMPLE_WINDOW_CHARS,
    SAMPLE_WINDOWS,
    TASK_KINDS,
)


def _count_nonascii(text: str) -> int:
    # encode(..., "ignore") drops exactly the non-ASCII characters, in C: much faster than a loop.
    return len(text) - len(text.encode("ascii", "ignore"))


def nonascii_share(text: str) -> float:
    """Return the share (0..1) of non-ASCII characters in ``text``, in bounded time.

    Pure ASCII is detected in O(1) (``str.isascii`` reads CPython's cached flag). Texts of up to
    2,048 characters are counted exactly; longer ones are sampled by four 512-character windows
    spread evenly from start to end, so the cost never grows with the text.
    """
    if text.isascii():
        return 0.0
    n = len(text)
    if n <= EXACT_SCAN_CHARS:
        return _count_nonascii(text) / n
    span = n - SAMPLE_WINDOW_CHARS
    hits = 0
    for i in range(SAMPLE_WINDOWS):
        start = span * i // (SAMPLE_WINDOWS - 1)  # first window at 0, last one ends at n
        hits += _count_nonascii(text[start : start + SAMPLE_WINDOW_CHARS])
    return hits / (SAMPLE_WINDOWS * SAMPLE_WINDOW_CHARS)


def _check_kind(kind: str) -> None:
    if kind not in TASK_KINDS:
        raise ValueError(f"unknown task kind {kind!r}; known: {', '.join(TASK_KINDS)}")


class Estimator:
    """Estimates a task's service time in ms and learns the per-character cost from completions."""

    def __init__(
        self,
        fixed_ms: float = FIXED_COST_MS,
        ms_per_char: Optional[Mapping[str, float]] = None,
        weight: float = EWMA_WEIGHT,
    ) -> None:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"EWMA weight must be in (0, 1], got {weight}")
        self.fixed_ms = fixed_ms
        self.weight = weight
        self._b = dict(INITIAL_MS_PER_CHAR)
        if ms_per_char:
            for kind, b in ms_per_char.items():
                _check_kind(kind)
                self._b[kind] = float(b)

    def ms_per_char(self, kind: str) -> float:
        """Return the current per-character cost ``b`` of ``kind`` (ms per weighted character)."""
        _check_kind(kind)
        return self._b[kind]

    def estimate(self, kind: str, n_chars: int, nonascii_share: float) -> float:
        """Return the estimated service time in ms of ``n_chars`` characters of ``kind``."""
        _check_kind(kind)
        return self.fixed_ms + self._b[kind] * n_chars * (1.0 + NONASCII_WEIGHT * nonascii_share)

    def observe(self, kind: str, n_chars: int, nonascii_share: float, measured_ms: float) -> None:
        """Move ``b`` of ``kind`` toward the slope implied by a completed task (EWMA).

        The implied slope is (measured - a) / (N * (1 + 5 s)), floored at 0 since a tiny task can
        finish faster than the fixed cost; empty tasks carry no information about ``b``.
        """
        _check_kind(kind)
        weighted_chars = n_chars * (1.0 + NONASCII_WEIGHT * nonascii_share)
        if weighted_chars <= 0:
            return
        measured_b = max(measured_ms - self.fixed_ms, 0.0) / weighted_chars
        self._b[kind] += self.weight * (measured_b - self._b[kind])
