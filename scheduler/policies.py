"""Queue orderings, pluggable by name (like Ray Serve's config strings).

A policy turns a task's arrival time and estimated service time into a fixed priority key;
smaller keys run first. Keys never change while a task waits, so a plain heap is enough.
"""
from __future__ import annotations

from typing import Mapping, Protocol, runtime_checkable


@runtime_checkable
class Policy(Protocol):
    """Maps (arrival, estimate) to a priority key; smaller runs first."""

    name: str

    def key(self, arrival_ms: float, estimate_ms: float) -> float:
        """Return the task's priority key."""
        ...


class FifoPolicy:
    """First come, first served: the key is the arrival time."""

    name = "fifo"

    def key(self, arrival_ms: float, estimate_ms: float) -> float:
        """Return ``arrival_ms``; the estimate is ignored."""
        return arrival_ms

    def __repr__(self) -> str:
        return "FifoPolicy()"


class ShortestFirstPolicy:
    """Shortest expected finish first, with aging: the key is arrival + estimated service time.

    Comparing a + e between tasks is the same as crediting each waiting task one ms per ms waited
    against its estimate, so short tasks overtake a long one only for as long as the long one's
    estimate, after which it runs: no starvation, and no re-keying while tasks wait.
    """

    name = "shortest_first"

    def key(self, arrival_ms: float, estimate_ms: float) -> float:
        """Return ``arrival_ms + estimate_ms``."""
        return arrival_ms + estimate_ms

    def __repr__(self) -> str:
        return "ShortestFirstPolicy()"


POLICIES: Mapping[str, type] = {
    FifoPolicy.name: FifoPolicy,
    ShortestFirstPolicy.name: ShortestFirstPolicy,
}


def make_policy(name: str) -> Policy:
    """Return a new policy by config name; raise ValueError listing the known names otherwise."""
    try:
        cls = POLICIES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown scheduling policy {name!r}; known: {', '.join(sorted(POLICIES))}"
        ) from None
    return cls()
