"""Session turns in process while other sessions are served in between, against a fast engine
re-encoding the whole text in the caller (the strongest alternative), side by side in one run.

A server interleaves sessions: between two turns of one session it serves the others, so caches
and the allocator are not warm for it. Here ``--sessions`` sessions of one context size take turns
(+1.3K characters each), round robin; each turn is timed and checked against the reference.

    .venv/bin/python bench/bench_turns.py [--tokenizer qwen-3] [--engine fast] [--quick]

Targets (issue: never slower than the caller's own process): a turn at 1M characters <= 0.2 ms
median, <= 1.5x the turn at 16K, and >= 20x a whole fastokens re-encode of the same text.
The whole-transcript turn must compare the new text with the stored one (design §5: 4 MB read at
1M characters of UCS-2 text); an ``extend`` receives only the append, and the harness never joins
the transcript for it, as a server receiving appends would not.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tokenizers import Tokenizer  # noqa: E402

from delta_ray import DeltaTokenizer  # noqa: E402
from delta_ray.bundled import bundled_tokenizer_path  # noqa: E402
from delta_ray.sample_text import corpus  # noqa: E402


def run(path, engine, n, sessions, turns, append, ref, check_every):
    src = corpus("english", n + sessions * (turns + 1) * append + 10_000)
    dt = DeltaTokenizer(path, engine=engine, shadow_rate=0.0)
    parts = {}  # each session's text as the pieces it arrived in: an append-only client never
    for s in range(sessions):  # sends (nor a server builds) the whole transcript
        base = src[s * 997:s * 997 + n]
        dt.encode(base, session=f"s{s}")
        parts[s] = [base]
    fast = getattr(dt.core.engine_switch.current, "fast", None)
    turn_ms, ext_ms, to_check, whole_texts = [], [], [], []
    churn = []
    for t in range(turns):
        for s in range(sessions):
            delta = src[n + (t * sessions + s) * append:n + (t * sessions + s + 1) * append]
            parts[s].append(delta)
            churn.append(bytearray(1 << 16))  # the server allocates between turns
            if len(churn) > 64:
                churn.pop(0)
            if t % 2 == 0:  # whole transcript sent (parsed from the request before the turn starts)
                text = "".join(parts[s])
                parts[s] = [text]
                t0 = time.perf_counter()
                got = dt.encode(text, session=f"s{s}")
                turn_ms.append((time.perf_counter() - t0) * 1e3)
            else:  # only the append sent
                t0 = time.perf_counter()
                got = dt.extend(f"s{s}", delta)
                ext_ms.append((time.perf_counter() - t0) * 1e3)
            if (t * sessions + s) % check_every == 0:
                to_check.append((tuple(parts[s]), got))  # checked after the timed loop: checks thrash caches
            if s == 0:
                whole_texts.append(tuple(parts[s]))
    whole_ms = []
    if fast is not None:  # the alternative: the same fast engine re-encoding the whole text
        for text in map("".join, whole_texts):
            t0 = time.perf_counter()
            fast.encode(text)
            whole_ms.append((time.perf_counter() - t0) * 1e3)
    for text, got in ((("".join(p)), g) for p, g in to_check):
        assert got.to_pylist() == ref.encode(text).ids, (n, len(text))
    return (statistics.median(turn_ms), statistics.median(ext_ms),
            statistics.median(whole_ms) if whole_ms else float("nan"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="qwen-3")
    ap.add_argument("--engine", default="fast", choices=("fast", "auto", "reference"))
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    path = bundled_tokenizer_path(args.tokenizer)
    ref = Tokenizer.from_file(path)
    sizes = [16_000, 100_000] if args.quick else [16_000, 100_000, 1_000_000]
    print(f"# bench_turns: {args.tokenizer}, engine {args.engine}, {args.sessions} sessions round robin, "
          f"+1,300 chars a turn, 64 KiB allocated between turns")
    print(f"{'context':>10}{'turn ms':>10}{'extend ms':>11}{'fast whole ms':>15}{'whole/turn':>12}{'whole/extend':>14}")
    rows = {}
    for n in sizes:
        turn, ext, whole = run(path, args.engine, n, args.sessions, args.turns, 1300, ref,
                               check_every=7 if n < 1_000_000 else 13)
        rows[n] = (turn, ext, whole)
        print(f"{n:>10,}{turn:>10.3f}{ext:>11.3f}{whole:>15.2f}{whole / turn:>11.1f}x{whole / ext:>13.1f}x")
    if 1_000_000 in rows:
        t1, e1, w1 = rows[1_000_000]
        t16 = rows[16_000][0]
        print("\n## Targets")
        print(f"turn at 1M: {t1:.3f} ms median (<= 0.2) {'OK' if t1 <= 0.2 else 'MISSED'}; "
              f"extend {e1:.3f} ms {'OK' if e1 <= 0.2 else 'MISSED'}")
        print(f"turn at 1M / turn at 16K: {t1 / t16:.2f}x (<= 1.5) {'OK' if t1 / t16 <= 1.5 else 'MISSED'}")
        print(f"fast whole / turn at 1M: {w1 / t1:.0f}x (>= 20) {'OK' if w1 / t1 >= 20 else 'MISSED'}")


if __name__ == "__main__":
    main()
