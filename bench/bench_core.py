"""Core benchmarks (issue: exact core), printed as ratios measured side by side in one run.

1. Session repair vs a full reference re-encode of the transcript, 1.3K-character appends, at 16K,
   100K, 1M and 3M characters (English and code), and the repair against encoding the append alone.
2. Stateless chunked in-process encode vs the serial reference at 1M and 4M; planner share.
3. Texts under 4 KB: DeltaTokenizer.encode overhead over the reference encode.

Usage: python bench/bench_core.py [--tokenizer qwen-3] [--quick]
Uses ../shared/corpus when present, else the Python standard library's text.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tokenizers import Tokenizer  # noqa: E402

from bench.harness import timed_ms  # noqa: E402
from delta_ray import DeltaTokenizer  # noqa: E402
from delta_ray.apps.bundled import bundled_tokenizer_path  # noqa: E402
from delta_ray.apps.sample_text import corpus  # noqa: E402

ENGINE = "reference"  # set by --engine


def repair_bench(ref, path, kinds, sizes, append=1300):
    """Phases run apart so no operation pays for another's cache and allocator churn: the repairs
    (whole transcript), the extends, the appends alone on a separate reference instance (its BPE
    cache as cold as the repair's), then the full reference re-encodes and the comparisons."""
    print(f"\n## Session repair: +{append}-char appends (median over turns; every result checked)")
    print(f"{'text':<8}{'chars':>10}{'turns':>6}{'reference ms':>14}{'repair ms':>11}{'speed-up':>10}"
          f"{'extend ms':>11}{'append-alone ms':>17}{'repair/append':>15}")
    rows = []
    for kind in kinds:
        src = corpus(kind, max(sizes) + 40 * append)
        for n in sizes:
            turns = 3 if n >= 3_000_000 else 5 if n >= 1_000_000 else 15
            texts = [src[:n + (i + 1) * append] for i in range(turns)]
            deltas = [src[n + i * append:n + (i + 1) * append] for i in range(turns)]
            alone = Tokenizer.from_file(path)
            a_ms = [timed_ms(lambda: alone.encode(d))[1] for d in deltas]
            dt = DeltaTokenizer(path, engine=ENGINE)
            dt.encode(src[:n], session="s")
            got, d_ms = zip(*[timed_ms(lambda: dt.encode(t, session="s")) for t in texts])
            dt2 = DeltaTokenizer(path, engine=ENGINE)
            dt2.encode(src[:n], session="e")
            got_e, e_ms = zip(*[timed_ms(lambda: dt2.extend("e", d)) for d in deltas])
            r_ms = []
            for t, g, ge in zip(texts, got, got_e):
                want, tr = timed_ms(lambda: ref.encode(t).ids)
                assert g.to_pylist() == want and ge.to_pylist() == want, (kind, n)
                r_ms.append(tr)
                del want
            r, d, e, a = (statistics.median(x) for x in (r_ms, d_ms, e_ms, a_ms))
            rows.append((kind, n, r / d, r / e))
            print(f"{kind:<8}{n:>10,}{turns:>6}{r:>14.1f}{d:>11.2f}{r / d:>9.0f}x{e:>11.2f}{a:>17.2f}{d / a:>14.2f}x")
    return rows


def stateless_bench(ref, path, sizes, kind="english"):
    print("\n## Stateless: chunked in-process encode vs the serial reference (checked)")
    print(f"{'chars':>10}{'chunks':>8}{'reference ms':>14}{'delta-ray ms':>14}{'speed-up':>10}{'planner ms':>12}"
          f"{'planner share':>15}")
    dt = DeltaTokenizer(path, engine=ENGINE)
    for n in sizes:
        text = corpus(kind, n)
        want, tr = timed_ms(lambda: ref.encode(text).ids)
        want2, tr2 = timed_ms(lambda: ref.encode(text).ids)
        tr = min(tr, tr2)
        del want2
        times = []
        for _ in range(2):
            got, td = timed_ms(lambda: dt.encode(text))
            times.append(td)
        assert got.to_pylist() == want
        cuts, tp = timed_ms(lambda: dt.cuts(text))
        td = min(times)
        print(f"{n:>10,}{len(cuts) + 1:>8}{tr:>14.0f}{td:>14.0f}{tr / td:>9.2f}x{tp:>12.2f}{tp / td:>14.2%}")


def short_bench(ref, path, n_texts=2000):
    print("\n## Texts under 4 KB: DeltaTokenizer.encode vs reference encode (same texts, checked)")
    dt = DeltaTokenizer(path, engine=ENGINE)
    src = corpus("english", 2_000_000)
    texts = [src[i * 997:i * 997 + 200 + (i * 37) % 3800] for i in range(n_texts)]
    for t in texts[:50]:
        assert dt.encode(t).to_pylist() == ref.encode(t).ids
    best_r, best_d = float("inf"), float("inf")
    for _ in range(3):
        _, tr = timed_ms(lambda: [ref.encode(t).ids for t in texts])
        _, td = timed_ms(lambda: [dt.encode(t) for t in texts])
        best_r, best_d = min(best_r, tr), min(best_d, td)
    print(f"{n_texts} texts of 200-4000 chars: reference {best_r:.0f} ms, delta-ray {best_d:.0f} ms, "
          f"overhead {best_d / best_r - 1:+.1%}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="qwen-3")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (CI smoke)")
    ap.add_argument("--engine", default="reference", choices=("reference", "fast", "auto"),
                    help="the encoder inside the cuts (issue targets are for the reference engine)")
    args = ap.parse_args()
    global ENGINE
    ENGINE = args.engine
    path = bundled_tokenizer_path(args.tokenizer)
    ref = Tokenizer.from_file(path)
    print(f"# bench_core: tokenizer {args.tokenizer}, engine {args.engine}: "
          f"{DeltaTokenizer(path, engine=args.engine).admission.engine}")
    sizes = [16_000, 100_000] if args.quick else [16_000, 100_000, 1_000_000, 3_000_000]
    rows = repair_bench(ref, path, ["english", "code"], sizes)
    stateless_bench(ref, path, [200_000] if args.quick else [1_000_000, 4_000_000])
    short_bench(ref, path, 300 if args.quick else 2000)
    print("\n## Targets")
    for kind, n, ratio, ratio_e in rows:
        target = 200 if n == 1_000_000 else 30 if n == 100_000 else None
        if target:
            print(f"repair {kind} {n:,}: {ratio:.0f}x with the whole transcript, {ratio_e:.0f}x with extend "
                  f"(target >= {target}x) {'OK' if ratio >= target else 'MISSED'}")


if __name__ == "__main__":
    main()
