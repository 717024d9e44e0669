"""The simulation's service times, measured on this machine: every step a request takes, in one run.

The orchestrator's CPU per session call and per chunk dispatch over a transport that answers at
once, and its growth with the number of workers it routes over (``bench/bench_ceilings.py``'s
drivers); the hand-off to the pool's loop; a side-channel round trip to a worker process; a Ray
actor call, a task launch and an object put, and the pool's own chunk task (with Ray); a worker's
1.3K turn at 100K and 1M characters of context; a chunk's encode per character; planning and
assembly. :func:`measure_costs` turns them into the simulation's :class:`~bench.scaleout.costs.Costs`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

from bench import bench_ceilings as ceil
from bench.harness import CpuMeter, cpu_per_call, median_ms, samples
from delta_ray._core.assembly import concat_ids, to_arrow
from delta_ray._core.config import TokenizerConfig
from delta_ray._tokenizer_core import TokenizerCore
from delta_ray.actors.loop_thread import LoopThread
from delta_ray.apps.sample_text import corpus

from .costs import Costs, spread_of

TURN = 1300


def _serve_channel(secret, conn, loaded=None, engine="fast"):
    """A side-channel server answering a fixed answer, or (``loaded``) a pool worker's own handler
    (:class:`~delta_ray.actors.worker.WorkerService` over that tokenizer) as a worker runs it."""
    from delta_ray.actors import worker_channel
    from delta_ray.actors.calls import CHANNEL_METHODS
    if loaded is None:
        ids = np.arange(330, dtype=np.int32)
        handler = lambda m, a: (7, 0, ids)  # noqa: E731
    else:
        from delta_ray.actors.worker import WorkerService
        service = WorkerService(TokenizerCore(loaded, TokenizerConfig(
            threads=1, shadow_rate=0.0, engine=engine)), secret)
        handler = lambda m, a: getattr(service, m)(*a)  # noqa: E731  (as TokenizerWorker._channel_call)
    server = worker_channel.ChannelServer(handler, secret, methods=CHANNEL_METHODS)
    conn.send((server.address, os.getpid()))
    while conn.recv() == "cpu":  # this process's CPU time, to the microsecond (/proc counts 10 ms ticks)
        conn.send(time.process_time())


def measure_channel(n: int = 2000, loaded=None, engine: str = "fast") -> tuple[float, float, float]:
    """(client CPU ms, server CPU ms, wall ms) per side-channel call of a 1.3K extend: answered at
    once, or (``loaded``) by a worker's own handler, turns on 4 sessions of 100K characters, each
    caller knowing its last version (as the pool does: only the tail comes back)."""
    from delta_ray.actors import worker_channel
    secret = worker_channel.new_secret()
    parent, child = mp.Pipe()
    proc = mp.get_context("fork").Process(target=_serve_channel, args=(secret, child, loaded, engine), daemon=True)
    proc.start()
    address, pid = parent.recv()
    text = ("The quick brown fox jumps over the lazy dog. " * 30)[:TURN]
    src = corpus("code", 100_000 + (n + 8) * TURN) if loaded is not None else ""

    async def calls():
        client = worker_channel.ChannelClient(address, secret, expected_pid=pid)
        known = {}
        if loaded is None:
            await client.call("extend", ("warm", text, None, None))
        else:
            for k in range(4):
                known[k] = (await client.call("encode_session", (f"s{k}", src[:100_000], None)))[0]
        parent.send("cpu")
        c0, t0, s0 = time.process_time(), time.perf_counter(), parent.recv()
        for i in range(n):
            if loaded is None:
                await client.call("extend", (f"s{i % 64}", text, 7, 7))
            else:
                k = i % 4
                delta = src[100_000 + i * TURN:100_000 + (i + 1) * TURN]
                known[k] = (await client.call("extend", (f"s{k}", delta, known[k], known[k])))[0]
        c1, t1 = time.process_time(), time.perf_counter()
        parent.send("cpu")
        s1 = parent.recv()
        client.close()
        return c1 - c0, t1 - t0, s1 - s0
    try:
        cpu, wall, server = asyncio.run(calls())
    finally:
        proc.terminate()
        proc.join(5)
    # the server's CPU from its own process; taken as the client's before 2026-12-02, which the
    # pool's measured worker CPU showed 1.5-1.8x too high
    return cpu / n * 1e3, server / n * 1e3, wall / n * 1e3


def _off_loop(calling_thread_ms: float, process_ms: float) -> float:
    """The share of a process's CPU not on its calling thread (Ray's own threads), in [0, 1]."""
    return min(1.0, max(0.0, 1 - calling_thread_ms / process_ms)) if process_ms > 0 else 0.0


def measure_ray(ray, loaded, engine: str, n: int = 300) -> dict:
    @ray.remote(num_cpus=0)
    class Echo:
        def extend(self, key, delta, known, version):
            return (7, 0, np.arange(330, dtype=np.int32))

    @ray.remote(num_cpus=0)
    def task(x):
        return 0

    a = Echo.remote()
    text = ("The quick brown fox jumps over the lazy dog. " * 30)[:TURN]
    ray.get(a.extend.remote("w", text, None, None))
    ray.get([task.remote(0) for _ in range(8)])
    th0 = time.thread_time()
    call_cpu, _ = cpu_per_call(lambda: ray.get(a.extend.remote("s", text, 7, 7)), n)
    call_thread = (time.thread_time() - th0) / n * 1e3  # the calling thread's part: the rest ran on Ray's
    call_wall = median_ms(lambda: ray.get(a.extend.remote("s", text, 7, 7)), n)  # medians: robust to load
    c0 = time.process_time()
    refs = [task.remote(0) for _ in range(n)]
    launch_cpu = (time.process_time() - c0) / n * 1e3
    ray.get(refs)
    task_wall = median_ms(lambda: ray.get(task.remote(0)), n // 2)

    # A chunk task's configuration side by side: resolved into the task as an argument (before
    # 2026-12-03) and boxed, fetched only on a cache miss (now): the node's CPU per task, in rounds.
    config_ref = ray.put(loaded.config_bytes)

    @ray.remote(num_cpus=0)
    def takes(config, piece):
        return len(piece)
    piece = "x" * 250_000
    ray.get([takes.remote((config_ref,), piece) for _ in range(4)])

    def node_ms(arg, k: int = 40) -> float:
        meter = CpuMeter()
        for _ in range(k):
            ray.get(takes.remote(arg, piece))
        return meter.read()[1] / k
    resolved, boxed = ([statistics.median(xs) for xs in zip(*((node_ms(config_ref), node_ms((config_ref,)))
                                                             for _ in range(5)))])

    # The pool's own chunk task (its launcher and options, the tokenizer's configuration by
    # reference, the fast engine in the task's process), fed real text, where a stand-in task
    # returning zeros used to stand for it (2026-12-02).
    from delta_ray._core.config import pool_config
    from delta_ray.actors.calls import ENCODE_PIECES, Call, PiecesArgs
    from delta_ray.actors.chunk_task import ChunkLauncher
    launcher = ChunkLauncher(config_ref, loaded.digest,
                             pool_config(None, {"engine": engine, "shadow_rate": 0.0}))
    loop = asyncio.new_event_loop()

    def per_chunk(n_chars: int, seconds: float, idle_ms_per_s: tuple[float, float, float],
                  settle_s: float = 1.0) -> tuple[float, float, float, float, float]:
        """(the driver's CPU, every thread of this process; its loop's thread's in the launch call
        and in all; the task's process's; Ray's daemons')
        per chunk task of ``n_chars``, from launch to its IDs in hand, as the pool runs one (the
        references awaited on an event loop, two at a time): the launch, the argument's put (seal,
        pin), the result's fetch; the encode and its (de)serialization; the lease and the object
        store's bookkeeping; each less its processes' ``idle_ms_per_s``.
        In steady state: the pairs run ``settle_s`` before the window and through it, so work Ray
        defers past a task (its events' and metrics' flushes, once a second) falls inside as much
        as it leaves."""
        call = Call(ENCODE_PIECES, PiecesArgs([corpus("english", n_chars)]), None)

        launching = [0.0]

        def launch():  # the synchronous launch call: the arguments serialized, the text put
            t = time.thread_time()
            ref = launcher(call)
            launching[0] += time.thread_time() - t
            return ref

        async def pairs(until: float) -> int:
            k = 0
            while time.perf_counter() < until:
                await asyncio.gather(*(launch() for _ in range(2)))
                k += 2
            return k
        loop.run_until_complete(pairs(time.perf_counter() + settle_s))
        meter, th0, launching[0] = CpuMeter(split=True), time.thread_time(), 0.0
        k = loop.run_until_complete(pairs(meter.t0 + seconds))
        on_loop = (time.thread_time() - th0) * 1e3
        driver, tasks, daemons, _ = meter.read_split(idle_ms_per_s)
        return driver / k, launching[0] * 1e3 / k, on_loop / k, max(0.0, tasks) / k, max(0.0, daemons) / k
    # Fitted as fixed + per character from two sizes: splitting a text into more chunks moves the
    # same bytes but pays the fixed part again (measured 2026-12-02: a 1M text's driver CPU 3.8 ms
    # as one chunk, 7.9 ms as two).
    per_chunk(250_000, 0.1, (0.0, 0.0, 0.0), settle_s=3.0)  # chunk processes start, load the tokenizer
    # Each kind's CPU with nothing launched (idle task processes, Ray's daemons), measured once the
    # chunk processes are warm and what the tasks above left behind has settled: measured right
    # after them, the worker processes Ray was still starting and stopping counted as idle. Per
    # kind, since the machine's idle share moved 70-330 ms/s with the dashboard agent's bursts,
    # and taken whole from a chunk's, it left Ray's daemons 0-0.6 ms a chunk where the raylet
    # alone spends 3.7-5 ms (per process, 2026-12-03).
    time.sleep(1.0)
    meter = CpuMeter(split=True)
    time.sleep(2.0)
    _, *idle = meter.read_split()
    idle_ms_per_s = tuple(ms / 2.0 for ms in idle)
    (small, small_launch, small_loop, small_task, small_daemons), (large, large_launch, large_loop, large_task,
                                                                     large_daemons) = (
        [statistics.median(xs) for xs in zip(*(per_chunk(m, 2.0, idle_ms_per_s) for _ in range(3)))]
        for m in (250_000, 1_000_000))
    loop.close()
    per_mchar = max(0.0, (large - small) / 0.75)
    task_per_mchar = max(0.0, (large_task - small_task) / 0.75)
    # the simulation charges ray_call_ms per launch, so chunk_ms is what a chunk costs beyond it
    return {"config_resolved_node_ms": resolved, "config_boxed_node_ms": boxed,
            "ray_call_cpu_ms": call_cpu, "ray_call_wall_ms": call_wall, "task_launch_cpu_ms": launch_cpu,
            "task_wall_ms": task_wall, "put_ms_per_mchar": per_mchar,
            "chunk_ms": max(0.0, small - per_mchar / 4 - call_cpu),
            # the driver's CPU on Ray's own threads, not the calling thread: of an actor call's; of
            # a chunk's beyond its launch call (the launch runs on the loop, 1.5-1.8 ms of its 5-6,
            # the answer's receipt mostly on Ray's io thread: 0.45 ms on the loop, 2026-12-03)
            "ray_call_threads_share": _off_loop(call_thread, call_cpu),
            "chunk_threads_share": _off_loop(small_loop + large_loop - small_launch - large_launch,
                                             small + large - small_launch - large_launch),
            # printed beside ray_call_cpu_ms + put, which the simulation holds the loop for at launch
            "chunk_launch_loop_ms": (small_launch + large_launch) / 2,
            # the CPU a chunk task costs the rest of its node: in its process per character (its
            # encode) and fixed ((de)serialization); in Ray's daemons, a fixed share per task (the
            # lease, the object store's pins), the same at both sizes within the noise
            "task_encode_ms_per_mchar": task_per_mchar,
            "chunk_node_ms": max(0.0, small_task - task_per_mchar / 4),
            "chunk_daemon_ms": (small_daemons + large_daemons) / 2,
            "chunk_task_250k_ms": small_task, "chunk_task_1m_ms": large_task,
            "chunk_daemons_250k_ms": small_daemons, "chunk_daemons_1m_ms": large_daemons}


def orchestrator_costs(local, secs: float, baseline: bool = False, tag: str = "") -> dict:
    """The orchestrator's CPU per session call and per chunk at 2 and 64 workers (ms)."""
    raw = {}
    for w in (2, 64):
        cpu, wall, n = ceil.session_loop(local, w, 1, secs, baseline=baseline)
        raw[f"orch_session_{w}{tag}"] = cpu / n * 1e3
        cpu, wall, n = ceil.chunk_loop(local, w, 1, secs, baseline=baseline)
        raw[f"orch_chunk_{w}{tag}"] = cpu / n * 1e3
    return raw


def with_orchestrator(costs: Costs, raw: dict, tag: str = "") -> Costs:
    """``costs`` with the orchestrator's terms fitted (linear in the workers) from ``raw``."""
    per_worker = max(0.0, (raw[f"orch_session_64{tag}"] - raw[f"orch_session_2{tag}"]) / 62)
    per_worker_chunk = max(0.0, (raw[f"orch_chunk_64{tag}"] - raw[f"orch_chunk_2{tag}"]) / 62)
    return dataclasses.replace(
        costs, orch_session_ms=raw[f"orch_session_2{tag}"] - 2 * per_worker, orch_session_ms_per_worker=per_worker,
        orch_chunk_ms=raw[f"orch_chunk_2{tag}"] - 2 * per_worker_chunk, orch_chunk_ms_per_worker=per_worker_chunk)


def measure_costs(loaded, engine: str, ray=None, quick: bool = False) -> tuple[Costs, dict]:
    local = TokenizerCore(loaded, TokenizerConfig(threads=1, shadow_rate=0.0, engine="reference"))
    secs = 0.4 if quick else 1.0
    raw: dict = {}
    if ray is not None:  # the pool records its paths and times as Ray metrics: part of its cost
        from delta_ray.actors import metrics
        ceil.RECORD = metrics
    raw.update(orchestrator_costs(local, secs))
    if ceil.BASELINE is not None:
        raw.update(orchestrator_costs(local, secs, baseline=True, tag="_base"))
    lt = LoopThread("bench-hop")

    async def noop():
        return None
    raw["handoff_noop_ms"], raw["handoff_wall_ms"] = cpu_per_call(lambda: lt.run(noop()), 3000)
    lt.close()
    # The hand-off as pool.extend makes it: caller threads (4, as the validation's) through the
    # facade's LoopThread to the real orchestrator, less the orchestrator's own share. A no-op's
    # round trip carries no request, answer or wake-up of a busy loop (2026-12-02: 0.09-0.13 ms for the
    # no-op, 0.12-0.16 ms for the hand-off so derived).
    cpu, _, n = ceil.session_threads(local, 2, 4, secs)
    raw["facade_session_ms"] = cpu / n * 1e3
    raw["handoff_ms"] = max(raw["handoff_noop_ms"], raw["facade_session_ms"] - raw["orch_session_2"])
    raw["channel_client_ms"], raw["channel_server_ms"], raw["channel_wall_ms"] = measure_channel(
        800 if quick else 2000)
    # a worker's own handler behind the channel, in its own process beside the caller's (as the pool
    # runs it): its CPU per turn beyond the in-process turn below is the worker's fixed cost per call
    _, raw["worker_server_ms"], _ = measure_channel(800 if quick else 2000, loaded, engine)
    # a worker's turn, in process with one thread, on the engine the pool's workers run
    worker = TokenizerCore(loaded, TokenizerConfig(threads=1, shadow_rate=0.0, engine=engine))
    src = corpus("code", 1_200_000)
    for n in (100_000, 1_000_000):
        worker.encode(src[:n], session=f"t{n}")
        i = [0]

        def turn(n=n):
            worker.extend(f"t{n}", src[n + i[0] * TURN:n + (i[0] + 1) * TURN])
            i[0] += 1
        turn()
        turn_samples, turn_cpu = samples(turn, 40 if quick else 100)
        # a mean, as every other cost: the spread (below) shapes the tail around it
        raw[f"turn_{n}"] = statistics.fmean(turn_cpu)
    text1m = corpus("english", 1_000_000)
    raw["encode_ms_per_mchar"] = median_ms(lambda: worker.run_pieces([text1m]), 3 if quick else 5)
    text3m = corpus("english", 3_000_000)
    planner = TokenizerCore(loaded, TokenizerConfig(threads=1, shadow_rate=0.0, engine=engine))
    raw["plan_ms_per_mchar"] = median_ms(lambda: planner.plan(text3m, 16), 3) / 3
    pieces = [np.arange(260_000 // 16, dtype=np.int32)] * 16

    def assemble():
        to_arrow(planner.finish(concat_ids(pieces), True))
    raw["assemble_ms_per_mchar"] = median_ms(assemble, 9)
    if ray is not None:
        raw.update(measure_ray(ray, loaded, engine))
    else:  # NOTES.md, 2026-11-30: an actor call ~0.6 ms, a task ~1.1 ms, a 1M-character argument ~4 ms;
        # the pool's chunk task as measure_ray found it on 2026-12-02/03 (driver 3.2-3.7 ms beyond
        # the launch; its process 0.7-3 ms fixed and 6.4-8.5 ms per million characters; Ray's
        # daemons 3.1-4.1 ms)
        raw.update({"ray_call_cpu_ms": 0.25, "ray_call_wall_ms": 0.6, "task_launch_cpu_ms": 0.3,
                    "task_wall_ms": 1.1, "put_ms_per_mchar": 4.0, "chunk_ms": 3.5, "chunk_node_ms": 1.5,
                    "task_encode_ms_per_mchar": 7.5, "chunk_daemon_ms": 3.3,
                    "ray_call_threads_share": 0.46, "chunk_threads_share": 0.9})
    costs = Costs(
        handoff_ms=raw["handoff_ms"],
        channel_client_ms=raw["channel_client_ms"],
        ray_call_ms=raw["ray_call_cpu_ms"],
        put_ms_per_mchar=raw["put_ms_per_mchar"], chunk_ms=raw.get("chunk_ms", 0.0),
        ray_call_threads_share=raw.get("ray_call_threads_share", 0.0),
        chunk_threads_share=raw.get("chunk_threads_share", 0.0),
        chunk_node_ms=raw.get("chunk_node_ms", 0.0), chunk_daemon_ms=raw.get("chunk_daemon_ms", 0.0),
        plan_ms_per_mchar=raw["plan_ms_per_mchar"], assemble_ms_per_mchar=raw["assemble_ms_per_mchar"],
        channel_rtt_ms=max(0.0, raw["channel_wall_ms"] - raw["channel_client_ms"] - raw["channel_server_ms"]),
        ray_rtt_ms=max(0.0, raw["task_wall_ms"] - raw["task_launch_cpu_ms"]),
        worker_call_ms=max(raw["channel_server_ms"], raw["worker_server_ms"] - raw["turn_100000"]),
        turn_ms_100k=raw["turn_100000"], turn_ms_1m=raw["turn_1000000"],
        # a chunk's encode as the task's process runs it, when measured (in process otherwise)
        encode_ms_per_mchar=raw.get("task_encode_ms_per_mchar", raw["encode_ms_per_mchar"]),
        # The worker turn's measured variation (1M context, the last measured), for the turn's step:
        # of its CPU time, not its wall time. The simulation shares the cores itself; a wall-time
        # spread also carries the time other jobs on this machine took from the call, which would
        # be counted again as work (P99 49x the median in wall time at load 1-2, 2026-12-02).
        spread=spread_of(turn_cpu))
    raw["turn_p99_over_median"] = float(np.percentile(turn_samples, 99)) / statistics.median(turn_samples)
    raw["turn_cpu_p99_over_median"] = float(np.percentile(turn_cpu, 99)) / statistics.median(turn_cpu)
    return with_orchestrator(costs, raw), raw
