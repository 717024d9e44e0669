"""The demo: what delta-ray does, beside what a user would run instead, every result checked.

``python3 bootstrap.py demo [--quick] [--in-process] [--tokenizer PATH]`` runs it, as
``python -m bench.demo`` from the checkout's root.

Sections (one table each, then a one-line verdict):

1. a long stateless text, in process (:mod:`.in_process`);
2. a chat session of 100K-1M characters turn by turn, in process (:mod:`.in_process`);
3. the pool on a local Ray (:mod:`.on_ray`);
4. HTTP: delta-ray's one-process server and its Ray Serve app (through the proxy and with direct
   ingress) beside a plain FastAPI + fastokens server, whole transcripts and appends (:mod:`.over_http`);
5. a Parquet corpus with ``delta-ray tokenize``'s local path against a plain pyarrow + fastokens
   script (:mod:`.corpus`).

The alternatives are fastokens (whole re-encode; with its segment cache for chat) and the
reference ``tokenizers``, loaded and warmed in the same run. Every result of every engine is
compared with the reference's IDs; the exit status is 1 if any of delta-ray's differs.
``--quick`` runs smaller sizes and fewer turns (about 30 s once the fast tier is admitted).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    """How much each section runs."""

    stateless: tuple[int, ...]
    stateless_calls: int
    chat: tuple[int, ...]
    chat_turns: int
    pool_turns: int
    serve_turns: int
    corpus_mb: int


FULL = Sizes(stateless=(100_000, 1_000_000), stateless_calls=5, chat=(100_000, 1_000_000), chat_turns=8,
             pool_turns=6, serve_turns=6, corpus_mb=40)
QUICK = Sizes(stateless=(1_000_000,), stateless_calls=3, chat=(100_000, 1_000_000), chat_turns=4,
              pool_turns=3, serve_turns=3, corpus_mb=8)


def main(args) -> int:
    """Run the demo with ``args`` (``tokenizer``, ``in_process``, ``quick``); the exit status."""
    from .report import demo_log_path, log_to_file, out

    log_path = demo_log_path()
    log_to_file(log_path)
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    t_start = time.perf_counter()
    sizes = QUICK if args.quick else FULL

    from delta_ray._core.loading import load_tokenizer
    from delta_ray.apps.bundled import DEFAULT_TOKENIZER, bundled_tokenizer_path

    from .baselines import Engines
    from .fast_tier import fast_tier_tokenizer
    from .in_process import chat, stateless

    name = args.tokenizer or DEFAULT_TOKENIZER
    path = args.tokenizer or bundled_tokenizer_path(DEFAULT_TOKENIZER)
    import tokenizers
    out(f"delta-ray demo{' --quick' if args.quick else ''}: tokenizer {name}, {os.cpu_count()} CPUs, "
        f"reference tokenizers {tokenizers.__version__}")
    out(f"log file (delta-ray's and Ray's driver logs): {log_path}")
    loaded = load_tokenizer(path)
    dt, engine = fast_tier_tokenizer(loaded)
    eng = Engines(path)
    out(f"delta-ray engine: {engine}")
    out(f"compared with: {eng.fastokens_note} (whole re-encode, IDs as a buffer) and the reference; "
        "every result is checked against the reference")

    ok = stateless(eng, dt, list(sizes.stateless), sizes.stateless_calls)
    ok &= chat(eng, dt, list(sizes.chat), sizes.chat_turns)
    missing = ""
    if not args.in_process:
        from .on_ray import RayDidNotStart, ray_sections
        try:
            ok &= ray_sections(eng, loaded, sizes, log_path)
        except RayDidNotStart as exc:
            missing = "the sections on Ray did not run"
            out(f"  {exc}: {missing}")
    if not args.in_process:
        from .corpus import corpus_section
        ok &= corpus_section(eng, dt, sizes.corpus_mb)
    dt.core.shadow.drain()  # the shadow checks' thread idle before exit (native code at exit can abort)
    out()
    out(f"{'every result of delta-ray equals the reference' if ok else 'MISMATCH against the reference'}"
        f" ({eng.checks.n:,} results checked"
        + (f"; results that differed, by engine: {eng.checks.wrong}" if eng.checks.wrong else "")
        + f"); {time.perf_counter() - t_start:.0f} s" + (f"; INCOMPLETE: {missing}" if missing else ""))
    return 1 if not ok else 2 if missing else 0
