"""The transformers drop-in against what serving stacks run today, side by side in one run.

vLLM's renderer (and SGLang's) calls ``apply_chat_template(tokenize=True)`` on a transformers
tokenizer every turn, re-rendering and re-encoding the whole transcript. Here one chat grows by a
user and an assistant message a turn (about 13K characters) to 250K+ characters in 20 turns, and
each turn is timed with four tokenizers loaded from the same folder:

* ``stock``: transformers 5 as installed;
* ``fastokens``: loaded under ``fastokens.patch_transformers()``;
* ``fastokens+cache``: the same with fastokens' segment cache on (``enable_segment_cache``);
* ``delta-ray``: loaded under ``delta_ray.patch_transformers()`` (content reuse off, the default;
  ``--engine fast`` admits the fast tier first, about a minute the first time, cached after).

The four are timed in rotating order on each turn (median of ``--repeats``), every result is
compared with stock's IDs, and the same is done for raw prompts (``tok(text)`` on the growing text
without a template). Targets (issue 24): delta-ray >= 1.0x fastokens' patch summed over turns 2-20,
and >= 20x stock transformers.

    .venv/bin/python bench/bench_dropin.py [--tokenizer qwen-3] [--engine fast] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from delta_ray.apps.dropin.folders import bundled_hf_folder  # noqa: E402
from delta_ray.apps.sample_text import corpus  # noqa: E402


def load_all(folder: str, engine: str, cache_mib: int, content_reuse: bool, shadow_rate: float | None) -> dict:
    from transformers import AutoTokenizer

    import delta_ray
    out = {"stock": AutoTokenizer.from_pretrained(folder)}
    try:
        import fastokens
    except ImportError:
        print("fastokens is not installed: its columns are skipped")
    else:
        for name in ("fastokens", "fastokens+cache"):
            fastokens.patch_transformers()
            try:
                out[name] = AutoTokenizer.from_pretrained(folder)
            finally:
                fastokens.unpatch_transformers()
        out["fastokens+cache"]._tokenizer.enable_segment_cache(cache_mib << 20)
    t0 = time.perf_counter()
    extra = {} if shadow_rate is None else {"shadow_rate": shadow_rate}
    delta_ray.patch_transformers(engine=engine, **extra)
    out["delta-ray"] = AutoTokenizer.from_pretrained(folder)
    if content_reuse:
        delta_ray.patch_transformers(engine=engine, content_reuse=True, **extra)
        out["delta-ray+reuse"] = AutoTokenizer.from_pretrained(folder)
    delta_ray.unpatch_transformers()
    from delta_ray.apps.dropin.hf import STATE_ATTR, install_hooks
    install_hooks()  # the loaded objects keep their state; the hooks must stay for them
    dt = out["delta-ray"].__dict__[STATE_ATTR].current(out["delta-ray"]).tokenizer
    print(f"delta-ray patch ready in {time.perf_counter() - t0:.1f} s; admission: {dt.admission.reason}; "
          f"engine: {dt.admission.engine}")
    return out


def timed(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), result


def run(toks: dict, calls: list, repeats: int, label: str) -> dict[str, list[float]]:
    """calls[t](tok) -> IDs of turn t; every tokenizer per turn, order rotated; IDs checked."""
    names = list(toks)
    per = {n: [] for n in names}
    mismatches = {n: 0 for n in names}
    for t, call in enumerate(calls):
        order = names[t % len(names):] + names[:t % len(names)]
        want = None
        results = {}
        for n in order:
            ms, ids = timed(lambda: call(toks[n]), repeats)
            per[n].append(ms)
            results[n] = ids
        want = results["stock"]
        for n in names:
            mismatches[n] += results[n] != want
    print(f"\n{label}: ms per turn (median of {repeats}), IDs compared with stock each turn")
    print("turn  chars    " + "".join(f"{n:>17}" for n in names))
    for t in range(len(calls)):
        print(f"{t + 1:>4}  {calls[t].chars:>7}  " + "".join(f"{per[n][t]:>17.2f}" for n in names))
    summed = {n: sum(per[n][1:]) for n in names}
    print("sum 2-" + f"{len(calls)}".ljust(9) + "".join(f"{summed[n]:>17.1f}" for n in names))
    print("mismatching turns " + "".join(f"{mismatches[n]:>17}" for n in names))
    d = summed["delta-ray"]
    for n in names:
        if n != "delta-ray":
            print(f"  delta-ray vs {n}: {summed[n] / d:.2f}x (sum of turns 2-{len(calls)})")
    return per


class Turn:
    def __init__(self, fn, chars):
        self.fn, self.chars = fn, chars

    def __call__(self, tok):
        return self.fn(tok)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="qwen-3", help="a bundled tokenizer with a chat template")
    ap.add_argument("--engine", default="fast", choices=("auto", "reference", "fast"))
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--message-chars", type=int, default=6600, help="characters per message (two a turn)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cache-mib", type=int, default=256, help="fastokens' segment cache size")
    ap.add_argument("--content-reuse", action="store_true", help="also time delta-ray with content reuse on")
    ap.add_argument("--shadow-rate", type=float, default=None,
                    help="delta-ray's shadow re-check rate (default: the library's, 1%%, off the request path)")
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when the output is a file

    with os.popen("uptime") as fh:
        print("load:", fh.read().strip())
    folder = bundled_hf_folder(args.tokenizer, tempfile.mkdtemp(prefix="bench-dropin-"))
    toks = load_all(folder, args.engine, args.cache_mib, args.content_reuse, args.shadow_rate)
    if toks["stock"].chat_template is None:
        print(f"{args.tokenizer} ships no chat template: raw prompts only")
    prose, code = corpus("english", 2_000_000), corpus("code", 2_000_000)
    m = args.message_chars
    chat, chats = [{"role": "system", "content": "You are a careful assistant."}], []
    for t in range(args.turns):
        chat.append({"role": "user", "content": prose[t * m:(t + 1) * m]})
        chats.append(list(chat))
        chat.append({"role": "assistant", "content": code[t * m:(t + 1) * m]})
    if toks["stock"].chat_template is not None:
        calls = []
        for c in chats:
            chars = len(toks["stock"].apply_chat_template(c, tokenize=False, add_generation_prompt=True))
            calls.append(Turn(lambda tok, c=c: tok.apply_chat_template(c, tokenize=True, add_generation_prompt=True),
                              chars))
        run(toks, calls, args.repeats, f"apply_chat_template(tokenize=True), {args.tokenizer}, chat growing by "
                                       f"{2 * m} characters a turn")
    raw = [prose[:(t + 1) * 2 * m] for t in range(args.turns)]
    run(toks, [Turn(lambda tok, x=x: tok(x)["input_ids"], len(x)) for x in raw], args.repeats,
        f"raw prompts tok(text)['input_ids'], {args.tokenizer}, growing by {2 * m} characters a turn")
    with os.popen("uptime") as fh:
        print("\nload:", fh.read().strip(), "(2 cores shared with other jobs: compare columns, not runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
