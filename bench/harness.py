"""What the benches share: timers, CPU time by process and by machine, closed loops, process helpers.

Stdlib and numpy only, and no delta-ray import: a peer's own process (a plain script, fastokens in a
child) may use it without pinning fastokens to one thread as importing delta-ray does. CPU figures
read Linux's ``/proc``.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]  # the checkout: ``bench`` and ``delta_ray`` import from here


# -- timers -------------------------------------------------------------------------------------------
def timed_ms(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()``'s result and its wall time in ms."""
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e3


def repeat_ms(fn: Callable[[], Any], repeats: int) -> tuple[tuple[float, float], Any]:
    """(median ms, min ms) of ``repeats`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return (statistics.median(times), min(times)), result


def samples(fn: Callable[[], Any], repeats: int) -> tuple[list[float], list[float]]:
    """Each call's wall time and this process's CPU time (all threads: the engine's pool too), in ms."""
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return wall, cpu


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    """The median wall time of ``repeats`` calls, in ms."""
    return statistics.median(samples(fn, repeats)[0])


def cpu_per_call(fn: Callable[[], Any], n: int) -> tuple[float, float]:
    """(process CPU ms per call, wall ms per call) of ``n`` calls."""
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.process_time() - c0) / n * 1e3, (time.perf_counter() - t0) / n * 1e3


def cpu_wall(fn: Callable[[], int]) -> tuple[float, float, int]:
    """(process CPU seconds, wall seconds, ``fn()``'s count) of one call of ``fn``."""
    c0, t0 = time.process_time(), time.perf_counter()
    n = fn()
    return time.process_time() - c0, time.perf_counter() - t0, n


def idle_round(calls: dict, order: list, sleep_s: float, times: dict) -> dict:
    """Each call in ``order`` after its own ``sleep_s`` idle (a server between requests); appends
    its milliseconds to ``times[name]`` and returns the answers by name."""
    got = {}
    for name in order:
        time.sleep(sleep_s)
        t0 = time.perf_counter()
        got[name] = calls[name]()
        times[name].append((time.perf_counter() - t0) * 1e3)
    return got


# -- CPU time by process and by machine (Linux /proc) ---------------------------------------------------
def proc_stat(pid) -> tuple[str, float]:
    """Process ``pid``'s name (its first 15 bytes) and CPU time (user + system) so far, in ms
    (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        head, tail = f.read().rsplit(")", 1)
    fields = tail.split()
    return head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf("SC_CLK_TCK")


def proc_cpu_ms(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` so far, in ms."""
    return proc_stat(pid)[1]


def process_cpu_ns(pid: int) -> int:
    """CPU time a process has run, all its threads, in ns (/proc/<pid>/task/*/schedstat)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


def cpu_ticks() -> list[int]:
    """This machine's CPU time so far by state, all cores, in clock ticks (Linux /proc/stat: user,
    nice, system, idle, iowait, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        return ([int(x) for x in f.readline().split()[1:9]] + [0] * 8)[:8]


def machine_busy_ms() -> float:
    """CPU time every process on this machine has used so far (all cores), in ms: idle, iowait and
    steal aside (time this VM's cores were runnable but the host did not run them: no process here
    ran then)."""
    user, nice, system, _, _, irq, softirq, _ = cpu_ticks()
    return (user + nice + system + irq + softirq) * 1e3 / os.sysconf("SC_CLK_TCK")


def stolen_ms() -> float:
    """Steal so far (all cores), in ms: the time this VM's cores were runnable but the host ran
    something else, mostly here a halted core's wait to run again once woken. It came and went for
    minutes at a time with the host's load, up to 40% of both cores, and a closed loop's P99 rose
    with it (2 callers' texts: 56-65 ms at 1-5%, 89-133 ms at 16-28%, 2026-12-03)."""
    return cpu_ticks()[7] * 1e3 / os.sysconf("SC_CLK_TCK")


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
            name, ms = proc_stat(pid)
        except OSError:  # it ended meanwhile
            continue
        if name in names:
            out[int(pid)] = (name, ms)
    return out


class CpuMeter:
    """CPU since it was made, in ms: this process's (every thread) and the rest of the machine's,
    less ``idle_ms_per_s`` of the latter for each second elapsed; with ``split``, the rest as the
    chunk tasks' processes', Ray's daemons' and the remainder's (other jobs)."""

    def __init__(self, split: bool = False):
        self.p0 = cpu_by_process(TASK_PROCESSES + DAEMONS) if split else {}
        self.c0, self.m0, self.t0 = time.process_time(), machine_busy_ms(), time.perf_counter()

    def read(self, idle_ms_per_s: float = 0.0) -> tuple[float, float]:
        mine = (time.process_time() - self.c0) * 1e3
        return mine, machine_busy_ms() - self.m0 - mine - idle_ms_per_s * (time.perf_counter() - self.t0)

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


# -- closed loops -------------------------------------------------------------------------------------
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


def closed_loop(callers: int, seconds: float, fn, pids=()) -> Loop:
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
        return machine_busy_ms() - time.process_time() * 1e3 if pids is None else sum(map(proc_cpu_ms, pids))
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


# -- processes ----------------------------------------------------------------------------------------
def processes() -> Iterator[tuple[int, str, int]]:
    """(pid, command line, resident bytes) of every process this user can read (Linux /proc)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/statm") as f:
                rss_pages = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        yield int(pid), cmd, rss_pages * os.sysconf("SC_PAGE_SIZE")


def descendants(root: int) -> set[int]:
    """``root`` and every process below it (this machine may run other people's Ray clusters)."""
    children: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(p))
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, ()))
    return out


class ActorPeakRSS:
    """Samples the resident memory of a pipeline's actor processes (Ray names them after their
    UDF class) every 50 ms in a background thread; ``peak_mb()`` is the largest one seen, and
    ``pids`` the processes seen running the encode (each builds its own tokenizer: seconds of CPU)."""

    def __init__(self, marker: str):
        self.marker, self.peak, self.pids = marker, 0, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.wait(0.05):
            seen = [(pid, rss) for pid, cmd, rss in processes() if self.marker in cmd]
            self.pids.update(pid for pid, _ in seen)
            self.peak = max([self.peak] + [rss for _, rss in seen])

    def peak_mb(self) -> float:
        return self.peak / 2 ** 20


def user_env(**extra: str) -> dict[str, str]:
    """This process's environment without delta-ray's fastokens pin (``FASTOKENS_BPE_THREADS``, set
    when delta-ray is imported): a peer's process runs with the user's defaults."""
    env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"}
    env.update(extra)
    return env


def in_own_process(module: str, fn_name: str, *args, env: dict[str, str] | None = None) -> tuple:
    """``module.fn_name(*args)`` (JSON in, a JSON list out) in a fresh Python process with the checkout
    importable and ``env`` (default: :func:`user_env`); raises RuntimeError with its stderr's tail
    when it fails."""
    code = (f"import importlib, json, sys; sys.path.insert(0, {str(ROOT)!r}); "
            f"m = importlib.import_module({module!r}); print(json.dumps(m.{fn_name}(*json.loads(sys.argv[1]))))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                         env=user_env() if env is None else env)
    if out.returncode:
        raise RuntimeError(f"{fn_name} failed ({out.returncode}): {out.stderr[-2000:]}")
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
