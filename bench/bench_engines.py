"""Single-thread throughput of the reference vs the raw native engines, side by side in one run.

    .venv/bin/python bench/bench_engines.py [--tokenizer qwen-3] [--sizes 10000,100000,1000000,4000000]

For each corpus (English, code, multilingual: /work/shared/corpus/*.txt.gz when present, else
generated text) and each size (characters), every engine encodes the same slices in turn, order
rotated per slice, after a warm-up on another part of the corpus. Reported: MB/s of UTF-8 input,
and each engine's speed-up over the reference measured in the same run. Times are process CPU
time by default (``--clock wall`` for wall time): every engine runs on one thread, and CPU time
stays meaningful when the machine is shared. Every engine's IDs are
checked against the reference's (add_special_tokens=False) on each slice.

Engines, all on the calling thread:
  reference   tokenizers ``encode_batch_fast([text], add_special_tokens=False)`` + ids to numpy
              (``encode_batch`` under tokenizers 1.x, through delta_ray.reference_api)
              (one input, so its rayon pool is not used)
  fastokens   ``Tokenizer.from_json_str`` + ``encode_batch_flat([text])`` -> numpy, FASTOKENS_BPE_THREADS=1
  gigatoken   ``load_hf_json`` backend ``encode(text)`` -> uint32 numpy (holds the GIL)
Also: ``GuardSet.allows`` on the same slices (a guard of ~5,000 code points), which gates every text.
"""
from __future__ import annotations

import argparse
import gzip
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")  # this process only: no engine may fan out

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from delta_ray._core.reference_api import encode_batch_ids  # noqa: E402 - encode_batch_fast (0.x) or encode_batch (1.x)
from delta_ray._engine.native import fast_engine_threads, fast_engine_versions  # noqa: E402
from delta_ray.apps.bundled import bundled_tokenizer_path  # noqa: E402

CORPUS_DIR = Path(os.environ.get("DELTA_RAY_CORPUS", "/work/shared/corpus"))


def _generated(kind: str, n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    if kind == "english":
        words = ("the of and to in is that for it as with was on be by this are or his from at which but "
                 "not have an they you were her all she there would their we him been has when who will "
                 "more no if out so said what up its about into than them can only other new some could "
                 "time these two may then do first any my now such like our over man me even most made").split()
        parts = []
        while sum(map(len, parts)) < n:
            sent = " ".join(rng.choice(words) for _ in range(rng.randint(5, 20)))
            parts.append(sent.capitalize() + rng.choice([". ", ", ", "! ", "? ", ".\n\n"]))
        return "".join(parts)[:n]
    if kind == "code":
        lines = ["def f{i}(x, y=None):", "    return x + {i} * (y or 0)", "for i in range({i}):",
                 "    if i % 3 == 0:", "        print(f'{{i}}: ok')", "class C{i}(Base):", "    pass",
                 "# comment {i}", "x_{i} = [a for a in range({i}) if a]", ""]
        out = []
        while sum(map(len, out)) < n:
            out.append(rng.choice(lines).format(i=rng.randint(0, 999)) + "\n")
        return "".join(out)[:n]
    scripts = ["Москва столица России и крупнейший город. ", "日本語のテキストと漢字とかなの混在。",
               "中文句子，还有标点符号！", "한국어 문장입니다. ", "Ελληνικά γράμματα και λέξεις. ",
               "हिन्दी में लिखा गया वाक्य। ", "العربية لغة جميلة. ", "ภาษาไทยไม่มีช่องว่าง ", "Tiếng Việt có dấu. "]
    out = []
    while sum(map(len, out)) < n:
        out.append(rng.choice(scripts))
    return "".join(out)[:n]


def load_corpus(kind: str, n: int) -> tuple[str, str]:
    path = CORPUS_DIR / f"{kind}.txt.gz"
    if path.exists():
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            text = fh.read()
        src = str(path)
    else:
        text, src = "", "generated"
    if len(text) < n:
        text = text + _generated(kind, n - len(text), seed=len(text))
        src = src if src == "generated" else src + "+generated"
    return text, src


def build_engines(path: str, wanted: list[str]):
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(path)

    def reference(t):
        return encode_batch_ids(ref, [t], False)[0]

    engines = {"reference": reference}
    data = Path(path).read_bytes()
    if "fastokens" in wanted:
        try:
            import fastokens

            ft = fastokens.Tokenizer.from_json_str(data.decode())

            def fast(t, ft=ft):
                buf, _ = ft.encode_batch_flat([t], add_special_tokens=False)
                return np.frombuffer(buf, dtype="<u4").view(np.int32)

            engines["fastokens"] = fast
        except Exception as exc:  # noqa: BLE001
            print(f"# fastokens unavailable: {exc}")
    if "gigatoken" in wanted:
        try:
            from gigatoken.gigatoken_rs import load_hf_json

            gb = load_hf_json(data)

            def giga(t, gb=gb):
                return gb.encode(t).view(np.int32)

            engines["gigatoken"] = giga
        except Exception as exc:  # noqa: BLE001
            print(f"# gigatoken unavailable: {exc}")
    if "fast-tier" in wanted:
        try:
            from delta_ray import DeltaTokenizer

            # delta-ray's fast tier as users get it: admission, guard check, encoder seam, numpy out
            tier = DeltaTokenizer(path, engine="fast", threads=1)

            def fast_tier(t, tier=tier):
                return tier.core.encode_ids(t, add_special_tokens=False)

            engines["fast-tier"] = fast_tier
        except Exception as exc:  # noqa: BLE001
            print(f"# fast tier unavailable: {exc}")
    return engines


def confinement(path: str, sizes: list[int], corpus: str, clock) -> None:
    """Texts holding one character the gigatoken guard refuses: whole vs cut into chunks."""
    from tokenizers import Tokenizer

    from delta_ray import DeltaTokenizer
    from delta_ray._engine.engine import FastTier
    from delta_ray._engine.native import cached_fast_encoder
    from delta_ray._verify.guard_probe import guard_set_for

    ref = Tokenizer.from_file(path)
    data = Path(path).read_bytes()
    try:
        giga = cached_fast_encoder(data, "gigatoken")
    except Exception as exc:  # noqa: BLE001
        print(f"# confinement: gigatoken unavailable ({exc})")
        return
    guard = guard_set_for(data, giga, ref_tokenizer=ref)
    bad = chr(min(guard.code_points))
    print(f"\n# one guarded character (U+{ord(bad):04X}, gigatoken tier: {len(guard)} guarded code points), "
          "one thread: the whole text vs only its chunk falls back to the reference")
    print(f"{'chars':>9}{'reference MB/s':>16}{'tier whole MB/s':>17}{'tier 16 chunks MB/s':>21}{'chunked/whole':>15}"
          f"{'match':>7}")
    whole = DeltaTokenizer(path, encoder=FastTier(giga, guard), threads=1)
    chunked = DeltaTokenizer(path, encoder=FastTier(giga, guard), threads=16,
                             chunk_size=4096, cut_threshold=8192)
    for size in sizes:
        text = corpus[:size // 2] + bad + corpus[size // 2:size]
        mb = len(text.encode()) / 1e6
        t = clock()
        want = encode_batch_ids(ref, [text], False)[0].tolist()
        tr = clock() - t
        t = clock()
        a = whole.core.encode_ids(text, add_special_tokens=False)
        tw = clock() - t
        t = clock()
        b = chunked.core.encode_ids(text, add_special_tokens=False)
        tc = clock() - t
        ok = a.tolist() == want == b.tolist()
        print(f"{size:>9}{mb / tr:>16.1f}{mb / tw:>17.1f}{mb / tc:>21.1f}{tw / tc:>14.1f}x{'yes' if ok else 'NO':>7}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="qwen-3")
    ap.add_argument("--sizes", default="10000,100000,1000000,4000000")
    ap.add_argument("--corpora", default="english,code,multilingual")
    ap.add_argument("--engines", default="fastokens,gigatoken,fast-tier")
    ap.add_argument("--no-confinement", action="store_true", help="skip the one-guarded-character table")
    ap.add_argument("--min-chars", type=int, default=2_000_000,
                    help="characters each fast engine encodes per cell (slices repeat over the corpus)")
    ap.add_argument("--ref-min-chars", type=int, default=400_000,
                    help="characters the reference encodes per cell (at least one slice)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu: process CPU time (robust on a shared machine; every engine runs on one "
                         "thread, so it equals wall time on an idle one); wall: perf_counter")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    wanted = args.engines.split(",")

    from delta_ray._engine.guard import GuardSet

    engines = build_engines(bundled_tokenizer_path(args.tokenizer), wanted)
    guard = GuardSet(frozenset(range(0x31350, 0x323B0)) | frozenset(range(0x1AC0, 0x1AF0))
                     | frozenset(range(0x0890, 0x08A0)))
    print(f"# tokenizer={args.tokenizer} versions={fast_engine_versions()} threads={fast_engine_threads()}")
    print(f"# cpu={os.cpu_count()} load={os.getloadavg()[0]:.2f} python={sys.version.split()[0]} clock={args.clock}")
    print(f"# guard MB/s: GuardSet.allows with {len(guard)} guarded code points (BMP and astral ranges); "
          "an empty guard set (fastokens on the bundled tokenizers) costs nothing")
    names = list(engines)
    hdr = f"{'corpus':<13}{'chars':>9}{'MB':>7}" + "".join(f"{n + ' MB/s':>16}" for n in names)
    hdr += "".join(f"{n + ' x':>13}" for n in names[1:]) + f"{'guard MB/s':>12}{'match':>7}"
    print(hdr)
    t_start = time.perf_counter()
    for kind in args.corpora.split(","):
        corpus, src = load_corpus(kind, max(sizes) + 200_001)
        # warm-up on the corpus's tail (lazy tables, regex JIT, caches of common words)
        warm = corpus[-200_000:]
        for fn in engines.values():
            fn(warm[:50_000])
        for size in sizes:
            n_fast = max(1, args.min_chars // size)
            n_ref = max(1, min(n_fast, args.ref_min_chars // size))
            span = len(corpus) - 200_000 - size
            slices = [corpus[(i * 7919 * size // 3) % max(1, span):][:size] for i in range(n_fast)]
            nbytes = [len(s.encode("utf-8")) for s in slices]
            secs = {n: 0.0 for n in names}
            done = {n: 0 for n in names}
            match = True
            for i, s in enumerate(slices):
                got = {}
                for n in names[i % len(names):] + names[:i % len(names)]:  # rotate who goes first
                    if n == "reference" and i >= n_ref:
                        continue
                    t = clock()
                    got[n] = engines[n](s)
                    secs[n] += clock() - t
                    done[n] += nbytes[i]
                if "reference" in got:
                    match &= all(np.array_equal(got[n], got["reference"]) for n in names[1:])
            t = clock()
            for s in slices:
                guard.allows(s)
            g_secs = max(clock() - t, 1e-9)
            mbs = {n: done[n] / 1e6 / secs[n] for n in names if secs[n] > 0}
            row = f"{kind:<13}{size:>9}{sum(nbytes[:n_ref]) / 1e6 / n_ref:>7.2f}"
            row += "".join(f"{mbs.get(n, float('nan')):>16.1f}" for n in names)
            row += "".join(f"{mbs[n] / mbs['reference']:>12.0f}x" for n in names[1:])
            row += f"{sum(nbytes) / 1e6 / g_secs:>12.0f}{'yes' if match else 'NO':>7}"
            print(row, flush=True)
        print(f"# {kind}: {src}")
    if "fastokens" in names and "fast-tier" in names:
        print("# target: the fast tier within 1.3x of the raw package (compare the fastokens and fast-tier columns)")
    if not args.no_confinement:
        corpus, _ = load_corpus("english", max(sizes) + 1)
        confinement(bundled_tokenizer_path(args.tokenizer), sizes, corpus, clock)
    print(f"# total {time.perf_counter() - t_start:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
