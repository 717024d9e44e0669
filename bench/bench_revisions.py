"""This checkout against another revision, side by side in one run: stateless texts and session turns.

For each tokenizer: a stateless ``--chars``-character text and a session turn appending ``--append``
characters to it, encoded by delta-ray as this checkout has it and as ``--baseline`` had it (a
``git archive`` of that revision in a temporary folder). Each measurement runs in a child process
of its own; the rounds alternate the two revisions (A B A B ...), and every answer is checked
against the reference in the child. Printed: the medians over rounds and the ratio baseline / this
checkout (above 1: this checkout is faster). Used for issue 56's "the development tokenizers lose
no speed" (the baseline: the commit before the derived transitions).

    .venv/bin/python -m bench.bench_revisions --baseline 3d63162^
    .venv/bin/python -m bench.bench_revisions --baseline HEAD~3 --tokenizers qwen-3 --rounds 5
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
print(json.dumps({"stateless_ms": statistics.median(ms), "turn_ms": statistics.median(turn)}))
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
                          str(args.reps)], cwd=tree, check=True, capture_output=True, text=True).stdout
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
    print("| tokenizer | stateless baseline | stateless this | ratio | turn baseline | turn this | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        m = {(label, k): statistics.median(x[k] for x in got[(label, name)])
             for label in ("baseline", "this") for k in ("stateless_ms", "turn_ms")}
        print(f"| {name} | {m['baseline', 'stateless_ms']:.1f} ms | {m['this', 'stateless_ms']:.1f} ms | "
              f"{m['baseline', 'stateless_ms'] / m['this', 'stateless_ms']:.2f} | {m['baseline', 'turn_ms']:.2f} ms | "
              f"{m['this', 'turn_ms']:.2f} ms | {m['baseline', 'turn_ms'] / m['this', 'turn_ms']:.2f} |")


if __name__ == "__main__":
    main()
