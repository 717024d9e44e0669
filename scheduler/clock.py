"""Time source of the scheduler, injectable so tests can drive waiting and aging deterministically."""
from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Anything that tells the current time in milliseconds, never going backwards."""

    def now_ms(self) -> float:
        """Return the current time in milliseconds (arbitrary origin, monotonic)."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` in ms, immune to wall-clock jumps (NTP, DST)."""

    def now_ms(self) -> float:
        """Return ``time.monotonic()`` in milliseconds."""
        return time.monotonic() * 1000.0


class FakeClock:
    """A clock that only moves when told to, for tests."""

    def __init__(self, start_ms: float = 0.0) -> None:
        self._now = float(start_ms)

    def now_ms(self) -> float:
        """Return the time last set."""
        return self._now

    def advance(self, ms: float) -> float:
        """Move the clock forward by ``ms`` and return the new time; negative steps are refused."""
        if ms < 0:
            raise ValueError(f"a clock never goes backwards (advance({ms}))")
        self._now += ms
        return self._now

    def set(self, now_ms: float) -> None:
        """Jump to ``now_ms``, which must not be earlier than the current time."""
        if now_ms < self._now:
            raise ValueError(f"a clock never goes backwards ({now_ms} < {self._now})")
        self._now = float(now_ms)
