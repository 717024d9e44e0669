"""A local Ray with and without its metrics collection, side by side: the pool's stateless texts.

delta-ray starts its local Ray with ``enable_metrics_collection`` off (``actors/local_ray.py``). With
it on, the node's agent aggregates what the worker processes report, in a burst of up to a core for
about a second every ten seconds under load. This bench runs the same closed loop (two callers
sending 1M-character texts through a 2-worker pool, placement off so the texts go to chunk tasks)
on a fresh local Ray each way, alternating in rounds, each in its own process, and prints texts/s,
P99 (and each half's, the measurement's own repeatability) and the agent's CPU per second. Every
answer is checked against the reference tokenizer first.

    .venv/bin/python bench/bench_ray_metrics.py [--rounds 2] [--seconds 20]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.harness import closed_loop, cpu_by_process  # noqa: E402

AGENT = "ray::DashboardA"  # the node agent's process name, as /proc/<pid>/stat keeps it (15 bytes)


def one_way(metrics: bool, seconds: float) -> dict:
    """The loop on a fresh local Ray started with delta-ray's settings, metrics collection as given."""
    import numpy as np
    import ray
    from tokenizers import Tokenizer

    from delta_ray import TokenizerPool
    from delta_ray.actors.local_ray import local_init_kwargs
    from delta_ray.apps.bundled import bundled_tokenizer_path
    from delta_ray.apps.sample_text import corpus

    kw = local_init_kwargs()
    kw["_system_config"] = {**kw["_system_config"], "enable_metrics_collection": metrics}
    ray.init(address="local", **kw)
    try:
        path = bundled_tokenizer_path("qwen-3")
        text = corpus("english", 1_000_000)
        with TokenizerPool(path, num_workers=2, max_inflight_tasks=2, placement=False, engine="fast",
                           shadow_rate=0.0) as pool:
            want = np.asarray(Tokenizer.from_file(path).encode(text, add_special_tokens=False).ids, np.int32)
            for _ in range(10):
                assert np.array_equal(pool.encode(text, add_special_tokens=False).to_numpy(), want)
            def agent_ms() -> float:
                return sum(ms for _, ms in cpu_by_process((AGENT,)).values())
            a0, t0 = agent_ms(), time.perf_counter()
            loop = closed_loop(2, seconds, lambda i: pool.encode(text, add_special_tokens=False), pids=())
            agent = (agent_ms() - a0) / (time.perf_counter() - t0)
            assert np.array_equal(pool.encode(text, add_special_tokens=False).to_numpy(), want)
        return {"rate": loop.rate, "p99": loop.p99, "halves": list(loop.p99_range), "agent_ms_per_s": agent}
    finally:
        ray.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--one", choices=("on", "off"), help=argparse.SUPPRESS)  # a child's run
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_way(args.one == "on", args.seconds)))
        return 0
    print(f"# a local Ray's metrics collection on and off: 2 callers, 1M texts, 2 workers, {args.seconds:.0f} s "
          f"loops, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'round':>5}  {'metrics':<8}{'texts/s':>9}{'P99 ms':>9}  {'P99 by half':<14}{'agent ms/s':>11}")
    got: dict[str, list[dict]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for way in ("on", "off"):
            out = subprocess.run([sys.executable, __file__, "--one", way, "--seconds", str(args.seconds)],
                                 capture_output=True, text=True, check=True).stdout
            res = json.loads(out.strip().splitlines()[-1])
            got[way].append(res)
            print(f"{r + 1:>5}  {way:<8}{res['rate']:>9.1f}{res['p99']:>9.1f}  "
                  f"{res['halves'][0]:.1f}, {res['halves'][1]:<8.1f}{res['agent_ms_per_s']:>11.0f}", flush=True)
    med = {w: {k: statistics.median(x[k] for x in got[w]) for k in ("rate", "p99")} for w in got}
    print(f"off / on (medians): throughput {med['off']['rate'] / med['on']['rate']:.2f}x, "
          f"P99 {med['off']['p99'] / med['on']['p99']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
