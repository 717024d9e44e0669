"""The main job: tokenize a long document and a growing session, check every result, print speed-ups."""
from __future__ import annotations

import statistics
import sys
import time

from tokenizers import Tokenizer

from .bundled import DEFAULT_TOKENIZER, bundled_tokenizer_path
from .sample_text import corpus
from .tokenizer import DeltaTokenizer


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


def main(args) -> int:
    """Entry point of ``delta-ray demo``."""
    ok = run_in_process(args.tokenizer)
    print("all results equal the reference" if ok else "MISMATCH against the reference")
    return 0 if ok else 1
