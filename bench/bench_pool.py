"""Pool benchmarks (issue: Ray actor pool), ratios measured side by side in one run.

1. Single calls: pool vs in-process for a 1.3K append to 100K- and 1M-character sessions (whole
   transcript and ``extend``); a stateless 1M-character text on the pool vs the serial reference.
2. Open-loop replay: sessions whose first turns carry 100K characters, ~1.3K appends, 2.3%
   stateless documents of 32K-100K characters, Poisson arrivals, at most one request in flight per
   session, latency = completion - scheduled arrival; P50/P99 against the offered rate for the
   reference, the in-process DeltaTokenizer and the pool. Writes bench/out/latency_vs_rate.png.
3. Bursts: four 1M-character documents every 2 s on top of the turns; turn P99 with documents
   whole vs chunked, FIFO vs shortest-first.

4. After a 30 ms idle: the pool's no-op and extend, a worker's own call and the in-process extend,
   each call after its own sleep (issue 27: the floor a server pays between requests).

Usage: python bench/bench_pool.py [--quick] [--sessions 64] [--duration 15] [--rates 4,8,16,32]
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import os
import random
import statistics
import sys
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import ray  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from bench.harness import idle_round, timed_ms  # noqa: E402 - idle_round: the same idle protocol as bench_turns
from delta_ray import DeltaTokenizer, TokenizerPool  # noqa: E402
from delta_ray.actors.local_ray import local_init_kwargs  # noqa: E402
from delta_ray.apps.bundled import bundled_tokenizer_path  # noqa: E402
from delta_ray.apps.sample_text import corpus  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
ENGINE = "reference"  # set by --engine


def single_calls(pool, dt, ref, quick):
    print("\n## Single calls (median; every result checked against the reference)")
    src = corpus("code", 1_100_000 + 42 * 1300)
    sizes = [100_000] if quick else [100_000, 1_000_000]
    print(f"{'session':>10}{'turns':>6}{'in-process ms':>15}{'pool ms':>10}{'added ms':>10}"
          f"{'in-proc extend':>16}{'pool extend':>13}{'added ms':>10}{'pool no-op':>12}")
    added_extend_100k = None
    for n in sizes:
        turns = 41 if n <= 100_000 else 15  # many short turns: a stable median on a noisy machine
        texts = [src[:n + (i + 1) * 1300] for i in range(turns)]
        deltas = [src[n + i * 1300:n + (i + 1) * 1300] for i in range(turns)]
        for key in ("w", "e"):
            pool.encode(src[:n], session=f"{key}{n}")
            dt.encode(src[:n], session=f"{key}{n}")
        d, p, de, pe, noop = [], [], [], [], []
        for t, dl in zip(texts, deltas):
            a, ta = timed_ms(lambda: dt.encode(t, session=f"w{n}"))
            b, tb = timed_ms(lambda: pool.encode(t, session=f"w{n}"))
            c, tc = timed_ms(lambda: dt.extend(f"e{n}", dl))
            e, te = timed_ms(lambda: pool.extend(f"e{n}", dl))
            # The same call with nothing to encode: the hops alone (this machine's floor for one
            # pool call: a wake-up of the pool's loop thread and of the worker process, and back)
            _, tn = timed_ms(lambda: pool.extend(f"e{n}", ""))
            noop.append(tn)
            # numpy comparisons: big Python lists would make the driver's GC pause inside later timings
            a, b, c, e = (x.to_numpy() for x in (a, b, c, e))
            assert np.array_equal(a, b) and np.array_equal(a, c) and np.array_equal(a, e)
            d.append(ta), p.append(tb), de.append(tc), pe.append(te)
        want = np.asarray(ref.encode(texts[-1]).ids, dtype=np.int32)
        assert np.array_equal(a, want)
        md, mp, mde, mpe = (statistics.median(x) for x in (d, p, de, pe))
        if n == 100_000:
            added_extend_100k = mpe - mde
        print(f"{n:>10,}{turns:>6}{md:>15.2f}{mp:>10.2f}{mp - md:>10.2f}{mde:>16.2f}{mpe:>13.2f}{mpe - mde:>10.2f}"
              f"{statistics.median(noop):>12.2f}")
    doc = corpus("english", 1_000_000)
    want, tr = timed_ms(lambda: ref.encode(doc).ids)
    want = np.asarray(want, dtype=np.int32)
    tps = []
    for _ in range(3):
        got, tp = timed_ms(lambda: pool.encode(doc))
        tps.append(tp)
    assert np.array_equal(got.to_numpy(), want)
    tp = statistics.median(tps)
    print(f"stateless 1,000,000 chars: serial reference {tr:.0f} ms, pool {tp:.0f} ms -> {tr / tp:.2f}x "
          f"(target >= 1.6x)")
    # The pool against the caller's own DeltaTokenizer, same engine (placement decides where it runs)
    for n in (1_000_000, 3_000_000):
        big = corpus("english", n)
        dt_ms = statistics.median([timed_ms(lambda: dt.encode(big))[1] for _ in range(5)])
        pool_ms = statistics.median([timed_ms(lambda: pool.encode(big))[1] for _ in range(5)])
        got = pool.encode(big).to_numpy()
        assert np.array_equal(got, dt.encode(big).to_numpy())
        print(f"stateless {n:,} chars: in-process {dt_ms:.1f} ms, pool {pool_ms:.1f} ms -> "
              f"{pool_ms / dt_ms:.2f}x of in-process (target <= 1.2x); placed here: "
              f"{pool.stats.get('placed_here', 0)}")
    print(f"extend at 100K adds {added_extend_100k:.2f} ms median over in-process (target <= 1.5 ms)")


def idle_calls(pool, dt, path, ref, turns: int = 25, sleep_s: float = 0.030) -> None:
    """Issue 27: a session call's floor when the caller waited 30 ms before it (a server between
    requests), each call after its own sleep, alternating: the pool's no-op (extend with an empty
    delta) and extend, the worker's own call without the pool (``WorkerService``, in this process,
    no transport), and the in-process extend."""
    from delta_ray.actors.worker import WorkerService
    print("\n## After a 30 ms idle (median ms, each call after its own sleep; 100K-character sessions, +1.3K a turn)")
    src = corpus("code", 400_000)
    n = 100_000
    svc = WorkerService(DeltaTokenizer(path, engine=ENGINE).core, b"bench")  # a worker holds the core
    pool.encode(src[:n], session="idle-p")
    dt.encode(src[:n], session="idle-d")
    version, _, _ = svc.encode_session("idle-w", src[:n], None)
    times = {k: [] for k in ("pool no-op", "pool extend", "worker extend", "in-process extend")}
    text = src[:n]
    for t in range(turns):
        delta = src[n + t * 1300:n + (t + 1) * 1300]
        text += delta
        calls = {"pool no-op": lambda: pool.extend("idle-p", ""),
                 "pool extend": lambda: pool.extend("idle-p", delta),
                 "worker extend": lambda: svc.extend("idle-w", delta, version, version),
                 "in-process extend": lambda: dt.extend("idle-d", delta)}
        order = list(calls)
        order = order[t % 4:] + order[:t % 4]
        if order.index("pool no-op") > order.index("pool extend"):  # the no-op must see the extended state
            order.remove("pool no-op")
            order.insert(order.index("pool extend") + 1, "pool no-op")
        got = idle_round(calls, order, sleep_s, times)
        version = got["worker extend"][0]
    want = np.asarray(ref.encode(text).ids, dtype=np.int32)
    assert np.array_equal(got["pool extend"].to_numpy(), want)
    assert np.array_equal(got["in-process extend"].to_numpy(), want)
    print("".join(f"{k:>20}" for k in times))
    print("".join(f"{statistics.median(v):>20.3f}" for v in times.values()))


# -- open-loop replay -----------------------------------------------------------------------------
def workload(rate, duration, n_sessions, seed, first=100_000, append=1300, doc_share=0.023, bursts=0):
    """(arrival_s, kind, key, text) sorted by arrival; sessions grow by ~append per turn."""
    rnd = random.Random(seed)
    src = corpus("code", 4_000_000)
    eng = corpus("english", 4_000_000)
    offsets = {f"s{i}": rnd.randrange(len(src) - first - 200_000) for i in range(n_sessions)}
    lengths = {k: 0 for k in offsets}
    out, t = [], 0.0
    while True:
        t += rnd.expovariate(rate)
        if t > duration:
            break
        if rnd.random() < doc_share:
            n = rnd.randint(32_000, 100_000)
            s = rnd.randrange(len(eng) - n)
            out.append((t, "doc", None, eng[s:s + n]))
            continue
        key = rnd.choice(list(offsets))
        lengths[key] = first if lengths[key] == 0 else lengths[key] + rnd.randint(append // 2, append * 3 // 2)
        o = offsets[key]
        out.append((t, "turn", key, src[o:o + lengths[key]]))
    if bursts:
        doc = eng[:bursts]
        for i, b in enumerate(np.arange(1.0, duration, 2.0)):
            for j in range(4):  # every document distinct, so no content reuse can hide the work
                r = (i * 4 + j) * 7919 + 1
                out.append((float(b), "burst", None, doc[r:] + doc[:r]))
    out.sort(key=lambda r: r[0])
    return out


async def replay(reqs, submit):
    """Open loop: each request is due at its arrival; a session's next turn waits for its previous one."""
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.2
    lat: dict[str, list[float]] = {"turn": [], "doc": [], "burst": []}
    chains: dict[str, asyncio.Future] = {}

    async def one(arrival, kind, key, text, prev):
        await asyncio.sleep(max(0.0, t0 + arrival - loop.time()))
        if prev is not None:
            await prev
        await submit(kind, key, text)
        lat[kind].append((loop.time() - (t0 + arrival)) * 1e3)

    tasks = []
    for arrival, kind, key, text in reqs:
        prev = chains.get(key) if key else None
        task = asyncio.ensure_future(one(arrival, kind, key, text, prev))
        if key:
            chains[key] = task
        tasks.append(task)
    await asyncio.gather(*tasks)
    return lat


def pct(xs, q):
    return float(np.percentile(xs, q)) if xs else float("nan")


def run_system(name, reqs, ref_path, pool=None):
    if name == "pool":
        async def submit(kind, key, text):
            await pool.encode_async(text, session=key)
        return asyncio.run(replay(reqs, submit))
    # Reference and in-process serve from one thread, as a serving engine's tokenizer stage does.
    ex = cf.ThreadPoolExecutor(1)
    if name == "reference":
        tok = Tokenizer.from_file(ref_path)
        fn = lambda kind, key, text: tok.encode(text).ids  # noqa: E731
    else:
        dt = DeltaTokenizer(ref_path, engine=ENGINE)
        fn = lambda kind, key, text: dt.encode(text, session=key)  # noqa: E731

    async def submit(kind, key, text):
        await asyncio.get_running_loop().run_in_executor(ex, fn, kind, key, text)
    try:
        return asyncio.run(replay(reqs, submit))
    finally:
        ex.shutdown()


def rate_sweep(path, pool, rates, duration, sessions):
    print(f"\n## Open-loop replay: {sessions} sessions, first turns 100K, ~1.3K appends, 2.3% documents, "
          f"{duration:.0f} s per point")
    print(f"{'rate/s':>7}{'system':>12}{'turn P50 ms':>13}{'turn P99 ms':>13}{'requests':>10}")
    results = {}
    for rate in rates:
        reqs = workload(rate, duration, sessions, seed=int(rate * 100))
        for system in ("reference", "in-process", "pool"):
            lat = run_system(system, reqs, path, pool)
            turns = lat["turn"]
            results[(system, rate)] = (pct(turns, 50), pct(turns, 99))
            print(f"{rate:>7g}{system:>12}{pct(turns, 50):>13.1f}{pct(turns, 99):>13.1f}{len(turns):>10}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        OUT.mkdir(exist_ok=True)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for system, color in (("reference", "tab:red"), ("in-process", "tab:blue"), ("pool", "tab:green")):
            xs = [r for r in rates]
            ax.plot(xs, [results[(system, r)][0] for r in rates], "o--", color=color, label=f"{system} P50")
            ax.plot(xs, [results[(system, r)][1] for r in rates], "o-", color=color, label=f"{system} P99")
        ax.set_xlabel("offered rate (requests/s)")
        ax.set_ylabel("turn latency (ms)")
        ax.set_yscale("log")
        ax.set_title("delta-ray: turn latency vs offered rate (open loop)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(OUT / "latency_vs_rate.png", dpi=110)
        print(f"plot: {OUT / 'latency_vs_rate.png'}")
    except ImportError:
        print("matplotlib not installed: no plot")
    return results


def burst_bench(path, rate, duration, sessions, num_workers, burst_chars):
    print(f"\n## Bursts: four {burst_chars:,}-character documents every 2 s on top of {rate:g} turns/s")
    print(f"{'documents':>20}{'policy':>16}{'turn P50 ms':>13}{'turn P99 ms':>13}{'burst P50 ms':>14}")
    reqs = workload(rate, duration, sessions, seed=7, doc_share=0.0, bursts=burst_chars)
    out = {}
    for mode in ("whole", "chunked", "chunked, workers too"):
        for policy in ("fifo", "shortest_first"):
            cut = 10 ** 9 if mode == "whole" else 131072
            # "chunked" (the default): chunks run on the Ray task pool only, so a turn never waits
            # behind a chunk on its home worker (it still shares the cores). "workers too": idle
            # session workers also take chunks (the better head of their two queues).
            with TokenizerPool(path, num_workers=num_workers, policy=policy, cut_threshold=cut, engine=ENGINE,
                               workers_take_shared=(mode == "chunked, workers too")) as pool:
                lat = run_system("pool", reqs, path, pool)
            out[(mode, policy)] = pct(lat["turn"], 99)
            print(f"{mode:>20}{policy:>16}{pct(lat['turn'], 50):>13.1f}{pct(lat['turn'], 99):>13.1f}"
                  f"{pct(lat['burst'], 50):>14.0f}")
    for policy in ("fifo", "shortest_first"):
        for mode in ("chunked", "chunked, workers too"):
            w, c = out[("whole", policy)], out[(mode, policy)]
            print(f"{policy}, {mode}: turn P99 whole {w:.0f} -> chunked {c:.0f} ms ({w / c:.2f}x; target >= 2x)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="qwen-3")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--rates", default="2,4,8,16")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--engine", default="reference", choices=("reference", "auto", "fast"),
                    help="encoder inside the pool (reference: the scheduling experiments the targets "
                         "were set for; with the fast tier a 250K document costs a few ms)")
    ap.add_argument("--burst-chars", type=int, default=None,
                    help="size of each burst document (default 1M on 8+ cores, scaled down on fewer: "
                         "four 1M documents every 2 s exceed what 2 cores can encode)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: single,idle,sweep,burst")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    path = bundled_tokenizer_path(args.tokenizer)
    ref = Tokenizer.from_file(path)
    ray.init(**local_init_kwargs())
    workers = args.workers or int(ray.cluster_resources()["CPU"])
    print(f"# bench_pool: tokenizer {args.tokenizer}, {workers} workers on {os.cpu_count()} cores, "
          f"engine {args.engine}")
    global ENGINE
    ENGINE = args.engine
    try:
        with TokenizerPool(path, num_workers=workers, engine=args.engine) as pool:
            dt = DeltaTokenizer(path, engine=args.engine)
            if "single" not in skip:
                single_calls(pool, dt, ref, args.quick)
            if "idle" not in skip:
                idle_calls(pool, dt, path, ref)
            if "sweep" not in skip:
                rates = [float(r) for r in args.rates.split(",")]
                rate_sweep(path, pool, rates[:2] if args.quick else rates,
                           5.0 if args.quick else args.duration, 8 if args.quick else args.sessions)
        if "burst" not in skip:
            burst_chars = args.burst_chars or max(250_000, min(1_000_000, 1_000_000 * workers // 8))
            burst_bench(path, 4.0, 6.0 if args.quick else 12.0, 8 if args.quick else args.sessions, workers,
                        burst_chars)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
