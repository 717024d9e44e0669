"""In-process sections: a long stateless text, and a chat session turn by turn.

Each engine is loaded and warmed (one untimed call) before timing; each figure is the median of
several calls on different texts, engines alternating call by call. Every result is compared with
the reference's IDs after the timed loop (a reference encode between two timed calls would evict
the caches any server keeps warm for its hot paths).
"""
from __future__ import annotations

from dataclasses import dataclass

from delta_ray.apps.sample_text import chat_transcript, corpus
from delta_ray.tokenizer import DeltaTokenizer

from .baselines import Engines, chat_calls
from .report import Steps, Table, best, median, ms, ratio, size_label, timed, verdict


def stateless(eng: Engines, dt: DeltaTokenizer, sizes: list[int], calls: int) -> bool:
    """Long texts without a session: delta-ray (cut at safe cuts, chunks on every core) against
    fastokens and the reference, each encoding the whole text."""
    src = corpus("english", max(sizes) + (calls + 1) * 37_000)
    t = Table(f"Long stateless text, in process (English prose; median of {calls} calls, warm)",
              ["text", "reference", "fastokens", "delta-ray", "vs fastokens", "vs reference", "exact"])
    ok = True
    last = None
    for n in sizes:
        texts = [src[k * 37_000:k * 37_000 + n] for k in range(calls + 1)]
        fast = eng.fastokens
        dt.encode(texts[0])  # warm: engine tables, thread pool
        if fast is not None:
            fast.ids(texts[0])
        d_s, f_s, results = [], [], []
        for i, text in enumerate(texts[1:]):
            order = [0, 1] if i % 2 == 0 else [1, 0]
            for which in order:
                if which == 0:
                    got, s = timed(dt.encode, text)
                    d_s.append(s)
                    results.append(("delta-ray", text, got))
                elif fast is not None:
                    got, s = timed(fast.ids, text)
                    f_s.append(s)
                    results.append(("fastokens", text, got))
        by_engine = eng.check_all(results)
        good = [g for v in by_engine.values() for g in v]
        r_s = [eng.ref_seconds[x] for x in texts[1:]]
        exact_dr = all(by_engine["delta-ray"])
        ok &= exact_dr
        t.add(f"{size_label(n)} chars", ms(median(r_s)), ms(median(f_s)) if fast else "n/a", ms(median(d_s)),
              ratio(median(f_s), median(d_s)) if fast else "-", ratio(median(r_s), median(d_s)),
              f"{sum(good)}/{len(good)}")
        last = (n, median(r_s), median(f_s), median(d_s))
    t.print()
    n, r, f, d = last
    alt = f"fastokens {ms(f)} ({ratio(f, d)}), " if f else ""
    verdict(f"{size_label(n)} characters: delta-ray {ms(d)} against {alt}the reference {ms(r)} ({ratio(r, d)}); "
            f"{'every result equals the reference' if ok else 'MISMATCH against the reference'}")
    return ok


@dataclass
class ChatFigures:
    context: int
    ref: float | None
    fast: float | None
    fast_cached: float | None
    turn: float | None
    extend: float | None


def chat(eng: Engines, dt: DeltaTokenizer, sizes: list[int], turns: int, warm: int = 2) -> bool:
    """A chat session re-sent every turn (+1 message), in the caller's process: delta-ray's
    session (whole transcript sent, or ``extend`` with the new message only) against fastokens
    re-encoding the whole transcript, with and without its segment cache, and the reference."""
    t = Table(f"Chat session, turn by turn, in process (+1 message of ~1.3K chars a turn; median of {turns} turns, "
              "warm)",
              ["context", "reference", "fastokens", "fastokens+seg.cache", "delta-ray turn", "delta-ray extend",
               "vs best fastokens", "exact"])
    ok = True
    figs: list[ChatFigures] = []
    for n in sizes:
        initial, deltas = chat_transcript(n, warm + turns, seed=n)
        fast, cached = eng.fastokens, eng.segment_cached()
        a, b = f"chat-{n}-turn", f"chat-{n}-extend"
        dt.encode(initial, session=a)
        dt.encode(initial, session=b)
        if cached is not None:
            cached.ids(initial)  # a server that served the earlier turns has their segments cached
        if fast is not None:
            fast.ids(initial)
        times: dict[str, list[float]] = {"turn": [], "extend": [], "fast": [], "cached": []}
        results = []
        text = initial
        bar = Steps(f"chat {size_label(n)}: turns", warm + turns)
        for i, delta in enumerate(deltas):
            text = text + delta
            calls = chat_calls(dt, text, delta, a, b, fast, cached)
            k = i % len(calls)
            for name, fn in calls[k:] + calls[:k]:  # rotate: no engine always runs first
                got, s = timed(fn)
                if i >= warm:
                    times[name].append(s)
                results.append((name, text, got))
            bar.step()
        good = eng.check_all(results)
        r_s = [eng.ref_seconds[txt] for _, txt, _ in results[::len(calls)][warm:]]
        exact_dr = all(good["turn"]) and all(good["extend"])
        ok &= exact_dr
        f = ChatFigures(n, median(r_s), median(times["fast"]), median(times["cached"]),
                        median(times["turn"]), median(times["extend"]))
        figs.append(f)
        n_good = sum(sum(v) for v in good.values())
        t.add(size_label(n), ms(f.ref), ms(f.fast) if fast else "n/a", ms(f.fast_cached) if cached else "n/a",
              ms(f.turn), ms(f.extend), ratio(best(f.fast, f.fast_cached), f.turn) if fast else "-",
              f"{n_good}/{sum(len(v) for v in good.values())}")
        for s in (a, b):
            dt.drop_session(s)
    t.print()
    big = figs[-1]
    if eng.fastokens is not None:
        seg = f", {ms(big.fast_cached)} with its segment cache" if big.fast_cached else ""
        verdict(f"a {size_label(big.context)}-character session turn: delta-ray {ms(big.turn)} "
                f"(whole transcript sent), "
                f"{ms(big.extend)} (append only); fastokens re-encoding the whole transcript {ms(big.fast)}{seg}: "
                f"{ratio(best(big.fast, big.fast_cached), big.turn)} the best of them"
                f"{' (slower on this run)' if (big.turn or 0) > (best(big.fast, big.fast_cached) or 0) else ''}; "
                f"{'all exact' if ok else 'MISMATCH against the reference'}")
    else:
        verdict(f"a {size_label(big.context)}-character session turn: delta-ray {ms(big.turn)} vs the reference's "
                f"re-encode {ms(big.ref)} ({ratio(big.ref, big.turn)}); {'all exact' if ok else 'MISMATCH'}")
    return ok
