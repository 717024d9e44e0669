"""The authenticated side channel's cost per session call, beside a Ray actor call, in one run.

A worker-like server process answers ``encode_session``-shaped calls (a 1.3K-character append in,
about 330 int32 IDs out) over the channel; the same call goes to a Ray actor. Prints medians and
the ratio. Target (issue: secure by default): <= 0.5 ms median over the channel.

``--compare REV`` also runs the channel as it was at git revision REV (e.g. before per-frame
authentication), alternating blocks of calls between the two in one run, for the small call and
for a large one (100K characters in, 25K IDs out), and prints the medians side by side.

    .venv/bin/python bench/bench_channel.py [--calls 2000] [--no-ray] [--compare 0569d27]
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.harness import process_cpu_ns  # noqa: E402
from delta_ray.actors import worker_channel  # noqa: E402

IDS = np.arange(330, dtype=np.int32)


BIG_IDS = np.arange(25_000, dtype=np.int32)


def _handler(method, args):
    return (12345, 0, BIG_IDS if len(args[1]) > 50_000 else IDS)


def _serve(secret, conn, module=worker_channel):
    server = module.ChannelServer(_handler, secret, methods=frozenset({"encode_session"}))
    conn.send((server.address, os.getpid()))
    time.sleep(3600)


def _old_module(rev: str) -> types.ModuleType:
    """actors/worker_channel.py as it was at git revision ``rev``."""
    root = os.path.join(os.path.dirname(__file__), "..")
    src = subprocess.run(["git", "show", f"{rev}:actors/worker_channel.py"], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    mod = types.ModuleType("delta_ray.actors.worker_channel_at_" + rev)
    mod.__dict__["__package__"] = "delta_ray.actors"
    exec(compile(src, f"worker_channel@{rev}", "exec"), mod.__dict__)
    return mod


def _start(module, secret):
    parent, child = mp.Pipe()
    proc = mp.get_context("fork").Process(target=_serve, args=(secret, child, module), daemon=True)
    proc.start()
    address, pid = parent.recv()
    return proc, module.ChannelClient(address, secret, expected_pid=pid)


async def _compare(clients: dict, pids: dict, rounds: int, block: int, text: str) -> dict:
    """Alternate blocks of calls between the channels; per-call wall times (ms) and the CPU time
    (client + server process, ns) each spent. CPU time is what the added work costs; on a loaded
    machine it is far less noisy than wall time."""
    out = {name: {"wall": [], "cpu": 0} for name in clients}
    for c in clients.values():
        await c.call("encode_session", ("warm", text, None))
    names = list(clients)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            c = clients[name]
            cpu0, srv0 = time.process_time_ns(), process_cpu_ns(pids[name])
            for i in range(block):
                t = time.perf_counter()
                await c.call("encode_session", (f"s{i % 64}", text, 7))
                out[name]["wall"].append((time.perf_counter() - t) * 1e3)
            out[name]["cpu"] += time.process_time_ns() - cpu0 + process_cpu_ns(pids[name]) - srv0
    return out


def compare(rev: str, calls: int) -> None:
    old_mod = _old_module(rev)
    secret = worker_channel.new_secret()
    p_old, c_old = _start(old_mod, secret)
    p_new, c_new = _start(worker_channel, secret)
    clients, pids = {"old": c_old, "new": c_new}, {"old": p_old.pid, "new": p_new.pid}
    small = ("The quick brown fox jumps over the lazy dog. " * 30)[:1300]
    big = ("The quick brown fox jumps over the lazy dog. " * 2300)[:100_000]
    cases = (("1.3K in / 330 IDs out", small, calls), ("100K in / 25K IDs out", big, max(40, calls // 20)))

    async def main():
        return [await _compare(clients, pids, 20, max(2, n // 20), text) for _, text, n in cases]
    try:
        results = asyncio.run(main())
    finally:
        for p in (p_old, p_new):
            p.terminate()
            p.join(5)
    for (label, _, _), t in zip(cases, results):
        o, n = t["old"], t["new"]
        mo, mn = statistics.median(o["wall"]), statistics.median(n["wall"])
        co, cn = o["cpu"] / len(o["wall"]) / 1e3, n["cpu"] / len(n["wall"]) / 1e3
        print(f"{label} ({len(n['wall'])} calls each, alternating blocks):\n"
              f"  wall median: at {rev} {mo:.3f} ms, now {mn:.3f} ms ({mn / mo:.2f}x)\n"
              f"  CPU per call (client + server): at {rev} {co:.0f} us, now {cn:.0f} us "
              f"(added {cn - co:+.0f} us, {cn / co:.2f}x)")


async def _channel_calls(address, secret, pid, n, text):
    client = worker_channel.ChannelClient(address, secret, expected_pid=pid)
    await client.call("encode_session", ("warm", text, None))
    out = []
    for i in range(n):
        t = time.perf_counter()
        await client.call("encode_session", (f"s{i % 64}", text, 7))
        out.append((time.perf_counter() - t) * 1e3)
    client.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--compare", metavar="REV", help="also run the channel of git revision REV, side by side")
    args = ap.parse_args()
    if not worker_channel.supported():
        print("the side channel needs Linux")
        return
    if args.compare:
        print(f"load average before: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
        compare(args.compare, args.calls)
    text = ("The quick brown fox jumps over the lazy dog. " * 30)[:1300]
    secret = worker_channel.new_secret()
    parent, child = mp.Pipe()
    proc = mp.get_context("fork").Process(target=_serve, args=(secret, child), daemon=True)
    proc.start()
    address, pid = parent.recv()
    try:
        chan = asyncio.run(_channel_calls(address, secret, pid, args.calls, text))
    finally:
        proc.terminate()
        proc.join(5)
    print(f"side channel: median {statistics.median(chan):.3f} ms, p99 {np.percentile(chan, 99):.3f} ms "
          f"({args.calls} calls, 1.3K text in, {len(IDS)} IDs out)")
    if args.no_ray:
        return
    import ray

    from delta_ray.actors.local_ray import local_init_kwargs
    ray.init(address="local", **local_init_kwargs(num_cpus=2))

    @ray.remote
    class Echo:
        def encode_session(self, key, text, known):
            return (12345, 0, IDS)

    a = Echo.remote()
    ray.get(a.encode_session.remote("warm", text, None))
    rt = []
    for i in range(min(args.calls, 1000)):
        t = time.perf_counter()
        ray.get(a.encode_session.remote(f"s{i % 64}", text, 7))
        rt.append((time.perf_counter() - t) * 1e3)
    ray.shutdown()
    print(f"ray actor call: median {statistics.median(rt):.3f} ms, p99 {np.percentile(rt, 99):.3f} ms")
    print(f"ratio ray / channel (median): {statistics.median(rt) / statistics.median(chan):.1f}x")


if __name__ == "__main__":
    main()
