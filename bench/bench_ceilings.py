"""Ceilings of the serial parts, measured here without Ray: calls/s and CPU per call.

What stops a pool on a 64-core node is not the workers (64 of them) but the parts every call of a
pool passes through once: the driver's orchestrator on one asyncio loop (with the dispatcher), the
hand-off from a caller's thread to that loop, a Serve replica's request handling, the routing
decision. This bench drives each of them with work that costs nothing elsewhere, so what it
measures is the part's own ceiling:

1. session calls/s of the REAL ``PoolOrchestrator`` + ``Dispatcher`` over a transport that answers
   at once (a 1.3K-character ``extend`` of a 100K-character session: the splice, mirror and
   arrow assembly are real), from 1 to 64 concurrent callers: as coroutines on the pool's loop, and
   as threads through the pool facade's hand-off (``LoopThread.run``, what ``pool.extend`` does);
2. stateless chunk dispatches/s: ``_pieces`` of 16 chunks per request, same transport;
3. one Serve replica's request handling without the network: JSON in, parse, tenant key, a 1.3K
   append to a session held in process (the replica's own encode, fast engine), JSON out; and the
   same handler with a trivial prompt (the handler's floor);
4. the routing decision: rendezvous ``home_worker`` over 2-1024 nodes, and a keyless text's content key.

CPU per call is the process's CPU time (all threads) over the calls; on this 2-core machine the
driver's Python holds one GIL, so the ceiling of (1) and (2) is 1 / CPU per call in any case.
``--workers`` changes how many fake workers the dispatcher routes over (its dispatch scans them).

    .venv/bin/python bench/bench_ceilings.py [--seconds 1.0] [--workers 2,64] [--json out.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from bench.harness import cpu_wall  # noqa: E402
from delta_ray._core.arguments import check_text  # noqa: E402
from delta_ray._core.config import PoolConfig, TokenizerConfig  # noqa: E402
from delta_ray._core.keys import ContentDigest  # noqa: E402
from delta_ray._core.loading import load_tokenizer  # noqa: E402
from delta_ray._tokenizer_core import TokenizerCore  # noqa: E402
from delta_ray.actors.loop_thread import LoopThread  # noqa: E402
from delta_ray.actors.orchestrator import PoolOrchestrator  # noqa: E402
from delta_ray.apps.bundled import bundled_tokenizer_path  # noqa: E402
from delta_ray.apps.sample_text import corpus  # noqa: E402
from delta_ray.scheduler import home_worker, worker_name  # noqa: E402

SECRET = b"s" * 32
CONTEXT_TOKENS = 25_000  # a 100K-character session
TURN_TOKENS = 300  # a 1.3K-character append
DELTA = ("The quick brown fox jumps over the lazy dog. " * 40)[:1300]
CALLERS = (1, 4, 16, 64)


class NoMetrics:
    def __getattr__(self, name):
        return lambda *a, **k: None


class InstantTransport:
    """Answers every call at once, shaped like a worker's answer, with no work behind it.

    A session call answers a delta (version, k, tail) that keeps all but the last 8 IDs the pool
    holds and adds a 1.3K turn's worth, so the orchestrator's splice and mirror work is what a
    real turn costs it; chunks answer a fixed array.
    """

    def __init__(self) -> None:
        self.lens: dict[str, int] = {}
        self.versions: dict[str, int] = {}
        self.calls = 0
        self._ids = np.arange(CONTEXT_TOKENS + TURN_TOKENS, dtype=np.int32)
        self._piece = np.arange(16_000, dtype=np.int32)

    async def call(self, wid, call):
        self.calls += 1
        method = call.kind.method
        if method in ("extend", "encode_session"):
            key, known = call.args[0], call.args[2]
            v = self.versions.get(key, 0) + 1
            self.versions[key] = v
            n = self.lens.get(key, 0)
            if known is None or n == 0:
                k, tail = 0, self._ids[:CONTEXT_TOKENS]
            else:
                k, tail = n - 8, self._ids[:8 + TURN_TOKENS]
            self.lens[key] = k + len(tail)
            return v, k, tail
        if method == "encode_pieces":
            return [self._piece]
        if method == "install":
            return True
        raise ValueError(method)

    def retire(self, wid, *, kill):
        pass

    def close(self):
        pass


BASELINE: Any = None  # the scheduler package of another revision (--ab), or None
RECORD: Any = NoMetrics()  # what the orchestrator records to (bench/scaleout passes the real metrics under Ray)


def scheduler_at(rev: str):
    """The ``scheduler/`` package as it was at git revision ``rev``, imported under another name,
    so one run can time the orchestrator on both dispatchers side by side."""
    import importlib.util
    import subprocess
    import tempfile
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    pkg = os.path.join(tempfile.mkdtemp(prefix="sched-"), "baseline_scheduler")
    os.makedirs(pkg)
    names = subprocess.run(["git", "-C", root, "ls-tree", "--name-only", rev, "scheduler/"], check=True,
                           capture_output=True, text=True).stdout.split()
    for name in names:
        src = subprocess.run(["git", "-C", root, "show", f"{rev}:{name}"], check=True, capture_output=True,
                             text=True).stdout
        with open(os.path.join(pkg, os.path.basename(name)), "w") as f:
            f.write(src)
    spec = importlib.util.spec_from_file_location("baseline_scheduler", os.path.join(pkg, "__init__.py"),
                                                  submodule_search_locations=[pkg])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["baseline_scheduler"] = mod
    spec.loader.exec_module(mod)
    return mod


def make_orchestrator(local: TokenizerCore, n_workers: int, loop, *, inflight_tasks: int = 64,
                      transport=None, baseline: bool = False) -> tuple[PoolOrchestrator, Any]:
    transport = transport if transport is not None else InstantTransport()
    tok = local.config
    cfg = PoolConfig(tokenizer=tok, placement=False, max_inflight_tasks=inflight_tasks,
                     num_workers=n_workers).resolved(n_workers)
    ids = [worker_name(i) for i in range(n_workers)]
    orch = PoolOrchestrator(local, transport, ids, cfg, loop, SECRET, record=RECORD)
    if baseline:  # the same orchestrator on the other revision's dispatcher and routing
        orch.calls.dispatcher = BASELINE.Dispatcher(cfg.policy, workers=ids, max_inflight_tasks=cfg.max_inflight_tasks,
                                                    workers_take_shared=cfg.workers_take_shared)
    return orch, transport


async def _gather(coros) -> list:
    return await asyncio.gather(*coros)


def _row(label: str, callers: int, cpu: float, wall: float, n: int) -> dict:
    rate = n / wall
    us = cpu / n * 1e6
    print(f"{label:<44}{callers:>8}{rate:>12,.0f}{us:>14.1f}{cpu / wall * 100:>9.0f}%")
    return {"path": label, "callers": callers, "calls_per_s": rate, "cpu_us_per_call": us,
            "cpu_share": cpu / wall}


def _header(title: str) -> None:
    print(f"\n## {title}")
    print(f"{'path':<44}{'callers':>8}{'calls/s':>12}{'CPU us/call':>14}{'CPU':>10}")


def session_loop(local, n_workers: int, callers: int, seconds: float, baseline: bool = False
                 ) -> tuple[float, float, int]:
    """Coroutine callers on the orchestrator's own loop (no thread hand-off)."""
    loop = asyncio.new_event_loop()
    orch, _ = make_orchestrator(local, n_workers, loop, baseline=baseline)

    async def caller(i: int, deadline: float) -> int:
        key = f"s{i}"
        n = 0
        while time.perf_counter() < deadline:
            await orch.extend(key, DELTA, True)
            n += 1
        return n

    async def warm() -> None:
        await asyncio.gather(*(orch.encode("x" * 5000, f"s{i}", True) for i in range(callers)))

    loop.run_until_complete(warm())

    def go() -> int:
        deadline = time.perf_counter() + seconds
        return sum(loop.run_until_complete(_gather(caller(i, deadline) for i in range(callers))))

    out = cpu_wall(go)
    loop.close()
    return out


def session_threads(local, n_workers: int, callers: int, seconds: float, baseline: bool = False
                    ) -> tuple[float, float, int]:
    """Threads calling through the pool facade's hand-off, as ``pool.extend`` does."""
    lt = LoopThread("bench-pool")
    orch, _ = make_orchestrator(local, n_workers, lt.loop, baseline=baseline)
    for i in range(callers):
        lt.run(orch.encode("x" * 5000, f"s{i}", True))
    counts = [0] * callers
    stop = threading.Event()
    start = threading.Barrier(callers + 1)

    def caller(i: int) -> None:
        key = f"s{i}"
        start.wait()
        while not stop.is_set():
            check_text(key, "session")
            check_text(DELTA, "delta")
            lt.run(orch.extend(key, DELTA, True))
            counts[i] += 1

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(callers)]
    for t in threads:
        t.start()

    def go() -> int:
        start.wait()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        return sum(counts)

    out = cpu_wall(go)
    lt.close()
    return out


def chunk_loop(local, n_workers: int, callers: int, seconds: float, pieces: int = 16, baseline: bool = False
               ) -> tuple[float, float, int]:
    """Stateless requests of 16 chunks each, ``callers`` at once; counts chunk dispatches."""
    loop = asyncio.new_event_loop()
    orch, transport = make_orchestrator(local, n_workers, loop, baseline=baseline)
    chunk = ["y" * 65_536] * pieces

    async def caller(deadline: float) -> int:
        n = 0
        while time.perf_counter() < deadline:
            await orch._pieces(chunk)
            n += pieces
        return n

    def go() -> int:
        deadline = time.perf_counter() + seconds
        return sum(loop.run_until_complete(_gather(caller(deadline) for _ in range(callers))))

    out = cpu_wall(go)
    loop.close()
    return out


def serve_handler(loaded, local: TokenizerCore, seconds: float) -> list[tuple[str, float, float, int]]:
    """One replica's request handling without the network: its real Ray-free ``RequestHandler``
    (body read, JSON parse, validation, tenant key, versioned append, JSON answer), driven on one
    loop; each append names the ``session_version`` of the previous answer, as a client does."""
    from delta_ray.server.serve_handler import RequestHandler

    handler = RequestHandler(loaded, local, served={"delta-ray"})
    loop = asyncio.new_event_loop()

    async def one_chunk(body: bytes):
        yield body

    def post(body: bytes) -> bytes:
        status, data, _ = loop.run_until_complete(handler.http("tokenize", str(len(body)), one_chunk(body)))
        if status != 200:
            raise RuntimeError(f"the handler answered {status}: {data[:200]!r}")
        return data

    def version_of(answer: bytes) -> bytes:  # the client's one field, without parsing the IDs
        at = answer.rindex(b'"session_version"')
        start = answer.index(b'"', answer.index(b":", at)) + 1
        return answer[start:answer.index(b'"', start)]

    base = json.dumps({"prompt": corpus("english", 100_000), "session_id": "chat",
                       "cache_salt": "tenant-a"}).encode()
    code = corpus("code", 1_300_000)
    turns = [json.dumps({"append": code[i * 1300:(i + 1) * 1300], "session_id": "chat",
                         "cache_salt": "tenant-a"})[:-1].encode() for i in range(1000)]
    state = {"version": version_of(post(base))}

    def append(i: int) -> None:
        state["version"] = version_of(post(turns[i % len(turns)] + b', "session_version": "'
                                           + state["version"] + b'"}'))

    tiny_body = json.dumps({"prompt": "hello there, how are you"}).encode()
    out = []
    for label, fn in (("serve handler: append 1.3K to a held 100K session", append),
                      ("serve handler: 5-word prompt (the floor)", lambda i: post(tiny_body))):
        fn(0)  # warm

        def go(fn=fn) -> int:
            n, deadline = 0, time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                fn(n)
                n += 1
                if fn is append and n % 200 == 0:  # keep the session near 100K: start it again
                    state["version"] = version_of(post(base))
            return n
        out.append((label,) + cpu_wall(go))
    loop.close()
    return out


def routing(seconds: float) -> list[tuple[str, float, float, int]]:
    out = []
    keys = [f"t5:tenant|s:session-{i}" for i in range(4096)]
    variants = [("", home_worker)] + ([(" [baseline]", BASELINE.routing.home_worker)] if BASELINE else [])
    for nodes in (2, 16, 64, 256, 1024):
        ids = [f"w{i:04d}" for i in range(nodes)]
        for tag, route in variants:
            def go(ids=ids, route=route) -> int:
                n, deadline = 0, time.perf_counter() + seconds
                while time.perf_counter() < deadline:
                    for k in keys[:256]:
                        route(k, ids)
                    n += 256
                return n
            out.append((f"rendezvous home_worker over {nodes} nodes{tag}",) + cpu_wall(go))
    text = corpus("english", 100_000)
    digest = ContentDigest()

    def ck() -> int:
        n, deadline = 0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            digest.of(text)
            n += 1
        return n
    out.append(("content digest of a 100K prompt (first 4 KB)",) + cpu_wall(ck))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="qwen-3")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--workers", default="2,64")
    ap.add_argument("--callers", default=",".join(map(str, CALLERS)))
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--ab", default=None, metavar="REV",
                    help="also time the orchestrator on scheduler/ as of git revision REV, alternating")
    args = ap.parse_args()
    global BASELINE
    if args.ab:
        BASELINE = scheduler_at(args.ab)
    loaded = load_tokenizer(bundled_tokenizer_path(args.tokenizer))
    # the orchestrator's caller-side tokenizer encodes nothing here (the transport answers)
    local = TokenizerCore(loaded, TokenizerConfig(threads=1, shadow_rate=0.0, engine="reference"))
    workers = [int(w) for w in args.workers.split(",")]
    callers = [int(c) for c in args.callers.split(",")]
    print(f"# bench_ceilings: {args.tokenizer}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
          f"{args.seconds:.1f} s per cell")
    rows: list[dict] = []
    variants = [("", False)] + ([(f" [{args.ab}]", True)] if BASELINE is not None else [])
    for w in workers:
        _header(f"pool session calls (1.3K extend of a 100K session), {w} fake workers answering at once")
        for kind, label, fn in (("session_loop", "orchestrator: coroutines on its loop", session_loop),
                                ("session_threads", "pool facade: threads -> LoopThread -> loop", session_threads),
                                ("chunk", "chunk dispatches: _pieces on its loop", chunk_loop)):
            for c in callers:
                for tag, base in variants:  # alternated cell by cell: the load changes under both alike
                    rows.append(_row(label + tag, c, *fn(local, w, c, args.seconds, baseline=base))
                                | {"workers": w, "kind": kind + tag})
    _header("one Serve replica, request handling without the network (one loop: callers do not add up)")
    replica = TokenizerCore(loaded, TokenizerConfig(threads=1, shadow_rate=0.0, engine="fast"))
    replica.encode(corpus("english", 10_000))  # the fast engine is admitted (cached on disk) and warm
    for label, cpu, wall, n in serve_handler(loaded, replica, args.seconds):
        rows.append(_row(label, 1, cpu, wall, n) | {"kind": "serve"})
    _header("the routing decision")
    for label, cpu, wall, n in routing(args.seconds):
        rows.append(_row(label, 1, cpu, wall, n) | {"kind": "routing"})
    best = {}
    for r in rows:
        if r["kind"].split(" ")[0] in ("session_threads", "session_loop", "chunk"):
            k = (r["kind"], r["workers"])
            best[k] = max(best.get(k, 0), r["calls_per_s"])
    print("\n## Ceilings (best over callers)")
    for (kind, w), rate in sorted(best.items()):
        print(f"{kind:<28} {w:>4} workers: {rate:>10,.0f} calls/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
