"""This checkout against another revision, side by side in one run: stateless texts and session turns.

For each tokenizer: a stateless ``--chars``-character text and a session turn appending ``--append``
characters to it (with ``--lists`` also the drop-in's keyed and keyless turns, as transformers'
lists; with ``--interleaved`` the turns of three keyless conversations behind one 50K-character
system prompt under ``reuse="content"``), encoded by delta-ray as this checkout has it and as ``--baseline`` had it (a
``git archive`` of that revision in a temporary folder). Each measurement runs in a child process
of its own; the rounds alternate the two revisions (A B A B ...), and every answer is checked
against the reference in the child. Printed: the medians over rounds and the ratio baseline / this
checkout (above 1: this checkout is faster). Used for issue 56's "the development tokenizers lose
no speed" (the baseline: the commit before the derived transitions).

    .venv/bin/python -m bench.bench_revisions --baseline 3d63162^
    .venv/bin/python -m bench.bench_revisions --baseline HEAD~3 --tokenizers qwen-3 --rounds 5
    .venv/bin/python -m bench.bench_revisions --baseline a0e0332 --tokenizers qwen-3,llama3.2 --lists
"""
from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEV = ("qwen-3", "qwen-3.5", "deepseek-v3", "llama3.2", "glm-4", "minimax-m3")

# Runs in a child with one revision's tree first on sys.path: public API only, which both have.
CHILD = r"""
import json, statistics, sys, time
import delta_ray
assert delta_ray.__file__.startswith(sys.path[0]), delta_ray.__file__  # this revision's, not the installed one
from delta_ray import DeltaTokenizer
from delta_ray.apps.bundled import bundled_tokenizer_path
from delta_ray.apps.sample_text import corpus
from tokenizers import Tokenizer
name, chars, append, turns, reps = sys.argv[1], *map(int, sys.argv[2:6])
path = bundled_tokenizer_path(name)
ref = Tokenizer.from_file(path)
src = corpus("english", chars + (turns + 1) * append + 10)
text = src[:chars]
dt = DeltaTokenizer(path, engine="fast", shadow_rate=0.0)
assert dt.encode(text).to_pylist() == ref.encode(text).ids
step = max(1, chars // (reps + 1))
fresh = [text[i * step:] + text[:i * step] for i in range(1, reps + 1)]
ms = []
for t in fresh:
    t0 = time.perf_counter(); dt.encode(t); ms.append((time.perf_counter() - t0) * 1e3)
dt.encode(text, session="s")
turn, grown = [], text
for i in range(turns):
    grown += src[chars + i * append:chars + (i + 1) * append]
    t0 = time.perf_counter(); got = dt.encode(grown, session="s"); turn.append((time.perf_counter() - t0) * 1e3)
assert got.to_pylist() == ref.encode(grown).ids
out = {"stateless_ms": statistics.median(ms), "turn_ms": statistics.median(turn)}
if "--lists" in sys.argv:  # the drop-in's turns (transformers lists), keyed and keyless
    import tempfile
    from transformers import AutoTokenizer
    from delta_ray import request_scope
    from delta_ray.apps.dropin import wrap_tokenizer
    from delta_ray.apps.dropin.folders import bundled_hf_folder
    tok = wrap_tokenizer(AutoTokenizer.from_pretrained(bundled_hf_folder(name, tempfile.mkdtemp())),
                         engine="fast", shadow_rate=0.0)
    for kind, scope in (("keyed", {"session": "s"}), ("keyless", {})):
        lt, grown = [], src[:chars]
        with request_scope(**scope):
            tok.encode(grown)
        for i in range(turns):
            grown += src[chars + i * append:chars + (i + 1) * append]
            with request_scope(**scope):
                t0 = time.perf_counter(); got = tok.encode(grown); lt.append((time.perf_counter() - t0) * 1e3)
        assert got == ref.encode(grown).ids
        out[f"list_{kind}_ms"] = statistics.median(lt)
if "--interleaved" in sys.argv:  # three keyless conversations behind one system prompt, turn by turn
    dk = DeltaTokenizer(path, engine="fast", shadow_rate=0.0, reuse="content")
    system = src[:50_000]
    convs = [system + src[50_000 + c * 10_000:chars] + f" conversation {c}" for c in range(3)]
    for c in convs:
        dk.encode(c)
    kt = []
    for i in range(turns):
        for c in range(3):
            convs[c] += src[chars + i * append:chars + (i + 1) * append]
            t0 = time.perf_counter(); got = dk.encode(convs[c]); kt.append((time.perf_counter() - t0) * 1e3)
    assert got.to_pylist() == ref.encode(convs[2]).ids
    out["interleaved_ms"] = statistics.median(kt)
print(json.dumps(out))
"""


def export(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (``git archive``) unpacked under ``into``."""
    data = subprocess.run(["git", "archive", "--format=tar", rev], cwd=REPO, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def run_child(tree: Path, name: str, args: argparse.Namespace) -> dict:
    """One measurement of ``name`` with ``tree``'s delta-ray, in a fresh process."""
    code = f"import sys; sys.path.insert(0, {str(tree)!r})\n" + CHILD
    out = subprocess.run([sys.executable, "-c", code, name, str(args.chars), str(args.append), str(args.turns),
                          str(args.reps)] + (["--lists"] if args.lists else [])
                         + (["--interleaved"] if args.interleaved else []),
                         cwd=tree, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="a git revision of this repository")
    ap.add_argument("--tokenizers", default=",".join(DEV))
    ap.add_argument("--chars", type=int, default=1_000_000)
    ap.add_argument("--append", type=int, default=2_000)
    ap.add_argument("--turns", type=int, default=7)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lists", action="store_true",
                    help="also the drop-in's keyed and keyless turns (transformers' lists)")
    ap.add_argument("--interleaved", action="store_true",
                    help="also reuse='content' turns of three keyless conversations behind one system prompt")
    args = ap.parse_args()
    names = args.tokenizers.split(",")
    with tempfile.TemporaryDirectory(prefix="delta-ray-base-") as tmp:
        trees = {"baseline": export(args.baseline, Path(tmp)), "this": REPO}
        got: dict[tuple[str, str], list[dict]] = {}
        for r in range(args.rounds):
            for name in names:
                for label in (("baseline", "this") if r % 2 == 0 else ("this", "baseline")):
                    got.setdefault((label, name), []).append(run_child(trees[label], name, args))
    print(f"# {args.chars:,} characters, a turn appends {args.append:,}; medians of {args.rounds} rounds "
          f"(alternating); baseline {args.baseline}; ratio = baseline / this")
    kinds = ["stateless_ms", "turn_ms"] + (["list_keyed_ms", "list_keyless_ms"] if args.lists else []) \
        + (["interleaved_ms"] if args.interleaved else [])
    print("| tokenizer | " + " | ".join(f"{k[:-3]} baseline | {k[:-3]} this | ratio" for k in kinds) + " |")
    print("| --- " * (1 + 3 * len(kinds)) + "|")
    for name in names:
        cells = [name]
        for k in kinds:
            base, this = (statistics.median(x[k] for x in got[(label, name)]) for label in ("baseline", "this"))
            cells += [f"{base:.2f} ms", f"{this:.2f} ms", f"{base / this:.2f}"]
        print("| " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main()
