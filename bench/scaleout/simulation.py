"""A discrete-event simulation of a pool at scale that drives the real scheduler.

The pool's decisions are not modelled: every task goes through a real :class:`Dispatcher` (its
policy, its per-worker in-flight limit, its shared chunk slots) and every session through the real
rendezvous routing, on a :class:`FakeClock` that this simulation moves. What IS modelled is time:
each step takes a service time measured on a real machine (:class:`Costs`, filled in by
``bench/scaleout/measure.py``) while holding the resources it needs, so the simulation finds which
resource saturates first and how throughput grows with cores and nodes:

* a **driver** (a process calling the pool: its orchestrator on one asyncio loop under one GIL)
  holds its GIL and a core of its node for each orchestrator step: accepting a call (hand-off,
  request side), launching a task on a worker (the side channel on its node, a Ray actor call or
  task elsewhere, the arguments' put), taking an answer (splice, assembly), and the hand-back;
* of a Ray actor call's CPU in the driver, and of a chunk's beyond its launch call, a measured share
  (``Costs.ray_call_threads_share``, ``chunk_threads_share``) runs on Ray's own threads of the
  calling process (its core worker's io thread, gRPC's pollers): a core of its node, not its loop;
* a step that wakes a thread from sleep (an idle loop, an idle worker) pays the wake-up's CPU
  (``Costs.loop_wake_ms``, ``worker_wake_ms``): a lone request at every step, a busy loop never;
* a session turn **stalls** twice, by amounts drawn together from one lone call's measured excess
  over its mean: the part outside its round trip holds its caller's loop (``Costs.loop_stall``: the
  GIL without a core, the process's other calls queue behind it), the part inside holds its worker
  after the encode (``Costs.trip_stall``: no core, that worker's calls queue behind it);
* a stateless text stalls likewise: its loop (``Costs.text_loop_stall``) before its plan, its first
  chunk to run (``Costs.text_stall``: its slot held after the encode, no core), its others (``text_stall_rest``);
* a **session worker** (one per core by default) runs one call at a time on a core of its node;
* **chunk tasks** (the dispatcher's shared slots) run on cores of the nodes, spread round robin;
* a **NIC** per node and direction carries what crosses nodes (texts out, IDs back) at
  ``net_mb_per_ms``.

A node's cores are time-shared (:class:`SharedCores`) by its workers, tasks, driver and other jobs;
a loop, a worker's lock and a NIC are FIFO servers (:class:`Resource`). Utilization is busy
server-time over capacity; the first to saturate is the busiest when the offered load exceeds what
the pool completes. Ray-free and stdlib-only: beside the package's ``scheduler/``, which it
imports and never the other way.
"""
from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

from delta_ray.scheduler.clock import FakeClock
from delta_ray.scheduler.dispatcher import Dispatcher
from delta_ray.scheduler.routing import worker_name

from .costs import Costs, Deck
from .resources import Resource, SharedCores

TURN_CHARS = 1300


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``cores_per_node`` cores; ``workers`` session workers spread round robin
    over them (default: one per core); ``task_slots`` chunk tasks at once (default: one per core);
    ``drivers`` processes calling the pool (each with its own orchestrator), on nodes 0, 1, ..."""

    nodes: int = 1
    cores_per_node: int = 2
    workers: Optional[int] = None
    task_slots: Optional[int] = None
    drivers: int = 1
    policy: str = "shortest_first"
    chunk_size: int = 65_536
    max_chunks: int = 16
    cut_threshold: int = 131_072

    @property
    def cores(self) -> int:
        return self.nodes * self.cores_per_node

    @property
    def n_workers(self) -> int:
        return self.workers if self.workers is not None else self.cores

    @property
    def n_task_slots(self) -> int:
        return self.task_slots if self.task_slots is not None else self.cores


@dataclass
class Result:
    """What a run completed, how long each request took (ms), and each resource's utilization."""

    duration_ms: float
    completed: dict[str, int]
    latencies: dict[str, list[float]]
    utilization: dict[str, float]

    def throughput(self, kind: Optional[str] = None) -> float:
        """Completed requests per second (of ``kind``, or all)."""
        n = sum(self.completed.values()) if kind is None else self.completed.get(kind, 0)
        return n / (self.duration_ms / 1e3)

    def percentile(self, kind: str, q: float) -> float:
        xs = sorted(self.latencies.get(kind, []))
        if not xs:
            return math.nan
        return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]

    def bottleneck(self) -> tuple[str, float]:
        """The most utilized component and its utilization."""
        name = max(self.utilization, key=self.utilization.get)
        return name, self.utilization[name]

    def saturated(self, share: float = 0.95) -> list[str]:
        """Components at least ``share`` busy, the busiest first (several when they saturate together)."""
        return sorted((k for k, u in self.utilization.items() if u >= share), key=lambda k: -self.utilization[k])


@dataclass
class _Session:
    key: str
    context: int
    driver: int
    busy: bool = False
    waiting: deque = field(default_factory=deque)


class Simulation:
    """One cluster, one set of costs; add load (``chat``, ``stateless``, ``closed_*``), then ``run``."""

    def __init__(self, cluster: Cluster, costs: Costs, *, seed: int = 0):
        self.cluster, self.costs = cluster, costs
        self.clock = FakeClock()
        self.rng = random.Random(seed)
        self._events: list = []
        self._seq = itertools.count()
        c = cluster
        self.cpu = [SharedCores(self, f"node{n} cores", c.cores_per_node) for n in range(c.nodes)]
        self.nic_out = [Resource(self, f"node{n} NIC out", 1) for n in range(c.nodes)]
        self.nic_in = [Resource(self, f"node{n} NIC in", 1) for n in range(c.nodes)]
        self.gil = [Resource(self, f"driver{d} loop", 1) for d in range(c.drivers)]
        self.worker_ids = [worker_name(i) for i in range(c.n_workers)]  # as a pool names them
        self.worker_node = {w: i % c.nodes for i, w in enumerate(self.worker_ids)}
        self.worker_lock = {w: Resource(self, f"worker {w}", 1) for w in self.worker_ids}
        self.driver_node = [d % c.nodes for d in range(c.drivers)]
        # Each driver (a process attached to the pool) has its own dispatcher over all workers.
        self.dispatchers = [Dispatcher(c.policy, workers=self.worker_ids, clock=self.clock,
                                       max_inflight_tasks=max(0, c.n_task_slots // c.drivers) or 1,
                                       workers_take_shared=False) for _ in range(c.drivers)]
        self._spread = itertools.count()
        self._turn_spread = Deck(costs.spread, self.rng)
        # a request's two stalls (its loop's, its worker's or chunk's) come from one lone request:
        # drawn together, by its index
        self._turn_stall = Deck(tuple(range(max(len(costs.loop_stall), len(costs.trip_stall)))), self.rng)
        self._text_stall = Deck(tuple(range(max(len(costs.text_loop_stall), len(costs.text_stall)))), self.rng)
        self.completed: dict[str, int] = {}
        self.latencies: dict[str, list[float]] = {}
        self._measure_from = 0.0
        self.stalled_ms = 0.0  # the loops' stalls (Costs.loop_stall, text_loop_stall) measured: not CPU
        self.driver_threads_ms = 0.0  # the drivers' CPU on Ray's threads (off their loops), measured
        self.wakes = {"loop": 0, "worker": 0}  # steps that woke an idle loop or worker, measured
        self.worker_cpu_ms = 0.0  # the workers' encodes in the measured window (a worker's lock
        # is held longer: while its encode waits for a core, and for its trip stall)
        self.chunk_times: list[tuple[float, float]] = []  # each chunk's (wait, round trip) in ms, as
        # the pool's CallRunner records them for Ray's metrics: submit to launch, launch to answer
        self.sessions: list[_Session] = []
        for d in range(c.drivers):  # a calling process's own background work (Ray's threads)
            self._slices([self.gil[d], self.cpu[self.driver_node[d]]], costs.driver_background_ms_per_s)
        for n in range(c.nodes):  # other jobs on the node
            self._slices([self.cpu[n]], costs.node_background_ms_per_s)

    def _slices(self, resources: list[Resource], ms_per_s: float) -> None:
        """Hold ``resources`` in 0.5 ms slices, ``ms_per_s`` a second, busy pool or not (a fixed
        share: it does not vary like a call's service time)."""
        if ms_per_s <= 0:
            return
        period = 500.0 / ms_per_s

        def tick() -> None:  # the next slice is due a period after this one started
            self.hold(resources, 0.5, lambda: None)
            self.after(period, tick)
        self.after(self.rng.random() * period, tick)

    # -- the event loop ---------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.clock.now_ms()

    def after(self, ms: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._events, (self.now + max(0.0, ms), next(self._seq), fn))

    def run(self, until_ms: float, warmup_ms: float = 0.0) -> Result:
        """Run until ``until_ms`` of simulated time; requests finishing before ``warmup_ms`` and the
        resources' busy time before it are not counted."""
        reset_done = warmup_ms <= 0
        while self._events and self._events[0][0] <= until_ms:
            t, _, fn = heapq.heappop(self._events)
            if not reset_done and t >= warmup_ms:
                self.clock.set(warmup_ms)
                self._start_measuring()
                reset_done = True
            self.clock.set(t)
            fn()
        if not reset_done:
            self.clock.set(warmup_ms)
            self._start_measuring()
        self.clock.set(max(self.now, until_ms))
        return self._result(until_ms)

    def _start_measuring(self) -> None:
        self._measure_from = self.now
        self.completed, self.latencies, self.stalled_ms, self.worker_cpu_ms = {}, {}, 0.0, 0.0
        self.driver_threads_ms, self.wakes = 0.0, {"loop": 0, "worker": 0}
        self.chunk_times = []
        for r in [*self.cpu, *self.nic_out, *self.nic_in, *self.gil, *self.worker_lock.values()]:
            r.reset_accounting()

    def _result(self, end: float) -> Result:
        start = self._measure_from
        util = {
            "driver loop (GIL)": max(r.utilization(start, end) for r in self.gil),
            "node cores (busiest node)": max(r.utilization(start, end) for r in self.cpu),
            "session worker (busiest)": max(r.utilization(start, end) for r in self.worker_lock.values()),
            "NIC (busiest)": max(r.utilization(start, end) for r in self.nic_out + self.nic_in),
        }
        return Result(end - start, dict(self.completed), {k: list(v) for k, v in self.latencies.items()}, util)

    def _done(self, kind: str, t0: float) -> None:
        # All that completes inside the measured window counts (in overload that IS the throughput).
        self.completed[kind] = self.completed.get(kind, 0) + 1
        self.latencies.setdefault(kind, []).append(self.now - t0)

    # -- holding resources --------------------------------------------------------------------------
    def hold(self, resources: list[Resource], ms: float, then: Callable[[], None]) -> None:
        """Acquire ``resources`` in order, hold them all for ``ms`` (``ms`` of work on a node's cores
        among them, stretched by what else runs there), release, then call ``then``."""
        queued = [r for r in resources if not isinstance(r, SharedCores)]
        cores = [r for r in resources if isinstance(r, SharedCores)]
        if len(cores) > 1:  # one thread runs on one node
            raise ValueError(f"one step runs on one node's cores, not {len(cores)} nodes'")

        def step(i: int) -> None:
            if i < len(queued):
                queued[i].acquire(lambda: step(i + 1))
                return

            def finish() -> None:
                for r in queued:
                    r.release()
                then()
            if cores:
                cores[0].run(ms, finish)
            else:
                self.after(ms, finish)
        step(0)

    def beside(self, cores: SharedCores, ms: float) -> None:
        """``ms`` of other processes' threads on ``cores``, beside a request but not on its path (the
        raylet's bookkeeping of a chunk): it slows what runs there but nothing waits for it."""
        if ms > 0:
            cores.run(ms, lambda: None)

    def _woke(self, r: Resource, kind: str, ms: float, caller: bool = False) -> float:
        """``ms`` (Costs.loop_wake_ms, worker_wake_ms) if a step starting now wakes ``r``, else 0."""
        woke = r.waking(caller)
        self.wakes[kind] += woke and self.now >= self._measure_from
        return ms if woke else 0.0

    def driver_step(self, d: int, ms: float, then: Callable[[], None]) -> None:
        ms += self._woke(self.gil[d], "loop", self.costs.loop_wake_ms)
        self.hold([self.gil[d], self.cpu[self.driver_node[d]]], ms, then)

    def driver_threads(self, d: int, ms: float, then: Callable[[], None]) -> None:
        """``ms`` of driver ``d``'s CPU on Ray's own threads (a call's submission and its answer's
        receipt in the core worker, gRPC): on the request's path and a core of the driver's node,
        but not its loop, so the process's other calls go on meanwhile."""
        if ms <= 0:
            return then()
        self.driver_threads_ms += ms
        self.hold([self.cpu[self.driver_node[d]]], ms, then)

    def transfer(self, src: int, dst: int, n_bytes: float, then: Callable[[], None]) -> None:
        """Bytes from node ``src`` to ``dst``: nothing on one node (shared memory is in the costs)."""
        if src == dst or n_bytes <= 0:
            then()
            return
        self.hold([self.nic_out[src], self.nic_in[dst]], n_bytes / 1e6 / self.costs.net_mb_per_ms, then)

    # -- dispatch -----------------------------------------------------------------------------------
    def _pump(self, d: int) -> None:
        for wid, task in self.dispatchers[d].dispatch():
            launch = task.payload
            launch(wid, task)

    # -- session turns --------------------------------------------------------------------------------
    def add_sessions(self, n: int, context: tuple[int, int] = (100_000, 1_000_000),
                     keys: Optional[list[str]] = None) -> None:
        """``n`` sessions already initialized, contexts uniform in ``context``; callers spread over
        drivers. ``keys`` names them as a real pool's callers do, so they share its homes."""
        base = len(self.sessions)
        for i in range(n):
            key = keys[i] if keys else f"session-{base + i}"
            s = _Session(key, self.rng.randint(*context), (base + i) % self.cluster.drivers)
            self.sessions.append(s)

    def turn(self, s: _Session, on_done: Optional[Callable[[], None]] = None) -> None:
        """One 1.3K turn of session ``s`` arrives now (a caller blocked until its answer)."""
        t0 = self.now
        if s.busy:  # the orchestrator serializes a session's calls (its key lock)
            s.waiting.append((t0, on_done))
            return
        self._start_turn(s, t0, on_done)

    def _start_turn(self, s: _Session, t0: float, on_done) -> None:
        s.busy = True
        c, d = self.costs, s.driver
        disp = self.dispatchers[d]
        orch = c.orch_session(self.cluster.n_workers)
        started = [t0]

        def accepted() -> None:
            disp.submit("session", TURN_CHARS, session_key=s.key, payload=launch)
            self._pump(d)

        def launch(wid: str, task) -> None:
            started[0] = self.now
            node = self.worker_node[wid]
            local = node == self.driver_node[d]
            client = c.channel_client_ms if local else (1 - c.ray_call_threads_share) * c.ray_call_ms
            threads = 0.0 if local else c.ray_call_threads_share * c.ray_call_ms
            rtt = c.channel_rtt_ms if local else c.ray_rtt_ms

            def sent() -> None:
                self.transfer(self.driver_node[d], node, TURN_CHARS, lambda: self.after(rtt / 2, at_worker))

            def at_worker() -> None:  # the worker held for the encode on a core, then its trip stall
                lock = self.worker_lock[wid]

                def answer() -> None:
                    lock.release()
                    self.transfer(node, self.driver_node[d], 4 * TURN_CHARS / 4, lambda: self.after(rtt / 2, answered))
                spread = self._turn_spread.draw() if self._turn_spread else 1.0  # Costs.spread
                ms = (c.worker_call_ms + c.turn_ms(s.context)) * spread + self._woke(lock, "worker", c.worker_wake_ms)
                if self.now >= self._measure_from:
                    self.worker_cpu_ms += ms
                lock.acquire(lambda: self.hold([self.cpu[node]], ms, lambda: self.after(trip, answer)))

            def answered() -> None:  # CallRunner._on_done: the merge, then the slot freed and refilled,
                self.driver_step(d, orch / 2, lambda: freed(task))  # then the caller's thread woken
            self.driver_step(d, client, lambda: self.driver_threads(d, threads, sent))

        def freed(task) -> None:
            disp.complete(task.id, self.now - started[0])
            self._pump(d)
            self.driver_step(d, c.handoff_ms / 2, finished)

        def finished() -> None:
            s.context += TURN_CHARS
            s.busy = False
            self._done("turn", t0)
            if s.waiting:
                t1, cb = s.waiting.popleft()
                self._start_turn(s, t1, cb)
            if on_done is not None:
                on_done()

        stall, trip, _ = self._stalls()  # the caller's loop held (Costs.loop_stall), then the hand-off
        self._accept(d, stall, c.handoff_ms / 2 + orch / 2, accepted)

    def _stalls(self, text: bool = False) -> tuple[float, ...]:
        """A turn's or a text's stalls (ms), from one lone request: its loop's, its worker's or first
        chunk's, its other chunks' each."""
        deck, c = (self._text_stall if text else self._turn_stall), self.costs
        if not deck:
            return 0.0, 0.0, 0.0
        i = deck.draw()
        return tuple(xs[i] if i < len(xs) else 0.0 for xs in (
            (c.text_loop_stall, c.text_stall, c.text_stall_rest) if text else (c.loop_stall, c.trip_stall, ())))

    def _accept(self, d: int, stall: float, ms: float, then: Callable[[], None]) -> None:
        """A caller's request at driver ``d``: its loop held ``stall`` without a core (not CPU), then
        a step of ``ms`` on it, plus its wake-up (``Costs.loop_wake_ms``) if the request found it idle."""
        ms += self._woke(self.gil[d], "loop", self.costs.loop_wake_ms, caller=True)
        step = lambda: self.hold([self.gil[d], self.cpu[self.driver_node[d]]], ms, then)  # noqa: E731
        if stall <= 0:
            return step()
        if self.now >= self._measure_from:
            self.stalled_ms += stall
        self.hold([self.gil[d]], stall, step)

    def chat(self, rate_per_s: float, until_ms: float) -> None:
        """Poisson turn arrivals at ``rate_per_s`` over the sessions (uniformly) until ``until_ms``."""
        def arrive() -> None:
            self.turn(self.rng.choice(self.sessions))
            self._next(rate_per_s, until_ms, arrive)
        self._next(rate_per_s, until_ms, arrive)

    def closed_turns(self, callers: int) -> None:
        """``callers`` callers, each on its own session, each sending its next turn when answered."""
        for i in range(callers):
            self._again(lambda done, s=self.sessions[i % len(self.sessions)]: self.turn(s, on_done=done))

    @staticmethod
    def _again(start: Callable[[Callable[[], None]], None]) -> None:
        """A closed-loop caller: ``start(done)`` now and whenever it calls ``done`` (its own closure: a
        late-bound ``loop`` once made N callers' second turns all continue the last one's session)."""
        def done() -> None:
            start(done)
        done()

    # -- stateless long texts ---------------------------------------------------------------------------
    def chunk_count(self, n: int) -> int:
        c = self.cluster
        if n < c.cut_threshold:
            return 1
        slots = max(1, c.n_task_slots)
        return max(1, min(-(-n // c.chunk_size), c.max_chunks, slots))

    def text(self, n_chars: int, driver: int = 0, on_done: Optional[Callable[[], None]] = None) -> None:
        """One stateless text of ``n_chars`` arrives now: planned, chunked, run on task slots, assembled."""
        t0 = self.now
        c, d = self.costs, driver
        disp = self.dispatchers[d]
        k = self.chunk_count(n_chars)
        piece = n_chars / k
        left = [k]
        orch = c.orch_chunk(self.cluster.n_workers)
        share = c.chunk_threads_share  # of a chunk's driver CPU beyond its launch, on Ray's threads
        launched: dict[int, float] = {}
        loop_stall, inside, rest = self._stalls(text=True)
        stall = [inside]  # spent in its first chunk, ``rest`` in each other

        def planned() -> None:
            for _ in range(k):
                disp.submit("chunk", int(piece), payload=launch, request_chars=n_chars)
            self._pump(d)

        def launch(_wid, task) -> None:
            launched[task.id] = self.now
            node = next(self._spread) % self.cluster.nodes  # SPREAD

            def sent() -> None:
                self.beside(self.cpu[node], c.chunk_daemon_ms)
                self.transfer(self.driver_node[d], node, piece, lambda: self.after(c.ray_rtt_ms / 2, run))

            def run() -> None:
                extra, stall[0] = stall[0], rest
                self.hold([self.cpu[node]], c.chunk_node_ms + c.encode_ms_per_mchar * piece / 1e6,
                          lambda: self.after(extra, lambda: self.transfer(
                              node, self.driver_node[d], piece,  # ~4 bytes per 4 chars
                              lambda: self.after(c.ray_rtt_ms / 2, answered))))

            def answered() -> None:  # the answer received on Ray's threads, then taken on the loop
                self.driver_threads(d, share * c.chunk_ms, lambda: self.driver_step(
                    d, orch / 2 + (1 - share) * c.chunk_ms, lambda: chunk_done(task)))
            self.driver_step(d, c.ray_call_ms + c.put_ms_per_mchar * piece / 1e6 + orch / 2, sent)

        def chunk_done(task) -> None:
            at = launched.pop(task.id)
            disp.complete(task.id, self.now - at)
            if self.now >= self._measure_from:
                self.chunk_times.append((at - task.arrival_ms, self.now - at))
            self._pump(d)
            left[0] -= 1
            if left[0] == 0:
                self.driver_step(d, c.assemble_ms_per_mchar * n_chars / 1e6 + c.handoff_ms / 2, finished)

        def finished() -> None:
            self._done("text", t0)
            if on_done is not None:
                on_done()

        self._accept(d, loop_stall, c.handoff_ms / 2 + c.plan_ms_per_mchar * n_chars / 1e6, planned)

    def stateless(self, rate_per_s: float, until_ms: float, size: tuple[int, int] = (1_000_000, 3_000_000)) -> None:
        """Poisson arrivals of stateless texts of uniform size in ``size``, callers spread over drivers."""
        turn = itertools.count()

        def arrive() -> None:
            self.text(self.rng.randint(*size), driver=next(turn) % self.cluster.drivers)
            self._next(rate_per_s, until_ms, arrive)
        self._next(rate_per_s, until_ms, arrive)

    def closed_texts(self, callers: int, n_chars: int) -> None:
        """``callers`` callers each sending a text of ``n_chars`` when its last one is answered."""
        for i in range(callers):
            self._again(lambda done, d=i % self.cluster.drivers: self.text(n_chars, driver=d, on_done=done))

    def _next(self, rate_per_s: float, until_ms: float, fn: Callable[[], None]) -> None:
        if rate_per_s <= 0:
            return
        dt = self.rng.expovariate(rate_per_s / 1e3)
        if self.now + dt <= until_ms:
            self.after(dt, fn)


def sweep(cluster: Cluster, costs: Costs, load: Callable[[Simulation, float, float], None],
          rates: list[float], *, duration_ms: float = 2_000.0, warmup_ms: float = 500.0,
          seed: int = 0) -> list[tuple[float, Result]]:
    """Run one simulation per offered rate; ``load(sim, rate, until_ms)`` adds the arrivals."""
    out = []
    for rate in rates:
        sim = Simulation(cluster, costs, seed=seed)
        load(sim, rate, warmup_ms + duration_ms)
        out.append((rate, sim.run(warmup_ms + duration_ms, warmup_ms)))
    return out
