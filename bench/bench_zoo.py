"""The zoo's new pipeline kinds, side by side in one run (issue 56): one tokenizer of each kind.

For each: a stateless 1M-character text and a session turn appending about 2K characters to a
1M-character session, against the reference's whole encode and fastokens' whole encode (where
fastokens loads the tokenizer), every answer checked against the reference. Where the folder has a
chat template, a second table times a warm chat turn through transformers (``--chat``):
``apply_chat_template(tokenize=True)`` on a chat of about ``--chars`` characters growing by two
messages a turn, stock transformers against fastokens' patch and delta-ray's drop-in (keyless: the
conversation found by content), every turn's IDs checked against stock's. Ratios only mean
something within one run (this VM is noisy): each row is measured back to back.

    .venv/bin/python -m bench.bench_zoo                      # the default kinds, engine "fast"
    .venv/bin/python -m bench.bench_zoo --names gguf-gpt-2 --chars 250000
    .venv/bin/python -m bench.bench_zoo --chat --chars 250000   # + the drop-in's chat turns
"""
from __future__ import annotations

import argparse
import statistics
import time

from bench import zoo
from bench.peers.in_process import Fastokens
from delta_ray import DeltaTokenizer, FastEngineUnavailable
from delta_ray._core.loading import load_tokenizer
from delta_ray.apps.sample_text import corpus

#: One tokenizer of each kind the derivation newly admits.
DEFAULT = ("mistral-tekken-240911", "gguf-gpt-2", "otc-deepseek-v2", "gguf-gemma-4", "gguf-llama-spm", "gguf-phi-3")


def _ms(fn, texts: list[str]) -> float:
    """Median time of ``fn`` over ``texts``: a different text each call, as a server sees them (an
    engine's word cache then helps no one more than it would help a user)."""
    out = []
    for text in texts:
        t0 = time.perf_counter()
        fn(text)
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def measure(name: str, chars: int, append: int, turns: int, engine: str, reps: int) -> dict:
    """One row: the reference, fastokens and delta-ray on the same texts, checked."""
    path = str(zoo.tokenizer_path(name))
    ref = load_tokenizer(path).tokenizer
    src = corpus("english", chars + (turns + 1) * append + 10)
    text = src[:chars]
    want = ref.encode(text).ids
    row = {"name": name, "kind": zoo.kind(name)}
    step = max(1, chars // (3 * reps + 1))
    fresh = [text[i * step:] + text[:i * step] for i in range(1, 3 * reps + 1)]  # unseen rotations
    row["ref_ms"] = _ms(ref.encode, fresh[:reps])
    try:
        fast = Fastokens(path)
        assert fast.ids(text).tolist() == want, f"{name}: fastokens differs from the reference"
        row["fastokens_ms"] = _ms(fast.ids, fresh[reps:2 * reps])
    except Exception as exc:  # noqa: BLE001 - a peer that cannot load the tokenizer is reported as such
        row["fastokens_ms"] = float("nan")
        row["fastokens_note"] = f"{type(exc).__name__}: {exc}"[:80]
    try:
        dt = DeltaTokenizer(path, engine=engine, shadow_rate=0.0)
    except FastEngineUnavailable as exc:  # no native engine passes admission: the reference inside the cuts
        dt = DeltaTokenizer(path, engine="reference", shadow_rate=0.0)
        row["fast_note"] = str(exc)[:100]
    row["admitted"] = dt.admission.admitted
    row["engine"] = dt.admission.engine
    assert dt.encode(text).to_pylist() == want
    row["stateless_ms"] = _ms(dt.encode, fresh[2 * reps:])
    dt.encode(text, session="s")
    turn_ms, grown = [], text
    for t in range(turns):
        grown += src[chars + t * append:chars + (t + 1) * append]
        t0 = time.perf_counter()
        got = dt.encode(grown, session="s")
        turn_ms.append((time.perf_counter() - t0) * 1e3)
    assert got.to_pylist() == ref.encode(grown).ids, f"{name}: a session turn differs from the reference"
    row["turn_ms"] = statistics.median(turn_ms)
    return row


def _chat(src: str, chars: int, turns: int, append: int) -> list[list[dict]]:
    """The chat before each turn: a long first user message, then an assistant and a user message a turn."""
    chat = [{"role": "user", "content": src[:chars]}]
    out, pos, half = [], chars, append // 2
    for _ in range(turns + 1):
        out.append(list(chat))
        chat += [{"role": "assistant", "content": src[pos:pos + half]},
                 {"role": "user", "content": src[pos + half:pos + 2 * half]}]
        pos += 2 * half
    return out


def measure_chat(name: str, chars: int, append: int, turns: int, engine: str) -> dict | None:
    """A warm chat turn through transformers: stock, fastokens' patch, delta-ray's drop-in (turns 2..,
    medians; every turn's IDs checked against stock's). None where the folder has no chat template."""
    from transformers import AutoTokenizer

    from delta_ray.apps.dropin import wrap_tokenizer
    folder = str(zoo.tokenizer_path(name).parent)
    stock = AutoTokenizer.from_pretrained(folder)
    if stock.chat_template is None:
        return None
    toks = {"stock": stock}
    try:
        import fastokens
        fastokens.patch_transformers()
        try:
            toks["fastokens"] = AutoTokenizer.from_pretrained(folder)
        finally:
            fastokens.unpatch_transformers()
    except Exception as exc:  # noqa: BLE001 - a peer that cannot load the tokenizer is reported as such
        toks.pop("fastokens", None)
        print(f"|   | fastokens' patch: {type(exc).__name__}: {exc} |"[:160])
    toks["delta-ray"] = wrap_tokenizer(AutoTokenizer.from_pretrained(folder), engine=engine)
    chats = _chat(corpus("code", chars + (turns + 2) * append), chars, turns, append)
    times: dict[str, list[float]] = {n: [] for n in toks}
    for t, chat in enumerate(chats):
        got = {}
        for n in list(toks)[t % len(toks):] + list(toks)[:t % len(toks)]:  # rotating order
            t0 = time.perf_counter()
            try:
                got[n] = toks[n].apply_chat_template(chat, tokenize=True, add_generation_prompt=True,
                                                     return_dict=False)
            except Exception as exc:  # noqa: BLE001 - the template refuses this chat: no row
                print(f"|   | {name}: the chat template refuses this chat ({type(exc).__name__}) |")
                return None
            if t:  # turn 0 loads the conversation
                times[n].append((time.perf_counter() - t0) * 1e3)
        for n in toks:
            if n != "stock" and got[n] != got["stock"]:
                raise AssertionError(f"{name}: {n} differs from stock transformers at turn {t}")
    return {n: statistics.median(v) for n, v in times.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", default=",".join(DEFAULT))
    ap.add_argument("--chars", type=int, default=1_000_000)
    ap.add_argument("--append", type=int, default=2_000)
    ap.add_argument("--turns", type=int, default=7)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--engine", default="fast", choices=("auto", "fast", "reference"))
    ap.add_argument("--chat", action="store_true", help="also time chat turns through transformers (the drop-in)")
    args = ap.parse_args(argv)
    zoo.build()
    print(f"# {args.chars:,} characters; a turn appends {args.append:,}; medians; engine={args.engine}")
    print("| tokenizer | kind | reference whole | fastokens whole | delta-ray stateless | turn | "
          "turn / reference | turn / fastokens | stateless / fastokens | engine |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.names.split(","):
        r = measure(name, args.chars, args.append, args.turns, args.engine, args.reps)
        fk = r["fastokens_ms"]
        print(f"| {name} | {r['kind']} | {r['ref_ms']:.1f} ms | {fk:.1f} ms | {r['stateless_ms']:.1f} ms | "
              f"{r['turn_ms']:.2f} ms | 1/{r['ref_ms'] / r['turn_ms']:.0f} | {r['turn_ms'] / fk:.2f} | "
              f"{fk / r['stateless_ms']:.2f}x | {r['engine'][:40]} |", flush=True)
        for note in ("fastokens_note", "fast_note"):
            if note in r:
                print(f"|   | {note.split('_')[0]}: {r[note]} |")
    if not args.chat:
        return
    print(f"\n# chat turns through transformers: a {args.chars:,}-character chat growing by {args.append:,} "
          f"characters a turn; median of turns 2-{args.turns + 1}; IDs equal to stock's every turn")
    print("| tokenizer | stock | fastokens' patch | delta-ray drop-in | vs stock | vs fastokens |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.names.split(","):
        c = measure_chat(name, args.chars, args.append, args.turns, args.engine)
        if c is None:
            print(f"| {name} | no chat template (or it refuses the chat) | | | | |")
            continue
        fk = c.get("fastokens", float("nan"))
        print(f"| {name} | {c['stock']:.1f} ms | {fk:.1f} ms | {c['delta-ray']:.2f} ms | "
              f"{c['stock'] / c['delta-ray']:.0f}x | {fk / c['delta-ray']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
