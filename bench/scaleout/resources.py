"""The simulation's resources: FIFO servers (a loop's GIL, a worker's lock, a NIC) and a node's cores,
which the OS time-shares among whatever is runnable (processor sharing, not first come first served).

Ray-free and stdlib-only.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Callable, Protocol


class Timeline(Protocol):
    """What a resource needs of its simulation: the time, and a way to be called back later."""

    @property
    def now(self) -> float: ...

    def after(self, ms: float, fn: Callable[[], None]) -> None: ...


class Resource:
    """``servers`` identical servers with one FIFO queue; tracks busy server-time."""

    def __init__(self, sim: Timeline, name: str, servers: int):
        self.sim, self.name, self.servers = sim, name, servers
        self.busy = 0
        self._queue: deque[Callable[[], None]] = deque()
        self._area = 0.0
        self._since = 0.0
        self._idle_since = 0.0

    def _account(self) -> None:
        now = self.sim.now
        self._area += min(self.busy, self.servers) * (now - self._since)
        self._since = now

    def acquire(self, granted: Callable[[], None]) -> None:
        if self.busy < self.servers:
            self._account()
            self.busy += 1
            granted()
        else:
            self._queue.append(granted)

    def release(self) -> None:
        if self._queue:
            self._queue.popleft()()  # the server passes straight to the next in line
        else:
            self._account()
            self.busy -= 1
            self._idle_since = self.sim.now

    def waking(self, caller: bool = False) -> bool:
        """Whether a step starting now wakes this server's thread from sleep: it is idle, and either
        the step comes from another thread (a caller's request) or the server has been idle since
        an earlier instant (not its own next step, chained straight after the last)."""
        return self.busy == 0 and (caller or self.sim.now > self._idle_since)  # idle: its queue is empty

    def utilization(self, start: float, end: float) -> float:
        self._account()
        return self._area / max(1e-9, (end - start) * self.servers)

    def busy_ms(self) -> float:
        """Server-milliseconds of work done since the accounting was last reset."""
        self._account()
        return self._area

    def reset_accounting(self) -> None:
        self._account()
        self._area = 0.0


class SharedCores(Resource):
    """A node's ``servers`` cores, time-shared: each of the ``n`` jobs runnable at once advances at
    ``min(1, servers / n)`` of a core, as the OS's scheduler shares cores among runnable threads.

    First come first served made a 0.1 ms step of the caller's loop wait out a 5 ms chunk encode
    holding both cores; the OS preempts the encode instead, and stretches it by what runs beside.
    All jobs advance at one rate, so a job ends when the cores' shared *virtual* time (work done per
    job) reaches its start's plus its work: one heap of those ends, O(log n) per arrival or end."""

    def __init__(self, sim: Timeline, name: str, servers: int):
        super().__init__(sim, name, servers)
        self._ends: list = []  # (virtual end, seq, then)
        self._virtual = 0.0
        self._at = 0.0  # when _virtual was last brought up to date
        self._seq = itertools.count()
        self._generation = 0  # the one scheduled wake-up still valid

    def _rate(self) -> float:
        return min(1.0, self.servers / self.busy) if self.busy else 0.0

    def _advance(self) -> None:
        now = self.sim.now
        self._virtual += (now - self._at) * self._rate()
        self._at = now
        self._account()

    def run(self, ms: float, then: Callable[[], None]) -> None:
        """Run ``ms`` of one thread's CPU work among what else is runnable; ``then`` when it is done."""
        self._advance()
        self.busy += 1
        heapq.heappush(self._ends, (self._virtual + max(0.0, ms), next(self._seq), then))
        self._wake()

    def _wake(self) -> None:
        self._generation += 1
        if not self._ends:
            return
        gen, due = self._generation, (self._ends[0][0] - self._virtual) / self._rate()
        self.sim.after(due, lambda: self._end(gen))

    def _end(self, gen: int) -> None:
        if gen != self._generation:  # an arrival or an end since changed the rate: a later wake-up rules
            return
        self._advance()
        done = []
        while self._ends and self._ends[0][0] <= self._virtual + 1e-9:
            done.append(heapq.heappop(self._ends)[2])
        self.busy -= len(done)
        self._wake()
        for then in done:
            then()

    def acquire(self, granted: Callable[[], None]) -> None:
        raise TypeError("cores are time-shared: run work on them with run(), not acquire()")
