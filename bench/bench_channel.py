"""The authenticated side channel's cost per session call, beside a Ray actor call, in one run.

A worker-like server process answers ``encode_session``-shaped calls (a 1.3K-character append in,
about 330 int32 IDs out) over the channel; the same call goes to a Ray actor. Prints medians and
the ratio. Target (issue: secure by default): <= 0.5 ms median over the channel.

    .venv/bin/python bench/bench_channel.py [--calls 2000] [--no-ray]
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from delta_ray.actors import worker_channel  # noqa: E402

IDS = np.arange(330, dtype=np.int32)


def _handler(method, args):
    return (12345, 0, IDS)


def _serve(secret, conn):
    server = worker_channel.ChannelServer(_handler, secret, methods=frozenset({"encode_session"}))
    conn.send((server.address, os.getpid()))
    time.sleep(3600)


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
    args = ap.parse_args()
    if not worker_channel.supported():
        print("the side channel needs Linux")
        return
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
