"""A calling process's heap frozen or not, side by side: the pool's session turns and 1M texts.

A full garbage collection traces every container object of the process with the GIL held; with Ray
initialized that is about 100K objects, 60-125 ms a collection on this project's 2-core VM, and in
a pool's calling process every call waits it out (``delta_ray/_runtime/heap.py``). The pool's own
processes freeze theirs after building their tokenizer; this bench runs one pool (2 workers) and
alternates rounds with the calling process's heap frozen (``delta_ray.freeze_heap()``) and thawed:
4 callers' session turns (+1.3K characters each), then 2 callers' 1M-character texts (chunk tasks),
and prints each way's P99 and slowest request with the full collections seen in the calling process
and the longest one. Every answer checked is checked against the reference tokenizer.

    .venv/bin/python bench/bench_heap.py [--rounds 3] [--seconds 6]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from bench.harness import closed_loop  # noqa: E402

TURN = 1300


class FullCollections:
    """The calling process's full (generation 2) collections while open: count and longest (ms)."""

    def __init__(self):
        self.times: list[float] = []
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if info["generation"] == 2:
            if phase == "start":
                self._t0 = time.perf_counter()
            else:
                self.times.append((time.perf_counter() - self._t0) * 1e3)

    def __enter__(self) -> "FullCollections":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0, help="per loop, round and way")
    args = ap.parse_args()

    import ray
    from tokenizers import Tokenizer

    from delta_ray import TokenizerPool, freeze_heap
    from delta_ray.actors.local_ray import local_init_kwargs
    from delta_ray.apps.bundled import bundled_tokenizer_path
    from delta_ray.apps.sample_text import corpus

    ray.init(address="local", **local_init_kwargs())
    path = bundled_tokenizer_path("qwen-3")
    reference = Tokenizer.from_file(path)
    src, text = corpus("code", 3_000_000), corpus("english", 1_000_000)
    want = np.asarray(reference.encode(text, add_special_tokens=False).ids, np.int32)
    callers = 4
    results: dict[str, dict[str, list[float]]] = {way: {"turns": [], "texts": [], "gc": []}
                                                  for way in ("thawed", "frozen")}
    try:
        with TokenizerPool(path, num_workers=2, max_inflight_tasks=2, placement=False, engine="fast",
                           shadow_rate=0.0, request_timeout_s=120, max_session_bytes=1 << 31) as pool:
            sent = [[src[:100_000]] for _ in range(callers)]
            for i in range(callers):
                pool.encode(sent[i][0], session=f"h{i}")
            pos = [i * 400_000 for i in range(callers)]
            span = len(src) - 100_000 - TURN

            def turn(i: int) -> None:
                p = pos[i] % span
                delta = src[100_000 + p:100_000 + p + TURN]
                pool.extend(f"h{i}", delta)
                sent[i].append(delta)
                pos[i] += TURN

            for _ in range(5):
                assert np.array_equal(pool.encode(text, add_special_tokens=False).to_numpy(), want)
            for r in range(args.rounds):
                for way in (("frozen", "thawed") if r % 2 else ("thawed", "frozen")):
                    if way == "frozen":
                        freeze_heap()
                    else:
                        gc.unfreeze()
                    with FullCollections() as full:
                        turns = closed_loop(callers, args.seconds, turn)
                        texts = closed_loop(2, args.seconds, lambda i: pool.encode(text, add_special_tokens=False))
                    results[way]["turns"] += turns.latencies
                    results[way]["texts"] += texts.latencies
                    results[way]["gc"] += full.times
            for i in range(callers):
                got = pool.extend(f"h{i}", "").to_numpy()
                assert np.array_equal(got, np.asarray(reference.encode("".join(sent[i])).ids, np.int32)), \
                    "pool differs from the reference"
            assert np.array_equal(pool.encode(text, add_special_tokens=False).to_numpy(), want)
    finally:
        gc.unfreeze()
        ray.shutdown()
    print(f"# bench_heap: 2 workers, {args.rounds} rounds of {args.seconds:.0f} s per loop and way, "
          f"{os.cpu_count()} cores here, load {os.getloadavg()[0]:.2f}")
    print(f"{'calling process':<16}{'turns P99 ms':>13}{'slowest':>9}{'texts P99 ms':>14}{'slowest':>9}"
          f"{'full GCs':>10}{'longest ms':>12}")
    for way, res in results.items():
        t, x, g = res["turns"], res["texts"], res["gc"]
        print(f"{way:<16}{np.percentile(t, 99):>13.2f}{max(t):>9.1f}{np.percentile(x, 99):>14.1f}{max(x):>9.1f}"
              f"{len(g):>10}{max(g, default=0.0):>12.1f}")
    fz, th = results["frozen"], results["thawed"]
    print(f"frozen / thawed: turns P99 {np.percentile(fz['turns'], 99) / np.percentile(th['turns'], 99):.2f}x, "
          f"slowest {max(fz['turns']) / max(th['turns']):.2f}x; texts P99 "
          f"{np.percentile(fz['texts'], 99) / np.percentile(th['texts'], 99):.2f}x, "
          f"slowest {max(fz['texts']) / max(th['texts']):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
