"""Session turns in process while other sessions are served in between, against a fast engine
re-encoding the whole text in the caller (the strongest alternative), side by side in one run.

A server interleaves sessions: between two turns of one session it serves the others, so caches
and the allocator are not warm for it. Here ``--sessions`` sessions of one context size take turns
(+1.3K characters each), round robin; each turn is timed and checked against the reference.

    .venv/bin/python bench/bench_turns.py [--tokenizer qwen-3] [--engine fast] [--quick]

Targets (issue: never slower than the caller's own process): a turn at 1M characters <= 0.2 ms
median, <= 1.5x the turn at 16K, and >= 20x a whole fastokens re-encode of the same text.

``--idle`` (issue 27): a server waits between requests. Each call is timed after its own 30 ms
sleep, delta-ray and the peer alternating (the order rotates every turn), on ChatML transcripts
(+1 message of about 1.3K characters a turn). The peer is fastokens in the caller's process
re-encoding the whole transcript (``encode_batch_flat``, IDs as a numpy view), with its segment
cache (which caches the text between added tokens across requests) and without. Targets: ``extend``
>= 1.0x the better peer at 16K, >= 2x at 100K, >= 10x at 1M; the whole-transcript turn >= 1.0x at
100K. Beside them, an oracle's turn (``floor``: one fastokens call on the append alone, wrapped in
Arrow, as if the cut, the kept IDs and the splice were free) bounds what any Python turn answering
in Arrow can reach against the peer. ``--cold`` (issue 26): ``extend`` after the process touched 64 MB of other memory,
16K to 2M. The whole-transcript turn must compare the new text with the stored one (docs/proof.md §5: 4 MB read at
1M characters of UCS-2 text); an ``extend`` receives only the append, and the harness never joins
the transcript for it, as a server receiving appends would not. ``--tail``: the turn's P99 and
maximum back to back, with the compact turn's joins from pyarrow's default pool (mimalloc) against
the C allocator it uses, two sessions alternating in one run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tokenizers import Tokenizer  # noqa: E402

from bench.harness import idle_round  # noqa: E402
from bench.peers.in_process import Fastokens  # noqa: E402
from delta_ray import DeltaTokenizer  # noqa: E402
from delta_ray.apps.bundled import bundled_tokenizer_path  # noqa: E402
from delta_ray.apps.sample_text import corpus  # noqa: E402


def run(path, engine, n, sessions, turns, append, ref, check_every):
    src = corpus("english", n + sessions * (turns + 1) * append + 10_000)
    dt = DeltaTokenizer(path, engine=engine, shadow_rate=0.0)
    parts = {}  # each session's text as the pieces it arrived in: an append-only client never
    for s in range(sessions):  # sends (nor a server builds) the whole transcript
        base = src[s * 997:s * 997 + n]
        dt.encode(base, session=f"s{s}")
        parts[s] = [base]
    tier = dt.core.engine.now().tier
    fast = tier.fast if tier is not None else None
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


def chat_transcript(n_chars: int, src: str, msg: int = 1280) -> list[str]:
    """ChatML messages of about ``msg`` characters each, covering at least ``n_chars`` characters."""
    out, i, total = [], 0, 0
    while total < n_chars:
        role = "user" if len(out) % 2 == 0 else "assistant"
        m = f"<|im_start|>{role}\n{src[i % (len(src) - msg):i % (len(src) - msg) + msg]}<|im_end|>\n"
        out.append(m)
        total += len(m)
        i += msg + 7
    return out


def _floor(path: str):
    """The least any Python turn that answers in Arrow can do, an oracle's turn: one fastokens call on
    the append alone (as if the cut, the kept IDs and the splice were free), its buffer wrapped as an
    Int32Array, and the answer as the kept chunk plus it. Its answer is not the session's IDs (the
    append's boundary is not a safe cut), so it is timed, never checked: an upper bound on the
    ratio any such turn can reach against the peer (issue 27)."""
    import fastokens
    import pyarrow as pa
    tok = fastokens.Tokenizer.from_json_str(open(path, encoding="utf-8").read())
    int32 = pa.int32()

    def turn(kept, delta: str):
        buf, _ = tok.encode_batch_flat([delta], add_special_tokens=False)
        new = pa.Array.from_buffers(int32, len(buf) >> 2, [None, pa.py_buffer(buf)])
        return pa.chunked_array([kept, new], type=int32)
    return turn


def idle_run(path, engine, n, turns, ref, sleep_s=0.030):
    """One context size under the idle protocol: medians of extend, whole turn, and both peers (ms)."""
    import numpy as np
    src = corpus("english", 400_000)
    msgs = chat_transcript(n + (turns + 1) * 1400, src)
    k0, total = 0, 0
    while total < n:
        total += len(msgs[k0])
        k0 += 1
    base = "".join(msgs[:k0])
    dt = DeltaTokenizer(path, engine=engine)  # the default shadow rate, as a server runs it
    dt.encode(base, session="e")
    dt.encode(base, session="w")
    # fastokens in the caller's process, the strongest alternative: a whole re-encode per request
    peers = {"ft_cache": Fastokens(path, segment_cache=True, cache_bytes=256 << 20).ids,
             "ft_nocache": Fastokens(path).ids}
    for enc in peers.values():
        enc(base)  # the segment cache has seen the transcript so far, as in a server
    floor, kept = _floor(path), dt.extend("e", "").chunk(0)
    times = {k: [] for k in ("extend", "turn", "ft_cache", "ft_nocache", "floor")}
    parts, checks = [base], []
    for t in range(turns):
        delta = msgs[k0 + t]
        parts.append(delta)
        text = "".join(parts)  # parsed from the request before the turn starts
        parts = [text]
        calls = {"extend": lambda: dt.extend("e", delta),
                 "turn": lambda: dt.encode(text, session="w"),
                 "ft_cache": lambda: peers["ft_cache"](text),
                 "ft_nocache": lambda: peers["ft_nocache"](text),
                 "floor": lambda: floor(kept, delta)}
        order = list(calls)
        order = order[t % 5:] + order[:t % 5]
        got = idle_round(calls, order, sleep_s, times)
        del got["floor"]  # timed only (see _floor)
        if (t % 5 == 0 and n < 500_000) or t == turns - 1:  # a 1M reference encode takes seconds
            checks.append((text, got))
    for text, got in checks:  # after the timed loop: checks thrash caches
        want = np.asarray(ref.encode(text).ids, dtype=np.int32)
        for name, ids in got.items():
            ids = ids.to_numpy() if hasattr(ids, "to_numpy") else ids
            assert np.array_equal(np.asarray(ids).astype(np.int32), want), (name, n, len(text))
    return {k: statistics.median(v) for k, v in times.items()}


def idle_table(path, engine, sizes, turns, ref) -> dict:
    print(f"\n# idle protocol: each call after its own 30 ms sleep, delta-ray and fastokens alternating; "
          f"ChatML transcripts, +1 message (~1.3K chars) a turn, {turns} turns, medians in ms")
    print(f"{'context':>10}{'extend':>9}{'turn':>9}{'ft+cache':>10}{'ft':>9}{'floor':>8}{'peer/extend':>13}"
          f"{'peer/turn':>11}{'peer/floor':>12}")
    rows = {}
    for n in sizes:
        r = idle_run(path, engine, n, turns, ref)
        peer = min(r["ft_cache"], r["ft_nocache"])
        rows[n] = r
        print(f"{n:>10,}{r['extend']:>9.3f}{r['turn']:>9.3f}{r['ft_cache']:>10.3f}{r['ft_nocache']:>9.3f}"
              f"{r['floor']:>8.3f}{peer / r['extend']:>12.2f}x{peer / r['turn']:>10.2f}x{peer / r['floor']:>11.2f}x")
    print("floor: an oracle's turn (one fastokens call on the append alone, wrapped in Arrow; timed, not an "
          "answer): peer/floor bounds what any Python turn answering in Arrow can reach")
    goals = {16_000: 1.0, 100_000: 2.0, 1_000_000: 10.0}
    print("## idle targets (peer = the faster fastokens form)")
    for n, want in goals.items():
        if n in rows:
            r = rows[n]
            ratio = min(r["ft_cache"], r["ft_nocache"]) / r["extend"]
            bound = min(r["ft_cache"], r["ft_nocache"]) / r["floor"]
            print(f"extend at {n:,}: {ratio:.2f}x the peer (>= {want}) {'OK' if ratio >= want else 'MISSED'}"
                  f"; the oracle floor reaches {bound:.2f}x"
                  f"{'' if bound >= want else ' (the target is below the floor)'}")
    if 100_000 in rows:
        r = rows[100_000]
        ratio = min(r["ft_cache"], r["ft_nocache"]) / r["turn"]
        print(f"whole-transcript turn at 100,000: {ratio:.2f}x the peer (>= 1.0) {'OK' if ratio >= 1.0 else 'MISSED'}")
    return rows


def touch(buf) -> None:
    """Write every page of ``buf`` (64 MB of other memory: the caches and TLB go cold)."""
    buf[::4096] = 1
    buf[1::4096] = 2


def cold_table(path, engine, sizes, turns, ref) -> dict:
    """Issue 26: extend after the process touched 64 MB of other memory; O(append) means flat."""
    import numpy as np
    print(f"\n# cold caches: extend after touching 64 MB of other memory, {turns} turns, medians in ms")
    print(f"{'context':>10}{'extend':>9}{'hot extend':>12}")
    other = np.zeros(64 << 20, dtype=np.uint8)
    src = corpus("english", 400_000)
    rows = {}
    for n in sizes:
        msgs = chat_transcript(n + (turns + 1) * 1400, src)
        k0, total = 0, 0
        while total < n:
            total += len(msgs[k0])
            k0 += 1
        dt = DeltaTokenizer(path, engine=engine, shadow_rate=0.0)
        text = "".join(msgs[:k0])
        dt.encode(text, session="c")
        cold, hot = [], []
        for t in range(turns):
            delta = msgs[k0 + t]
            text += delta
            if t % 2 == 0:
                touch(other)  # even turns on cold caches, odd turns right after the previous one
            t0 = time.perf_counter()
            got = dt.extend("c", delta)
            (cold if t % 2 == 0 else hot).append((time.perf_counter() - t0) * 1e3)
        assert np.array_equal(got.to_numpy(), np.asarray(ref.encode(text).ids, dtype=np.int32)), n
        rows[n] = statistics.median(cold)
        print(f"{n:>10,}{rows[n]:>9.3f}{statistics.median(hot):>12.3f}")
    if 16_000 in rows and 1_000_000 in rows:
        r = rows[1_000_000] / rows[16_000]
        print(f"## cold target: extend at 1M {rows[1_000_000]:.3f} ms (<= 0.2) "
              f"{'OK' if rows[1_000_000] <= 0.2 else 'MISSED'}; 1M / 16K {r:.2f}x (<= 1.5) "
              f"{'OK' if r <= 1.5 else 'MISSED'}")
    return rows


def tail_table(path, engine, sizes, turns, ref) -> dict:
    """The turn's tail back to back, side by side: joins from pyarrow's default pool (mimalloc on
    Linux) against the C allocator the compact turn uses (docs/proof.md §15), alternating turn by turn."""
    import numpy as np
    import pyarrow as pa

    from delta_ray._core import turn_path
    print(f"\n# turn tail: {turns} extends back to back per context, two sessions alternating, ms")
    print(f"{'context':>10}  {'joins from':<22}{'median':>8}{'P99':>8}{'max':>8}{'mean':>8}{'> 1 ms':>8}")
    src = corpus("code", max(sizes) + 2 * (turns + 1) * 1300 + 1000)
    pools = {"default pool (mimalloc)": pa.default_memory_pool(), "C allocator": turn_path.COPY_POOL}
    saved, rows = turn_path.COPY_POOL, {}
    try:
        for n in sizes:
            dt = DeltaTokenizer(path, engine=engine, shadow_rate=0.0)
            times = {k: [] for k in pools}
            texts = {}
            for i, k in enumerate(pools):
                texts[k] = src[i * 1000:i * 1000 + n]
                dt.encode(texts[k], session=k)
            pos = n + 1000
            for t in range(turns):
                for k, pool in pools.items():
                    delta = src[pos:pos + 1300]
                    pos += 1300
                    texts[k] += delta
                    turn_path.COPY_POOL = pool
                    t0 = time.perf_counter()
                    got = dt.extend(k, delta)
                    times[k].append((time.perf_counter() - t0) * 1e3)
                    if t == turns - 1:
                        want = np.asarray(ref.encode(texts[k]).ids, dtype=np.int32)
                        assert np.array_equal(got.to_numpy(), want), (n, k)
            for k, v in times.items():
                xs = np.asarray(v)
                rows[(n, k)] = xs
                print(f"{n:>10,}  {k:<22}{np.median(xs):>8.3f}{np.percentile(xs, 99):>8.3f}{xs.max():>8.2f}"
                      f"{xs.mean():>8.3f}{int((xs > 1).sum()):>8}")
    finally:
        turn_path.COPY_POOL = saved
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="qwen-3")
    ap.add_argument("--engine", default="fast", choices=("fast", "auto", "reference"))
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--idle", action="store_true", help="only the idle protocol (issue 27)")
    ap.add_argument("--cold", action="store_true", help="only the cold-cache extend (issue 26)")
    ap.add_argument("--idle-turns", type=int, default=25)
    ap.add_argument("--tail", action="store_true", help="only the turn's tail by allocator, back to back")
    args = ap.parse_args()
    path = bundled_tokenizer_path(args.tokenizer)
    ref = Tokenizer.from_file(path)
    sizes = [16_000, 100_000] if args.quick else [16_000, 100_000, 1_000_000]
    if args.tail:
        tail_table(path, args.engine, [100_000, 1_000_000], 400, ref)
        return
    if args.idle or args.cold:
        if args.idle:
            idle_table(path, args.engine, [16_000, 100_000, 200_000, 1_000_000], args.idle_turns, ref)
        if args.cold:
            cold_table(path, args.engine, [16_000, 100_000, 1_000_000, 2_000_000], args.idle_turns, ref)
        return
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
    # Beside the back-to-back figures: the same library after an idle, and on cold caches.
    idle_table(path, args.engine, [16_000, 100_000, 200_000, 1_000_000] if not args.quick else [16_000, 100_000],
               args.idle_turns, ref)
    cold_table(path, args.engine, [16_000, 100_000, 1_000_000, 2_000_000] if not args.quick else [16_000, 100_000],
               args.idle_turns, ref)


if __name__ == "__main__":
    main()
