"""The simulation's inputs: service times measured on a real machine, and the shapes of their variation.

Ray-free and stdlib-only; filled in by ``bench/scaleout/measure.py``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Costs:
    """Service times in ms, each measured on a real machine (see bench/scaleout/measure.py)."""
    # driver CPU (GIL + a core of the driver's node) per step
    handoff_ms: float = 0.07  # caller thread -> the pool's loop and back
    orch_session_ms: float = 0.30  # orchestrator per session call (fake transport answering at once)...
    orch_session_ms_per_worker: float = 0.0  # ...and its growth with the number of workers it routes over
    orch_chunk_ms: float = 0.07  # orchestrator per chunk dispatch...
    orch_chunk_ms_per_worker: float = 0.0  # ...and its growth with the number of workers
    channel_client_ms: float = 0.10  # a same-node side-channel call, the driver's CPU
    ray_call_ms: float = 0.25  # a Ray actor call or task launch, the driver's CPU
    put_ms_per_mchar: float = 4.0  # a chunk's text into the object store and its IDs back, per Mchar
    chunk_ms: float = 0.0  # per chunk task beyond its launch: the argument's seal and pin, the result's fetch
    # Of the driver's CPU for a Ray actor call (``ray_call_ms``), and of a chunk's beyond its launch
    # call (``chunk_ms``: its answer's receipt), the share on Ray's own threads of the calling
    # process (its core worker's io thread, gRPC's pollers): a core, not the loop. Measured about
    # 0.46 and 0.9 (2026-12-03: a chunk's launch call holds the loop 1.5-1.8 ms of its 5-6, its
    # answer 0.45). All of it on the loop made the simulated loop twice as busy as the pool's.
    ray_call_threads_share: float = 0.0
    chunk_threads_share: float = 0.0
    plan_ms_per_mchar: float = 2.0  # planning the cuts of a stateless text
    assemble_ms_per_mchar: float = 2.0  # concatenating and wrapping a stateless text's IDs
    channel_rtt_ms: float = 0.05  # this and the next: latency only (no resource held)
    ray_rtt_ms: float = 0.5
    # CPU a step pays to wake a thread that slept: the loop's (a driver step that finds it idle: a
    # caller's request, or an answer after an idle wait) and a worker's (a turn that finds it idle).
    # On this VM a vCPU with nothing to run halts at once (cpuidle haltpoll, guest_halt_poll_ns 0)
    # and a thread woken onto it runs slower: two SCHED_IDLE spinners keeping both vCPUs from halting
    # cut a lone turn's driver CPU 0.64 -> 0.47 ms and its worker's 0.38 -> 0.24, a loaded turn's
    # levels (2026-12-03). Filled in from a lone turn's CPU beyond the costs' sum; a loop kept busy
    # pays none. As a cost per call instead, 2 workers' simulated turns ran 16-38% short.
    loop_wake_ms: float = 0.0
    worker_wake_ms: float = 0.0
    # worker CPU
    worker_call_ms: float = 0.05  # a worker's fixed cost per call (frames, lock, bookkeeping)
    turn_ms_100k: float = 0.3  # a 1.3K turn on a 100K-character session
    turn_ms_1m: float = 0.5  # the same on 1M characters (interpolated linearly in between)
    encode_ms_per_mchar: float = 10.0  # a stateless chunk's encode, per million characters
    chunk_node_ms: float = 0.0  # per chunk, its task process's CPU beyond the encode: on its path
    # per chunk, Ray's daemons' CPU on its node (the raylet with its object store, the GCS): their
    # threads run beside the chunk on its node's time-shared cores, off its path
    chunk_daemon_ms: float = 0.0
    # network, per node and direction (not measurable on one machine: 10 Gbit/s assumed)
    net_mb_per_ms: float = 1.25
    # CPU per second taken whatever the pool serves, in 0.5 ms slices: by a calling process (Ray's
    # threads) of its loop and a core; by other jobs (measured with the pool idle) of a node's cores
    driver_background_ms_per_s: float = 0.0
    node_background_ms_per_s: float = 0.0
    # A worker turn's variation: its cost times a factor drawn from these (its samples over their mean;
    # the turn's only: drawn on chunk encodes too, a heavy tail made stateless P99 3x the measured).
    spread: tuple[float, ...] = ()
    # A lone session call's excess over its mean latency outside its round trip to the worker, one
    # value per measured call (:func:`stalls_of`), drawn per turn and spent holding its caller's
    # loop (the GIL) but no core: the loop's thread preempted while it holds the GIL, or the loop's
    # own irregular work; the process's other calls queue behind it. What a lone call shows of it,
    # the simulation amplifies with the queueing (docs/design.md, "The scale-out model"). Not CPU: not counted as the
    # driver's.
    loop_stall: tuple[float, ...] = ()
    # The same call's round trip (dispatch to answer, as the pool's CallRunner times it): its excess
    # over its mean, paired with ``loop_stall`` (sample i of each from one lone call, drawn together,
    # :func:`stalls_of`) and spent holding the call's worker after its encode, no core: the worker's
    # process or the channel slow to answer. Only that worker's callers queue behind it; with the
    # whole excess on the loop, 2 workers' simulated P99 ran 46-61% over the pool's (2026-12-03).
    trip_stall: tuple[float, ...] = ()
    # A lone stateless text's excess over its mean inside its longest chunk's round trip, drawn per
    # text and spent inside one of its chunks: the chunk's slot held, no core (Ray's scheduling, the
    # task's process or the object store slow to answer); the text's other callers queue for the slot.
    text_stall: tuple[float, ...] = ()
    # The same lone text's other chunks' round trip (their mean): its excess over its own mean,
    # paired with ``text_stall`` by index and spent inside each of the text's other chunks likewise.
    # A lone text's two chunks' round trips correlate (0.79; in its slowest 5% the shorter one's
    # excess was 0.59 of the longer's, 2026-12-03): one stall per text left 2 workers' P99 short.
    text_stall_rest: tuple[float, ...] = ()
    # A lone text's excess outside its chunks' round trips (the longest one's), paired with
    # ``text_stall`` as ``loop_stall`` is with ``trip_stall`` (:func:`stalls_of`): spent holding its
    # caller's loop, no core, before its plan (the calling process's own bursts: GC, its threads).
    text_loop_stall: tuple[float, ...] = ()

    def orch_session(self, workers: int) -> float:
        return self.orch_session_ms + self.orch_session_ms_per_worker * workers

    def orch_chunk(self, workers: int) -> float:
        return self.orch_chunk_ms + self.orch_chunk_ms_per_worker * workers

    def turn_ms(self, context_chars: int) -> float:
        """A turn's cost, interpolated between the two measured contexts and flat outside them: the
        turn is O(append), and extrapolated, a measured 1M turn cheaper than a 100K one (noise) went
        below zero at the 3-5M characters a validation's sessions reach."""
        share = min(1.0, max(0.0, (context_chars - 100_000) / 900_000))
        return self.turn_ms_100k + (self.turn_ms_1m - self.turn_ms_100k) * share


def spread_of(samples: list[float], points: int = 200) -> tuple[float, ...]:
    """``Costs.spread`` from a call's measured times: ``points`` quantiles of the samples over their
    mean: a draw keeps the measured shape and a step's mean stays its cost (costs are means; over the
    median, a turn's rare large rope copies weighed on every step again: 2x, measured)."""
    xs = sorted(x for x in samples if x > 0)
    if not xs:
        return ()
    mean = sum(xs) / len(xs)
    return tuple(xs[min(len(xs) - 1, int((i + 0.5) * len(xs) / points))] / mean for i in range(points))


def stalls_of(totals: list[float], trips: list[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(Costs.loop_stall, Costs.trip_stall)`` from lone calls' latencies and their round trips (ms,
    paired): each part's excess over its own mean, so a call slow at its worker stalls only that
    worker, and one slow in the caller's loop stalls the loop."""
    if len(totals) != len(trips):
        raise ValueError(f"{len(totals)} latencies but {len(trips)} round trips: they must be paired")
    return excess([t - r for t, r in zip(totals, trips)]), excess(trips)


def excess(xs: list[float]) -> tuple[float, ...]:
    """Each sample's excess over the samples' mean (0 below it), in their order: pairs stay paired."""
    mean = sum(xs) / len(xs) if xs else 0.0
    return tuple(max(0.0, x - mean) for x in xs)


class Deck:
    """A measured sample's values drawn each exactly once per pass, in a new random order each pass.

    A run then holds the sample's rare large values as often as they were measured, rather than
    a count left to chance: with draws at random, one 6 s validation run's simulated P99 moved
    4.2-7.9 ms with the seed alone (2026-12-02), its tail set by how many of a few stalls it drew.
    """

    def __init__(self, values: tuple[float, ...], rng: random.Random):
        self.values, self.rng = values, rng
        self._left: list[float] = []

    def __bool__(self) -> bool:
        return bool(self.values)

    def draw(self) -> float:
        if not self._left:
            self._left = list(self.values)
            self.rng.shuffle(self._left)
        return self._left.pop()
