"""The pool at 16-256 cores on 1-16 nodes: a simulation driven by the real scheduler, checked here.

This machine has 2 cores, so a pool on 64 cores cannot be measured here. This bench instead

1. measures the service times of every step a request takes on this machine (the orchestrator's
   CPU per session call and per chunk dispatch over a transport that answers at once, and its
   growth with the number of workers it routes over; the hand-off to the pool's loop; a side-channel
   round trip to a worker process; a Ray actor call, a task launch and an object put; a worker's
   1.3K turn at 100K and 1M characters of context; a chunk's encode per character; planning and
   assembly), all in this one run;
2. validates the simulation (``scheduler/simulation.py``: the real dispatcher, policies and
   rendezvous routing on a fake clock, with those service times) against the real
   ``TokenizerPool`` on local Ray with 1 and 2 workers (closed loops of session turns and of
   stateless 1M-character texts, each in rounds): measured and predicted throughput and P99 side by
   side, predicted both from the costs above and from each request's CPU per process as lone
   requests measured it seconds before each round (the machine's speed drifts in between; a lone
   turn's CPU beyond the costs' sum charged per wake of a sleeping loop or worker), with the
   stalls those lone requests showed; a round is rerun while the VM's steal exceeds 2.5% of its cores
   (:data:`STEAL_LIMIT`);
3. runs the simulation at 16, 64 and 256 cores on 1, 4 and 16 nodes for chat sessions (100K-1M
   characters of context, +1.3K a turn, Poisson arrivals), long stateless texts (1-3M characters)
   and a mixed load (1% of requests are long texts), and prints each throughput curve and the first
   component to saturate.

    .venv/bin/python bench/bench_scaleout.py [--engine fast] [--quick] [--no-ray] [--keep-cores-awake]

The network between nodes cannot be measured on one machine: 10 Gbit/s per node and direction is
assumed (``Costs.net_mb_per_ms``), and a cross-node call costs what a Ray actor call costs here.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import multiprocessing as mp
import os
import statistics
import struct
import sys
import threading
import time
from typing import NamedTuple

os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402

import bench_ceilings as ceil  # noqa: E402
from delta_ray.actors.loop_thread import LoopThread  # noqa: E402
from delta_ray.core.assembly import concat_ids, to_arrow  # noqa: E402
from delta_ray.apps.bundled import bundled_tokenizer_path  # noqa: E402
from delta_ray.core.config import TokenizerConfig  # noqa: E402
from delta_ray.core.heap import freeze_heap  # noqa: E402
from delta_ray.core.loading import load_tokenizer  # noqa: E402
from delta_ray.apps.sample_text import corpus  # noqa: E402
from delta_ray.scheduler.sim_costs import excess  # noqa: E402
from delta_ray.scheduler.simulation import (Cluster, Costs, Simulation, spread_of, stalls_of,  # noqa: E402
                                            sweep)
from delta_ray.tokenizer_core import TokenizerCore  # noqa: E402

TURN = 1300


def _samples(fn, repeats: int) -> tuple[list[float], list[float]]:
    """Each call's wall time and this process's CPU time (all threads: the engine's pool too), in ms."""
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return wall, cpu


def _median(fn, repeats: int) -> float:
    return statistics.median(_samples(fn, repeats)[0])


def _cpu_per_call(fn, n: int) -> tuple[float, float]:
    """(process CPU ms per call, wall ms per call) of ``n`` calls."""
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.process_time() - c0) / n * 1e3, (time.perf_counter() - t0) / n * 1e3


# -- 1. service times -------------------------------------------------------------------------------
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
    call_cpu, _ = _cpu_per_call(lambda: ray.get(a.extend.remote("s", text, 7, 7)), n)
    call_thread = (time.thread_time() - th0) / n * 1e3  # the calling thread's part: the rest ran on Ray's
    call_wall = _median(lambda: ray.get(a.extend.remote("s", text, 7, 7)), n)  # medians: robust to load
    c0, t0 = time.process_time(), time.perf_counter()
    refs = [task.remote(0) for _ in range(n)]
    launch_cpu = (time.process_time() - c0) / n * 1e3
    ray.get(refs)
    task_wall = _median(lambda: ray.get(task.remote(0)), n // 2)

    # A chunk task's configuration side by side: resolved into the task as an argument (before
    # 2026-12-03) and boxed, fetched only on a cache miss (now): the node's CPU per task, in rounds.
    config_ref = ray.put(loaded.config_bytes)

    @ray.remote(num_cpus=0)
    def takes(config, piece):
        return len(piece)
    piece = "x" * 250_000
    ray.get([takes.remote((config_ref,), piece) for _ in range(4)])

    def node_ms(arg, k: int = 40) -> float:
        meter = _CpuMeter()
        for _ in range(k):
            ray.get(takes.remote(arg, piece))
        return meter.read()[1] / k
    resolved, boxed = ([statistics.median(xs) for xs in zip(*((node_ms(config_ref), node_ms((config_ref,)))
                                                             for _ in range(5)))])

    # The pool's own chunk task (its launcher and options, the tokenizer's configuration by
    # reference, the fast engine in the task's process), fed real text, where a stand-in task
    # returning zeros used to stand for it (2026-12-02).
    from delta_ray.actors.calls import ENCODE_PIECES, Call, PiecesArgs
    from delta_ray.actors.chunk_task import ChunkLauncher
    from delta_ray.core.config import pool_config
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
        meter, th0, launching[0] = _CpuMeter(split=True), time.thread_time(), 0.0
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
    meter = _CpuMeter(split=True)
    time.sleep(2.0)
    _, *idle = meter.read_split()
    idle_ms_per_s = tuple(ms / 2.0 for ms in idle)
    (small, small_launch, small_loop, small_task, small_daemons), (large, large_launch, large_loop, large_task,
                                                                     large_daemons) = (
        [statistics.median(xs) for xs in zip(*(per_chunk(m, 2.0, idle_ms_per_s) for _ in range(3)))] for m in (250_000, 1_000_000))
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
    raw["handoff_noop_ms"], raw["handoff_wall_ms"] = _cpu_per_call(lambda: lt.run(noop()), 3000)
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
        turn_samples, turn_cpu = _samples(turn, 40 if quick else 100)
        # a mean, as every other cost: the spread (below) shapes the tail around it
        raw[f"turn_{n}"] = statistics.fmean(turn_cpu)
    text1m = corpus("english", 1_000_000)
    raw["encode_ms_per_mchar"] = _median(lambda: worker.run_pieces([text1m]), 3 if quick else 5)
    text3m = corpus("english", 3_000_000)
    planner = TokenizerCore(loaded, TokenizerConfig(threads=1, shadow_rate=0.0, engine=engine))
    raw["plan_ms_per_mchar"] = _median(lambda: planner.plan(text3m, 16), 3) / 3
    pieces = [np.arange(260_000 // 16, dtype=np.int32)] * 16

    def assemble():
        to_arrow(planner.finish(concat_ids(pieces), True))
    raw["assemble_ms_per_mchar"] = _median(assemble, 9)
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


# -- 2. validation against the real pool ---------------------------------------------------------------
def _proc_stat(pid) -> tuple[str, float]:
    """Process ``pid``'s name (its first 15 bytes) and CPU time (user + system) so far, in ms
    (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        head, tail = f.read().rsplit(")", 1)
    fields = tail.split()
    return head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf("SC_CLK_TCK")


def _proc_cpu_ms(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` so far, in ms."""
    return _proc_stat(pid)[1]


def _cpu_ticks() -> list[int]:
    """This machine's CPU time so far by state, all cores, in clock ticks (Linux /proc/stat: user,
    nice, system, idle, iowait, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        return ([int(x) for x in f.readline().split()[1:9]] + [0] * 8)[:8]


def _machine_busy_ms() -> float:
    """CPU time every process on this machine has used so far (all cores), in ms: idle, iowait and
    steal aside (time this VM's cores were runnable but the host did not run them: no process here
    ran then)."""
    user, nice, system, _, _, irq, softirq, _ = _cpu_ticks()
    return (user + nice + system + irq + softirq) * 1e3 / os.sysconf("SC_CLK_TCK")


def _stolen_ms() -> float:
    """Steal so far (all cores), in ms: the time this VM's cores were runnable but the host ran
    something else, mostly here a halted core's wait to run again once woken (:func:`_cores_kept_awake`).
    It came and went for minutes at a time with the host's load, up to 40% of both cores, and a closed
    loop's P99 rose with it (2 callers' texts: 56-65 ms at 1-5%, 89-133 ms at 16-28%, 2026-12-03)."""
    return _cpu_ticks()[7] * 1e3 / os.sysconf("SC_CLK_TCK")


# Processes by their names (Linux keeps a name's first 15 bytes in /proc/<pid>/stat): a chunk task's
# process names itself by the task it runs, and ray::IDLE between tasks; Ray's daemons that work per
# task (the raylet, which holds the object store, and the GCS). The node agent is left with the
# other jobs: its work does not follow the tasks (its metrics collection, which took a core for a
# second every ten under load, is off in a local Ray delta-ray starts: actors/local_ray.py).
TASK_PROCESSES = ("ray::IDLE", "ray::encode_chu", "ray::encode_who")
DAEMONS = ("raylet", "gcs_server")


def cpu_by_process(names) -> dict[int, tuple[str, float]]:
    """Every process on this machine named one of ``names``: pid -> (its name, CPU so far in ms)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            name, ms = _proc_stat(pid)
        except OSError:  # it ended meanwhile
            continue
        if name in names:
            out[int(pid)] = (name, ms)
    return out


class _CpuMeter:
    """CPU since it was made, in ms: this process's (every thread) and the rest of the machine's,
    less ``idle_ms_per_s`` of the latter for each second elapsed; with ``split``, the rest as the
    chunk tasks' processes', Ray's daemons' and the remainder's (other jobs)."""

    def __init__(self, split: bool = False):
        self.p0 = cpu_by_process(TASK_PROCESSES + DAEMONS) if split else {}
        self.c0, self.m0, self.t0 = time.process_time(), _machine_busy_ms(), time.perf_counter()

    def read(self, idle_ms_per_s: float = 0.0) -> tuple[float, float]:
        mine = (time.process_time() - self.c0) * 1e3
        return mine, _machine_busy_ms() - self.m0 - mine - idle_ms_per_s * (time.perf_counter() - self.t0)

    def read_split(self, idle_ms_per_s: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> tuple[float, ...]:
        """(this process's, the chunk tasks' processes', Ray's daemons', the rest's) CPU in ms, each
        of the last three less its ``idle_ms_per_s`` for each second elapsed. Per process: Ray ends
        idle task processes beyond its pool's size, and a sum over the living lost the seconds of
        CPU each had spent (its tokenizer's load), a chunk's process then 18 ms at 1M against 9.5
        through the pool (2026-12-03)."""
        secs = time.perf_counter() - self.t0
        mine, rest = self.read()
        by_kind = [0.0, 0.0]  # tasks, daemons
        for pid, (name, ms) in cpu_by_process(TASK_PROCESSES + DAEMONS).items():
            by_kind[name in DAEMONS] += ms - self.p0.get(pid, (name, 0.0))[1]
        tasks, daemons = by_kind
        return (mine, *(ms - idle * secs for ms, idle in zip((tasks, daemons, rest - tasks - daemons), idle_ms_per_s)))


class Loop(NamedTuple):
    """A closed loop's outcome, measured or simulated: requests/s, P99 ms, the driver's and the
    workers' CPU ms per request, a range of P99s (measured: its rounds' or its halves', its own
    repeatability; simulated: the lowest and highest over seeds), its requests' latencies, and its
    chunks' (wait for a slot, round trip) in ms, as the pool's CallRunner records them."""
    rate: float
    p99: float
    driver_cpu: float
    workers_cpu: float
    p99_range: tuple[float, float]
    latencies: tuple[float, ...] = ()
    chunks: tuple[tuple[float, float], ...] = ()


def _pooled(rounds: list[Loop]) -> Loop:
    """Rounds of one closed loop as one: their requests together (the rate over their summed time,
    the P99 over all their latencies, CPU per request weighted by their counts); its range, the
    rounds' lowest and highest P99."""
    lat = [ms for r in rounds for ms in r.latencies]
    n, wall = len(lat), sum(len(r.latencies) / r.rate for r in rounds)

    def per_request(field: str) -> float:
        return sum(getattr(r, field) * len(r.latencies) for r in rounds) / n
    p99s = [r.p99 for r in rounds]
    return Loop(n / wall, float(np.percentile(lat, 99)), per_request("driver_cpu"), per_request("workers_cpu"),
                (min(p99s), max(p99s)), tuple(lat), tuple(c for r in rounds for c in r.chunks))


def _closed_loop(callers: int, seconds: float, fn, pids=()) -> Loop:
    """``callers`` threads each calling ``fn(i)`` back to back; the workers' CPU is ``pids``', or
    with ``pids=None`` every other process's on this machine (chunk tasks, Ray's daemons, others)."""
    lat: list[list[tuple[float, float]]] = [[] for _ in range(callers)]
    stop = threading.Event()
    barrier = threading.Barrier(callers + 1)

    def run(i):
        barrier.wait()
        while not stop.is_set():
            t0 = time.perf_counter()
            fn(i)
            lat[i].append((t0, (time.perf_counter() - t0) * 1e3))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(callers)]
    for t in threads:
        t.start()
    def theirs() -> float:
        return _machine_busy_ms() - time.process_time() * 1e3 if pids is None else sum(map(_proc_cpu_ms, pids))
    c0, w0 = time.process_time(), theirs()
    barrier.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    calls = [x for ys in lat for x in ys]
    n = len(calls)
    cpu = (time.process_time() - c0) * 1e3 / n
    others = (theirs() - w0) / n if pids is None or pids else float("nan")
    halves = [[ms for start, ms in calls if (start < t0 + seconds / 2) == first] for first in (True, False)]
    return Loop(n / wall, float(np.percentile([ms for _, ms in calls], 99)), cpu, others,
                tuple(float(np.percentile(h, 99)) for h in halves), tuple(ms for _, ms in calls))


@contextlib.contextmanager
def _round_trips(kind: str = "session", waits: list[float] | None = None):
    """The round trips (ms, dispatch to answer) of the pool's ``kind`` tasks meanwhile, in order, as
    its CallRunner records them for Ray's metrics: a lone turn's time inside and outside its worker;
    their waits for a slot (submit to dispatch) into ``waits`` too, when given."""
    from delta_ray.actors import metrics
    out: list[float] = []
    record = metrics.record_times

    def recorded(k: str, wait_ms: float, service_ms: float) -> None:
        if k == kind:
            out.append(service_ms)
            if waits is not None:
                waits.append(wait_ms)
        record(k, wait_ms, service_ms)
    metrics.record_times = recorded
    try:
        yield out
    finally:
        metrics.record_times = record


def _lone_calls(fn, seconds: float, trips: tuple[float, ...] | list[float] = ()) -> tuple[list[float], ...]:
    """Milliseconds of each ``fn()`` called back to back by one thread for ``seconds``, the longest of
    the round trips :func:`_round_trips` recorded into ``trips`` during each (a text's chunks run side
    by side: its longest chunk is the part of it spent away from the caller), and the others' mean."""
    out, longest, rest, end = [], [], [], time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < end:
        n = len(trips)
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
        mine = sorted(trips[n:])
        longest.append(mine[-1] if mine else 0.0)
        rest.append(statistics.fmean(mine[:-1]) if len(mine) > 1 else 0.0)
    return out, longest, rest


# a validation round is rerun while the host takes more than this share of the machine's cores
# (steal) during it, at most STEAL_TRIES times, and the run with the least steal is kept: the
# simulation has no host, and steal slows every process here at once, in bursts of up to a whole
# core for 100 ms. Fed to the simulation as other jobs' slices, a round's steal made its texts' rate
# 22% short and left its turns' 14-45% long (one run). Quiet rounds here saw 0-2% (2026-12-03).
STEAL_LIMIT = 0.025
STEAL_TRIES = 3


def _least_stolen(run, tries: int = STEAL_TRIES) -> tuple[object, float, int]:
    """``run()``'s outcome with the least steal, that steal in ms per second, and the times it ran:
    rerun while the steal during it was over :data:`STEAL_LIMIT` of the machine's cores."""
    best: tuple[object, float] | None = None
    for ran in range(1, tries + 1):
        out, steal = _timed_steal(run)
        if best is None or steal < best[1]:
            best = (out, steal)
        if steal <= STEAL_LIMIT * 1e3 * (os.cpu_count() or 1):
            break
    return best[0], best[1], ran


def _timed_steal(fn) -> tuple[object, float]:
    """``fn()``'s outcome and the steal meanwhile, in ms per second."""
    s0, t0 = _stolen_ms(), time.perf_counter()
    out = fn()
    return out, (_stolen_ms() - s0) / (time.perf_counter() - t0)


@contextlib.contextmanager
def _cores_kept_awake():
    """Hold a CPU latency request of 0 us (Linux PM QoS, ``/dev/cpu_dma_latency``, as pyperf's
    ``system tune`` and tuned's latency-performance profile do) while open: idle cores then poll
    instead of halting. Yields whether it is held (the file needs root).

    On this VM (cpuidle driver haltpoll, ``guest_halt_poll_ns`` 0) a halted vCPU that another
    thread wakes waits for the host to run it again, and the host counts that wait as steal. Four
    callers' session turns on 2 workers alternated plain and held, 6 s rounds: 1,128-1,533 turns/s
    with 280-686 ms/s of steal, against 2,196-2,357 with 35-70 (2026-12-03). Not the default: the
    simulation's wake-up costs are fitted to halting cores, and users' machines halt; held, its
    1-worker turns ran 26% short in the one run tried (design §13)."""
    try:
        f = open("/dev/cpu_dma_latency", "wb", buffering=0)
    except OSError:
        yield False
        return
    with f:
        f.write(struct.pack("i", 0))
        yield True


SEEDS = 3  # simulated runs per closed loop: its P99 is their median, its throughput their mean


def _simulate(cl: Cluster, costs: Costs | list[Costs], load, kind: str, ms: float, warmup_ms: float) -> Loop:
    """The simulation of one closed loop (``load(sim)`` adds its callers) over ``SEEDS`` seeds; with
    a list of costs, one round of ``ms`` on each (each round's measured demand and stalls), pooled."""
    runs = []
    for seed in range(SEEDS):
        rounds = []
        for c in costs if isinstance(costs, list) else [costs]:
            sim = Simulation(cl, c, seed=seed)
            load(sim)
            res = sim.run(warmup_ms + ms, warmup_ms)
            n = res.completed[kind]
            # the driver's CPU: its loop's steps (its stalls hold the loop but no core) and Ray's threads
            driver = sim.gil[0].busy_ms() - sim.stalled_ms + sim.driver_threads_ms
            if kind == "turn":  # the encodes' CPU: the locks are held longer (a core's wait, a trip stall)
                workers = sim.worker_cpu_ms / n
            else:  # the cores' work beyond the driver's and the other jobs' slices: chunk tasks
                workers = (sum(r.busy_ms() for r in sim.cpu) - driver - c.node_background_ms_per_s * ms / 1e3) / n
            rounds.append(Loop(res.throughput(kind), res.percentile(kind, 99), driver / n, workers, (0.0, 0.0),
                               tuple(res.latencies[kind]), tuple(sim.chunk_times)))
        runs.append(_pooled(rounds))
    p99s = sorted(r.p99 for r in runs)
    return Loop(statistics.fmean(r.rate for r in runs), statistics.median(p99s),
                statistics.fmean(r.driver_cpu for r in runs), statistics.fmean(r.workers_cpu for r in runs),
                (p99s[0], p99s[-1]), chunks=tuple(c for r in runs for c in r.chunks))


def _lone_demand(costs: Costs, k: int, one_turn, one_text, turn_cpu, text_cpu) -> Costs:
    """``costs`` with each request's CPU per process set to a lone request's, measured: a turn's
    (worker, driver) and a text's of ``k`` chunks (driver, chunk tasks' processes, Ray's daemons).
    ``one_turn(costs)`` and ``one_text(costs)`` simulate one caller: its turn's :class:`Loop` with the
    turn's wakes of an idle loop and worker, and its text's :class:`Loop`. A lone turn's CPU beyond
    the costs' sum is waking its sleeping threads (``Costs.loop_wake_ms``, ``worker_wake_ms``:
    charged per wake, so a loaded turn that finds them busy does not pay it), a shortfall comes off
    the fixed term per call; a text's difference goes to its fixed term per chunk, the daemons'
    share beside the text's path, the rest on it."""
    turn, (loop_wakes, worker_wakes) = one_turn(costs)
    driver, worker = turn_cpu[1] - turn.driver_cpu, turn_cpu[0] - turn.workers_cpu
    costs = dataclasses.replace(
        costs, loop_wake_ms=max(0.0, driver) / max(1e-9, loop_wakes),
        worker_wake_ms=max(0.0, worker) / max(1e-9, worker_wakes),
        handoff_ms=max(0.0, costs.handoff_ms + min(0.0, driver)),
        worker_call_ms=max(0.0, costs.worker_call_ms + min(0.0, worker)))
    text = one_text(costs)  # the text's steps wake the loop too
    daemons = k * costs.chunk_daemon_ms
    return dataclasses.replace(
        costs, chunk_ms=max(0.0, costs.chunk_ms + (text_cpu[0] - text.driver_cpu) / k),
        chunk_node_ms=max(0.0, costs.chunk_node_ms + (text_cpu[1] - (text.workers_cpu - daemons)) / k),
        chunk_daemon_ms=max(0.0, text_cpu[2] / k))


def validate(path: str, costs: Costs, engine: str, quick: bool) -> list[tuple]:
    """The real pool's closed loops and the simulation's, side by side, on 1 and 2 workers. Each
    loop runs in rounds, and each round's rare stalls come from lone requests timed just before it,
    every sample kept (a P99 of four callers sits in a lone call's top 0.25%); the rounds pooled
    hold a few dozen of them (6 s runs moved 3.4-6.4 ms between rounds, 2026-12-02)."""
    from tokenizers import Tokenizer

    from delta_ray import TokenizerPool
    reference = Tokenizer.from_file(path)

    def check(got, text: str, add_special_tokens: bool = True) -> None:
        want = reference.encode(text, add_special_tokens=add_special_tokens).ids
        assert np.array_equal(got.to_numpy(), np.asarray(want, np.int32)), "pool differs from the reference"

    def sessions(n: int):
        def load(sim: Simulation) -> None:
            sim.add_sessions(n, (100_000, 100_000), keys=[f"v{i}" for i in range(n)])  # the pool's callers' keys
            sim.closed_turns(n)
        return load

    def texts(n: int):
        return lambda sim: sim.closed_texts(n, 1_000_000)
    rows = []
    src = corpus("code", 3_000_000)
    text1m = corpus("english", 1_000_000)
    secs, lone_secs = (4.0, 2.0) if quick else (12.0, 6.0)
    # a 1M text takes 30x a turn: its loops run twice as long, and still hold about 1,400 texts
    # (a P99 of 700 is their 7th slowest: one 12 s run's halves measured 46 and 72 ms, 2026-12-02)
    text_secs = 2 * secs
    # each loop runs in rounds, each after its own lone requests: the machine's speed drifts 15-20%
    # within minutes, and a loop measured a minute after its lone requests met another machine
    rounds = 2 if quick else 3
    callers = 4
    backgrounds: list[float] = []
    others: list[float] = []
    lone_p99: list[str] = []
    demand: list[str] = []
    for w in (1, 2):
        # the sessions grow by tens of millions of characters over the loops: the store's default
        # cap (128 MB a worker) evicted one midway in a probe, ending its caller with SessionNotFound
        with TokenizerPool(path, num_workers=w, max_inflight_tasks=w, placement=False, engine=engine,
                           shadow_rate=0.0, request_timeout_s=120, max_session_bytes=1 << 31) as pool:
            # what this process spends per second with the pool open and idle (Ray's own threads),
            # and what everything else on the machine does meanwhile (Ray's daemons, other jobs)
            meter = _CpuMeter(split=True)
            time.sleep(3.0)
            background, *idle = (ms / 3.0 for ms in meter.read_split())
            others.append(max(0.0, sum(idle)))
            for i in range(callers):
                pool.encode(src[:100_000], session=f"v{i}")
            pos = [i * 400_000 for i in range(callers)]
            sent: list[str] = [src[:100_000]]  # session v0's text as it arrived
            span = len(src) - 100_000 - TURN

            def turn(i):  # +TURN characters from the corpus after the first 100K, wrapping round
                p = pos[i]  # (a caller that ran off its end would send empty appends)
                delta = src[100_000 + p % span:100_000 + p % span + TURN]
                pool.extend(f"v{i}", delta)
                if i == 0:
                    sent.append(delta)
                pos[i] = p + TURN
            turn(0)
            # as a process that calls a pool should once set up (README): its full garbage
            # collections then skip Ray's and the pool's objects (60-125 ms of the GIL each here)
            freeze_heap()
            pids = [s["pid"] for s in pool.worker_stats().values()]

            def turn_round():  # (lone turns' ms, their round trips' ms, their CPU demand, the loop, its steal)
                w0, c0 = sum(map(_proc_cpu_ms, pids)), time.process_time()
                with _round_trips() as recorded:  # the simulation's turn stalls come from these
                    lone, trips, _ = _lone_calls(lambda: turn(0), lone_secs / rounds, recorded)
                # ... and a lone turn's CPU demand: its worker's, the driver's (Ray's threads included)
                turn_cpu = ((sum(map(_proc_cpu_ms, pids)) - w0) / len(lone), (time.process_time() - c0) * 1e3 / len(lone))
                return (lone, trips, turn_cpu, *_timed_steal(lambda: _closed_loop(callers, secs / rounds, turn, pids)))
            turn_rounds = [_least_stolen(turn_round) for _ in range(rounds)]
            turn_rounds, turn_ran = [r[0] for r in turn_rounds], [r[2] for r in turn_rounds]
            check(pool.extend("v0", ""), "".join(sent))
            encode_text = lambda: pool.encode(text1m, add_special_tokens=False)  # noqa: E731
            check(encode_text(), text1m, add_special_tokens=False)

            def text_round():  # (lone texts' ms, their longest chunks' round trips, their CPU demand,
                # the loop, their other chunks' mean round trips, the loop's steal)
                meter = _CpuMeter(split=True)
                with _round_trips("chunk") as recorded:  # ... and the texts' stalls from these
                    lone_text, text_trips, text_rest = _lone_calls(encode_text, text_secs / 2 / rounds, recorded)
                # ... and a lone text's CPU demand: the driver's, the chunk tasks' processes', Ray's
                # daemons', the rest of the machine's, each beyond its share with the pool idle
                text_cpu = [ms / len(lone_text) for ms in meter.read_split(tuple(idle))]
                waits: list[float] = []
                with _round_trips("chunk", waits) as loaded_trips:  # where a loaded text's time goes
                    m, steal = _timed_steal(lambda: _closed_loop(2, text_secs / rounds, lambda i: encode_text(), pids=None))
                m = m._replace(chunks=tuple(zip(waits, loaded_trips)))
                # the rest of the machine per text, less what it does with the pool idle (as simulated)
                return (lone_text, text_trips, text_cpu, m._replace(workers_cpu=m.workers_cpu - others[-1] / m.rate),
                        text_rest, steal)
            text_rounds = [_least_stolen(text_round) for _ in range(rounds)]
            text_rounds, text_ran = [r[0] for r in text_rounds], [r[2] for r in text_rounds]
            check(encode_text(), text1m, add_special_tokens=False)
        costs = dataclasses.replace(costs, driver_background_ms_per_s=background, node_background_ms_per_s=others[-1])
        cl = Cluster(nodes=1, cores_per_node=2, workers=w, task_slots=w)
        # the costs' sum for one caller (stalls aside) against a lone request's measured mean
        k = Simulation(cl, costs).chunk_count(1_000_000)  # chunks of a 1M text

        def sim_turn(c: Costs):  # one caller's simulated turn, and its wakes of the loop and its worker
            sim = Simulation(cl, c)
            sessions(1)(sim)
            n = sim.run(2_500, 500).completed["turn"]
            return _simulate(cl, c, sessions(1), "turn", 2_000, 500), (sim.wakes["loop"] / n, sim.wakes["worker"] / n)

        def sim_text(c: Costs):  # one caller's simulated text
            return _simulate(cl, c, texts(1), "text", 4_000, 500)
        (one_turn, wakes), one_text = sim_turn(costs), sim_text(costs)
        # each round's stalls from its own lone requests, and (second rows) its CPU demand from them
        # too, where the costs above were measured minutes before
        each = [dataclasses.replace(costs, **dict(zip(("loop_stall", "trip_stall"), stalls_of(lone, trips))),
                                    **dict(zip(("text_loop_stall", "text_stall"), stalls_of(lone_text, text_trips))),
                                    text_stall_rest=excess(rest))
                for (lone, trips, *_), (lone_text, text_trips, _, _, rest, _) in zip(turn_rounds, text_rounds)]
        each_lone = [_lone_demand(c, k, sim_turn, sim_text, t[2], x[2]) for c, t, x in zip(each, turn_rounds, text_rounds)]
        m_turn, m_text = _pooled([t[3] for t in turn_rounds]), _pooled([x[3] for x in text_rounds])
        turn_steal, text_steal = [t[4] for t in turn_rounds], [x[5] for x in text_rounds]

        def note(steal: list[float], ran: list[int]) -> str:
            return f"steal {', '.join(f'{ms:.0f}' for ms in steal)} ms/s, {sum(ran) - len(ran)} rerun"
        turn_note, text_note = note(turn_steal, turn_ran), note(text_steal, text_ran)
        rows.append((w, "session turns, 4 callers", m_turn,
                     _simulate(cl, each, sessions(callers), "turn", secs / rounds * 1e3, 1_000), turn_note))
        rows.append((w, "  ... lone turns' demand", m_turn,
                     _simulate(cl, each_lone, sessions(callers), "turn", secs / rounds * 1e3, 1_000), turn_note))
        rows.append((w, "stateless 1M, 2 callers", m_text,
                     _simulate(cl, each, texts(2), "text", text_secs / rounds * 1e3, 2_000), text_note))
        rows.append((w, "  ... lone texts' demand", m_text,
                     _simulate(cl, each_lone, texts(2), "text", text_secs / rounds * 1e3, 2_000), text_note))
        # what the rounds' lone requests showed, together
        lone = [ms for t in turn_rounds for ms in t[0]]
        lone_text = [ms for x in text_rounds for ms in x[0]]
        turn_cpu = [statistics.fmean(t[2][i] for t in turn_rounds) for i in range(2)]
        text_cpu = [statistics.fmean(x[2][i] for x in text_rounds) for i in range(4)]
        loop_part, trip_part, text_part, chunk_part = (sum(sum(getattr(c, f)) for c in each) for f in (
            "loop_stall", "trip_stall", "text_loop_stall", "text_stall"))
        daemons = k * costs.chunk_daemon_ms
        mean_lone = _lone_demand(costs, k, sim_turn, sim_text, turn_cpu, text_cpu)
        demand += [f"{w} worker(s): a turn's worker {turn_cpu[0]:.3f} ms (simulated {one_turn.workers_cpu:.3f}), "
                   f"driver {turn_cpu[1]:.3f} ({one_turn.driver_cpu:.3f}); a 1M text's driver {text_cpu[0]:.2f} "
                   f"({one_text.driver_cpu:.2f}), chunk tasks' processes {text_cpu[1]:.2f} "
                   f"({one_text.workers_cpu - daemons:.2f}), Ray's daemons {text_cpu[2]:.2f} ({daemons:.2f}), "
                   f"other processes {text_cpu[3]:.2f} (0); a lone turn wakes the loop {wakes[0]:.1f} times "
                   f"and its worker {wakes[1]:.1f}, the wakes charged {mean_lone.loop_wake_ms:.3f} and "
                   f"{mean_lone.worker_wake_ms:.3f} ms"]
        lone_p99 += [f"{w} worker(s): a turn {statistics.fmean(lone):.2f} ms mean (costs' sum {1e3 / one_turn.rate:.2f}; "
                     f"with the lone turns' demand {1e3 / _simulate(cl, mean_lone, sessions(1), 'turn', 2_000, 500).rate:.2f}), "
                     f"{np.percentile(lone, 99):.2f} P99, {trip_part / max(1e-9, loop_part + trip_part):.0%} of its excess "
                     f"in the round trip; a 1M text {statistics.fmean(lone_text):.1f} ms mean (costs' sum "
                     f"{1e3 / one_text.rate:.1f}; with the lone texts' demand "
                     f"{1e3 / _simulate(cl, mean_lone, texts(1), 'text', 4_000, 500).rate:.1f}), "
                     f"{np.percentile(lone_text, 99):.1f} P99, {chunk_part / max(1e-9, text_part + chunk_part):.0%} "
                     f"of its excess in its longest chunk's round trip"]
        backgrounds.append(background)
    global BACKGROUND
    BACKGROUND = backgrounds[-1]
    print(f"lone requests (1 caller), timed before each of the loop's {rounds} rounds: " + "; ".join(lone_p99)
          + ". Their excess over their mean is simulated as stalls of the caller's loop "
          "(Costs.loop_stall, Costs.text_loop_stall), but a turn's excess inside its round trip holds its worker "
          "(Costs.trip_stall) and a text's inside its longest chunk's round trip that chunk's slot (Costs.text_stall), "
          "its other chunks' (their mean round trip's excess) each of theirs (Costs.text_stall_rest). "
          "Each round is simulated with its own")
    print("lone requests' CPU demand in ms (each process's, measured; the simulated in brackets): " + "; ".join(demand))
    print(f"a driver with an idle pool spends {', '.join(f'{b:.0f}' for b in backgrounds)} ms of CPU per second "
          "(Ray's threads; simulated as background work of its loop); the rest of the machine meanwhile "
          f"{', '.join(f'{o:.0f}' for o in others)} ms per second (Ray's daemons and other jobs; simulated as "
          "slices of the node's cores)")
    print(f"each round (its lone requests and its loop) was rerun while the host took over {STEAL_LIMIT:.1%} of "
          f"the cores (steal), at most {STEAL_TRIES} times, the run with the least kept (the rows' last column: "
          "each kept loop's steal, not simulated)")
    return rows


BACKGROUND = 0.0  # ms of CPU per second a driver with an idle pool spends, once validate() measured it


# -- 3. the grid ---------------------------------------------------------------------------------------
GRID = [(16, 1), (16, 4), (16, 16), (64, 1), (64, 4), (64, 16), (256, 1), (256, 4), (256, 16)]


def workload(kind: str, cores: int):
    def chat(sim: Simulation, rate: float, until: float) -> None:
        sim.add_sessions(max(256, 8 * cores))
        sim.chat(rate, until)

    def texts(sim: Simulation, rate: float, until: float) -> None:
        sim.stateless(rate, until)

    def mixed(sim: Simulation, rate: float, until: float) -> None:
        sim.add_sessions(max(256, 8 * cores))
        sim.chat(rate * 0.99, until)
        sim.stateless(rate * 0.01, until)
    return {"chat": chat, "stateless": texts, "mixed": mixed}[kind]


RATES = {"chat": [500, 1000, 2000, 4000, 8000, 16000, 32000],
         "stateless": [5, 10, 20, 40, 80, 160, 320],
         "mixed": [250, 500, 1000, 2000, 4000, 8000]}


def grid(costs: Costs, drivers: int, quick: bool, kinds=("chat", "stateless", "mixed")) -> dict:
    """Each workload on each cluster: offered rates double until the pool falls behind twice; the
    first component to saturate is the busiest one at the highest rate offered."""
    out = {}
    for kind in kinds:
        # several caller processes go further: start higher, so the sweep reaches their ceiling
        rates = RATES[kind] if drivers == 1 else [r * 8 for r in RATES[kind]]
        print(f"\n### {kind}: completed requests/s at each offered rate ({drivers} driver process(es))")
        print(f"{'cores':>6}{'nodes':>6} " + "".join(f"{r:>8}" for r in rates) + "   max/s  first to saturate")
        for cores, nodes in GRID if drivers == 1 else [(64, 1), (64, 4), (256, 16)]:
            cl = Cluster(nodes=nodes, cores_per_node=cores // nodes, drivers=drivers)
            dur = 1_000.0 if kind == "chat" or quick else 3_000.0
            res, behind = [], 0
            for rate in rates:
                res += sweep(cl, costs, workload(kind, cores), [rate], duration_ms=dur, warmup_ms=dur / 4)
                behind += res[-1][1].throughput() < 0.8 * rate
                if behind >= 2:
                    break
            done = [r.throughput() for _, r in res]
            name, util = res[-1][1].bottleneck()
            also = [k for k in res[-1][1].saturated() if k != name]
            out[(kind, cores, nodes)] = (max(done), name, util, res)
            print(f"{cores:>6}{nodes:>6} " + "".join(f"{d:>8.0f}" for d in done) + " " * 8 * (len(rates) - len(done))
                  + f"{max(done):>8.0f}  {name} ({util:.0%})" + (f"; also {', '.join(also)}" if also else ""))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="qwen-3")
    ap.add_argument("--engine", default="fast", choices=("fast", "reference"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-ray", action="store_true", help="skip Ray (its costs from NOTES.md) and the validation")
    ap.add_argument("--drivers", default="1", help="caller processes attached to the pool, e.g. 1,16")
    ap.add_argument("--no-validate", action="store_true", help="measure Ray's costs but skip the validation")
    ap.add_argument("--no-grid", action="store_true", help="stop after the validation")
    ap.add_argument("--keep-cores-awake", action="store_true",
                    help="hold a CPU latency request of 0 us while measuring: idle cores poll, not halt (root)")
    ap.add_argument("--kinds", default="chat,stateless,mixed", help="workloads of the grid")
    ap.add_argument("--ab", default=None, metavar="REV",
                    help="also simulate chat sessions with the orchestrator's costs on scheduler/ as of REV")
    args = ap.parse_args()
    if args.ab:
        ceil.BASELINE = ceil.scheduler_at(args.ab)
    path = bundled_tokenizer_path(args.tokenizer)
    loaded = load_tokenizer(path)
    print(f"# bench_scaleout: {args.tokenizer}, engine {args.engine}, {os.cpu_count()} cores here, "
          f"load {os.getloadavg()[0]:.2f}")
    ray = None
    awake = contextlib.ExitStack()
    if not args.no_ray and args.keep_cores_awake:
        held = awake.enter_context(_cores_kept_awake())
        print("idle cores kept from halting (a CPU latency request of 0 us) while Ray runs: "
              + ("held" if held else "not held (/dev/cpu_dma_latency needs root)"))
    if not args.no_ray:
        import ray as ray_mod
        from delta_ray.actors.local_ray import local_init_kwargs
        ray_mod.init(address="local", **local_init_kwargs())
        ray = ray_mod
    try:
        costs, raw = measure_costs(loaded, args.engine, ray, args.quick)
        print("\n## Service times measured here (ms)")
        for k, v in raw.items():
            print(f"  {k:<24}{v:>10.4f}")
        print("  -> simulation costs: " + ", ".join(f"{f.name}={getattr(costs, f.name):.4g}"
                                                    for f in dataclasses.fields(costs) if not isinstance(getattr(costs, f.name), tuple)))
        print(f"  -> each worker turn's time varies as its CPU-time samples over their mean (other steps: means) "
              f"({len(costs.spread)} quantiles; P99 {raw['turn_cpu_p99_over_median']:.2f}x the median; "
              f"in wall time {raw['turn_p99_over_median']:.2f}x)")
        if ray is not None and not args.no_validate:
            print("\n## Validation: the real TokenizerPool on local Ray vs the simulation (closed loops)")
            print(f"{'workers':>8}  {'load':<28}{'measured/s':>11}{'sim/s':>9}{'err':>6}"
                  f"{'P99 ms':>9}{'sim P99':>9}{'err':>6}   measured P99 by round; sim P99 over {SEEDS} seeds; "
                  "the loops' steal")
            rows = validate(path, costs, args.engine, args.quick)
            for w, label, m, p, note in rows:
                print(f"{w:>8}  {label:<28}{m.rate:>11.1f}{p.rate:>9.1f}{(p.rate - m.rate) / m.rate:>+6.0%}"
                      f"{m.p99:>9.2f}{p.p99:>9.2f}{(p.p99 - m.p99) / m.p99:>+6.0%}"
                      f"   {m.p99_range[0]:.2f}, {m.p99_range[1]:.2f}; {p.p99_range[0]:.2f}-{p.p99_range[1]:.2f}; {note}")
            print(f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: wall-clock throughput and P99 "
                  "only compare on a quiet machine")
            print("\n## Where the stateless loops' time goes: each chunk's wait for a task slot and its round trip "
                  "(dispatch to answer) in ms, P50 / P99, as the pool's CallRunner records them; measured vs simulated")
            print(f"{'workers':>8}  {'load':<28}{'wait':>15}{'sim':>15}{'round trip':>15}{'sim':>15}")
            for w, label, m, p, _ in rows:
                if m.chunks and p.chunks:
                    cols = [np.percentile([c[i] for c in x.chunks], (50, 99)) for i in (0, 1) for x in (m, p)]
                    print(f"{w:>8}  {label:<28}" + "".join(f"{a:>8.1f} /{b:>5.1f}" for a, b in cols))
            print("\n## Validation by CPU demand per request (ms), which other jobs on the machine do not change: "
                  "the calling process (driver) and the workers (sessions) or the rest of the machine beyond its "
                  "idle share (texts: chunk tasks, Ray's daemons); 1 / demand is the path's ceiling")
            print(f"{'workers':>8}  {'load':<28}{'driver':>9}{'sim':>9}{'err':>6}{'workers':>9}{'sim':>9}{'err':>6}")
            for w, label, m, p, _ in rows:
                mc, mw, pc, pw = m.driver_cpu, m.workers_cpu, p.driver_cpu, p.workers_cpu
                werr = f"{(pw - mw) / mw:>+6.0%}" if mw == mw and pw == pw and mw > 0 else f"{'-':>6}"
                wcol = f"{mw:>9.3f}{pw:>9.3f}" if mw == mw and pw == pw else f"{'-':>9}{'-':>9}"
                print(f"{w:>8}  {label:<28}{mc:>9.3f}{pc:>9.3f}{(pc - mc) / mc:>+6.0%}{wcol}{werr}")
    finally:
        if ray is not None:
            ray.shutdown()
        awake.close()
    if args.no_grid:
        return 0
    costs = dataclasses.replace(costs, driver_background_ms_per_s=BACKGROUND)
    print("\n## Simulation: 16-256 cores on 1-16 nodes (workers = task slots = cores; driver on node 0)")
    if args.ab:
        before = with_orchestrator(costs, raw, "_base")
        print(f"\n## Before/after: chat sessions with the orchestrator's costs on scheduler/ as of {args.ab}"
              f" ({before.orch_session_ms:.3f} + {before.orch_session_ms_per_worker * 1e3:.2f} us/worker ms a call)"
              f" and now ({costs.orch_session_ms:.3f} + {costs.orch_session_ms_per_worker * 1e3:.2f} us/worker)")
        print(f"{'cores':>6}{'nodes':>6}{'before max/s':>14}{'after max/s':>13}{'gain':>7}  first to saturate after")
        for cores, nodes in [(16, 1), (64, 1), (64, 4), (256, 4), (256, 16)]:
            cl = Cluster(nodes=nodes, cores_per_node=cores // nodes)
            rates = [250, 500, 1000, 2000, 4000, 8000, 16000]
            b = max(r.throughput() for _, r in sweep(cl, before, workload("chat", cores), rates, duration_ms=600,
                                                      warmup_ms=200))
            res = sweep(cl, costs, workload("chat", cores), rates, duration_ms=600, warmup_ms=200)
            a = max(r.throughput() for _, r in res)
            name, util = res[-1][1].bottleneck()
            print(f"{cores:>6}{nodes:>6}{b:>14.0f}{a:>13.0f}{a / b:>6.1f}x  {name} ({util:.0%})")
    for d in (int(x) for x in args.drivers.split(",")):
        grid(costs, d, args.quick, kinds=tuple(args.kinds.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
