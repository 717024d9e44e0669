"""What delta-ray adds over the reference alone, side by side in one run, under tokenizers 1.x.

Under tokenizers 1.x the reference itself encodes about as fast as the fast tier did under 0.x, so
this benchmark asks what is left for delta-ray: session turns (a transcript re-sent every turn at
100K and 1M characters: the session re-encodes the tail, the reference alone re-encodes it whole),
batch (many documents: ``DeltaTokenizer.encode_batch`` against the reference's ``encode_batch``),
one long stateless text, and the pool (session turns through ``TokenizerPool`` when Ray is
installed). Every delta-ray answer timed here is compared with the reference. Only ratios measured
in this run are printed; no absolute time is asserted.

    .venv-tk1/bin/python bench/bench_tk1.py [--tokenizer qwen-3] [--quick]

(``python3 bootstrap.py test`` builds .venv-tk1, without Ray: for the pool rows,
``.venv-tk1/bin/pip install 'ray==2.60.0'`` first. The bench runs under 0.x too, for comparison.)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from bench.harness import timed_ms  # noqa: E402
from delta_ray import DeltaTokenizer  # noqa: E402
from delta_ray._core.reference_api import describe, encode_batch_ids, ids_of  # noqa: E402
from delta_ray.apps.bundled import bundled_tokenizer_path  # noqa: E402
from delta_ray.apps.sample_text import corpus  # noqa: E402


def ref_ids(ref, text, add=True):
    return ids_of(ref.encode(text, add_special_tokens=add))


def session_turns(path, ref, n, turns, append, engine):
    src = corpus("english", n + (turns + 1) * append + 10_000)
    dt = DeltaTokenizer(path, engine=engine, shadow_rate=0.0)
    text = src[:n]
    dt.encode(text, session="s")
    ours, whole, bad = [], [], 0
    for t in range(turns):
        text += src[n + t * append:n + (t + 1) * append]
        got, a = timed_ms(lambda: dt.encode(text, session="s"))
        want, b = timed_ms(lambda: ref_ids(ref, text))
        ours.append(a)
        whole.append(b)
        bad += not np.array_equal(got.to_numpy(), want)
    return statistics.median(ours), statistics.median(whole), bad


def pool_turns(path, ref, n, turns, append, engine):
    try:
        import ray  # noqa: F401
    except ImportError:
        return None
    from delta_ray import TokenizerPool
    src = corpus("english", n + (turns + 1) * append + 10_000)
    with TokenizerPool(path, num_workers=2, engine=engine) as pool:
        text = src[:n]
        pool.encode(text, session="p")
        ours, whole, bad = [], [], 0
        for t in range(turns):
            text += src[n + t * append:n + (t + 1) * append]
            got, a = timed_ms(lambda: pool.encode(text, session="p"))
            want, b = timed_ms(lambda: ref_ids(ref, text))
            ours.append(a)
            whole.append(b)
            bad += not np.array_equal(np.asarray(got), want)
    return statistics.median(ours), statistics.median(whole), bad


def batch(path, ref, docs, engine):
    dt = DeltaTokenizer(path, engine=engine, shadow_rate=0.0)
    dt.encode_batch(docs[:8])
    got, a = timed_ms(lambda: dt.encode_batch(docs))
    want, b = timed_ms(lambda: encode_batch_ids(ref, docs, True))
    bad = sum(not np.array_equal(g.to_numpy(), w) for g, w in zip(got, want))
    return a, b, bad


def long_text(path, ref, n, engine):
    text = corpus("english", n)[:n]
    dt = DeltaTokenizer(path, engine=engine, shadow_rate=0.0)
    dt.encode(text[:200_000])
    a = min(timed_ms(lambda: dt.encode(text))[1] for _ in range(3))
    b = min(timed_ms(lambda: ref_ids(ref, text))[1] for _ in range(3))
    bad = not np.array_equal(dt.encode(text).to_numpy(), ref_ids(ref, text))
    return a, b, int(bad)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default="qwen-3")
    ap.add_argument("--engine", default="auto", help="delta-ray's engine (auto, reference, fast)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("DELTA_RAY_FAST_BACKGROUND", "0")
    path = bundled_tokenizer_path(args.tokenizer)
    ref = Tokenizer.from_file(path)
    turns = 5 if args.quick else 15
    print(f"reference: tokenizers {describe()['tokenizers']} (API {describe()['api']}.x); "
          f"tokenizer {args.tokenizer}; delta-ray engine={args.engine}; {os.cpu_count()} CPUs")
    print(f"{'what':<44} {'delta-ray ms':>13} {'reference ms':>13} {'ratio':>8} {'wrong':>6}")

    def row(what, res):
        if res is None:
            print(f"{what:<44} {'(skipped: Ray is not installed here)':>42}")
            return
        a, b, bad = res
        print(f"{what:<44} {a:>13.2f} {b:>13.2f} {b / a:>7.1f}x {bad:>6}")

    for n in (100_000, 1_000_000):
        row(f"session turn +1.3K at {n // 1000}K chars (median)",
            session_turns(path, ref, n, turns, 1300, args.engine))
    for n in (100_000, 1_000_000):
        row(f"pool session turn +1.3K at {n // 1000}K (median)",
            pool_turns(path, ref, n, max(3, turns // 3), 1300, args.engine))
    src = corpus("english", 4_000_000)
    size = 2000
    docs = [src[i:i + size] for i in range(0, (500 if args.quick else 2000) * size, size)]
    row(f"batch: {len(docs)} docs of {size} chars", batch(path, ref, docs, args.engine))
    row("one stateless text of 1M chars (best of 3)", long_text(path, ref, 1_000_000, args.engine))
    print("ratio = reference ms / delta-ray ms (above 1: delta-ray is faster); wrong = answers that differ")


if __name__ == "__main__":
    main()
