"""The main job: tokenize a long document and a growing session, check every result, print speed-ups."""
from __future__ import annotations

import statistics
import sys
import time

from tokenizers import Tokenizer

from .bundled import DEFAULT_TOKENIZER, bundled_tokenizer_path
from .sample_text import corpus
from ..tokenizer import DeltaTokenizer


def _bar(i: int, n: int, label: str) -> None:
    width = 30
    done = int(width * i / n)
    sys.stdout.write(f"\r  {label:<28} [{'#' * done}{'.' * (width - done)}] {i}/{n}")
    sys.stdout.flush()
    if i == n:
        sys.stdout.write("\n")


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run_in_process(tokenizer: str | None = None, doc_chars: int = 1_000_000, session_chars: int = 100_000,
                   turns: int = 20, append_chars: int = 1300) -> bool:
    """In-process part of the demo; returns whether every result equalled the reference."""
    path = tokenizer or bundled_tokenizer_path(DEFAULT_TOKENIZER)
    ref = Tokenizer.from_file(path)
    dt = DeltaTokenizer(path)
    print(f"tokenizer: {tokenizer or DEFAULT_TOKENIZER}  admission: {dt.admission.reason}")
    ok = True

    doc = corpus("english", doc_chars)
    want, t_ref = _timed(lambda: ref.encode(doc).ids)
    got, t_dt = _timed(lambda: dt.encode(doc))
    same = got.to_pylist() == want
    ok &= same
    print(f"  stateless {len(doc):,} chars: reference {t_ref * 1e3:,.0f} ms, delta-ray {t_dt * 1e3:,.0f} ms "
          f"({t_ref / t_dt:.1f}x, {len(dt.cuts(doc)) + 1} chunks) exact={same}")

    src = corpus("code", session_chars + turns * append_chars)
    text = src[:session_chars]
    dt.encode(text, session="demo")
    ref_ms, dt_ms = [], []
    for i in range(turns):
        text = src[:session_chars + (i + 1) * append_chars]
        want, t_ref = _timed(lambda: ref.encode(text).ids)
        got, t_dt = _timed(lambda: dt.encode(text, session="demo"))
        same = got.to_pylist() == want
        ok &= same
        ref_ms.append(t_ref * 1e3)
        dt_ms.append(t_dt * 1e3)
        _bar(i + 1, turns, "session turns (checked)")
    r, d = statistics.median(ref_ms), statistics.median(dt_ms)
    print(f"  session of {len(text):,} chars, +{append_chars} per turn: reference {r:.1f} ms, "
          f"delta-ray {d:.2f} ms median ({r / d:.0f}x) exact={ok}")
    return ok


def run_pool(tokenizer: str | None = None, sessions: int = 8, turns: int = 6, first: int = 100_000,
             append_chars: int = 1300, doc_chars: int = 1_000_000, batch_docs: int = 2000) -> bool:
    """The Ray part: a local Ray, a pool, a session replay, a long document and a small batch job."""
    import os
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    import ray

    from delta_ray.actors.pool import TokenizerPool

    path = tokenizer or bundled_tokenizer_path(DEFAULT_TOKENIZER)
    ref = Tokenizer.from_file(path)
    ok = True
    started = not ray.is_initialized()
    if started:
        from delta_ray.actors.local_ray import local_init_kwargs

        ray.init(**local_init_kwargs())
    try:
        t0 = time.perf_counter()
        with TokenizerPool(path) as pool:
            print(f"\nRay pool: {pool.num_workers} workers started in {time.perf_counter() - t0:.1f} s "
                  f"(cluster CPUs: {int(ray.cluster_resources().get('CPU', 0))})")
            src = corpus("code", 2_000_000)
            texts = {f"user-{i}": src[i * 150_000:i * 150_000 + first] for i in range(sessions)}
            ref_ms, pool_ms, n = 0.0, 0.0, 0
            total = sessions * turns
            for turn in range(turns):
                for i, key in enumerate(texts):
                    start = sessions * 150_000 + (turn * sessions + i) * append_chars
                    if turn:
                        texts[key] += src[start:start + append_chars]
                    text = texts[key]
                    got, tp = _timed(lambda: pool.encode(text, session=key))
                    want, tr = _timed(lambda: ref.encode(text).ids)
                    same = got.to_pylist() == want
                    ok &= same
                    if turn:  # first turns are initializations; the replay measures the continuations
                        ref_ms += tr * 1e3
                        pool_ms += tp * 1e3
                    n += 1
                    _bar(n, total, "session replay (checked)")
            print(f"  {sessions} sessions x {turns} turns (first {first:,} chars, +{append_chars}/turn): "
                  f"reference {ref_ms:,.0f} ms, pool {pool_ms:,.0f} ms for the continuations "
                  f"({ref_ms / pool_ms:.0f}x) exact={ok}")
            doc = corpus("english", doc_chars)
            want, tr = _timed(lambda: ref.encode(doc).ids)
            pool.encode(doc)
            got, tp = _timed(lambda: pool.encode(doc))
            same = got.to_pylist() == want
            ok &= same
            print(f"  stateless {len(doc):,} chars on the pool: reference {tr * 1e3:,.0f} ms, "
                  f"pool {tp * 1e3:,.0f} ms ({tr / tp:.1f}x) exact={same}")
        ok &= _batch_job(path, ref, batch_docs)
    finally:
        if started:
            ray.shutdown()
    return ok


def _batch_job(path: str, ref: Tokenizer, n_docs: int) -> bool:
    """A small Ray Data job through ``tokenize_dataset``, every row compared with the reference."""
    try:
        import ray.data

        from delta_ray import tokenize_dataset
    except (ImportError, AttributeError) as exc:
        print(f"  batch job skipped: {exc}")
        return True
    src = corpus("english", 3_000_000)
    docs = [src[i * 701:i * 701 + 50 + (i * 131) % 3000] for i in range(n_docs)] + [src[:400_000]]
    ds = ray.data.from_items([{"text": d} for d in docs])
    t0 = time.perf_counter()
    rows = tokenize_dataset(ds, path).take_all()
    dt = time.perf_counter() - t0
    by_text = {r["text"]: list(r["input_ids"]) for r in rows}
    want = ref.encode_batch(docs)
    same = len(rows) == len(docs) and all(by_text[d] == w.ids for d, w in zip(docs, want))
    n_tokens = sum(len(w.ids) for w in want)
    print(f"  batch job: {len(docs):,} documents, {n_tokens:,} tokens through Ray Data in {dt:.1f} s "
          f"({n_tokens / dt:,.0f} tokens/s) exact={same}")
    return same


def main(args) -> int:
    """Entry point of ``delta-ray demo``."""
    ok = run_in_process(args.tokenizer)
    if not args.in_process:
        ok &= run_pool(args.tokenizer)
    print("all results equal the reference" if ok else "MISMATCH against the reference")
    return 0 if ok else 1
