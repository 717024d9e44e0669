"""Acceptance runs for a clean exit (issue 21, item 1): processes that exit while the fast tier is
admitted in the background must all exit 0 with nothing on stderr.

    python tests/tools/exit_runs.py [--runs 50] [--max-delay 15] [--tokenize-runs 8] [--empty] [--stage S]

Each run gets a fresh private (0700) cache holding no admission record. By default the cache is
seeded with the per-code-point tables derived from the reference (``*.npy`` of the current cache:
deriving them again costs each run seconds to minutes on a busy machine and is not what is tested);
``--empty`` seeds nothing. A script run constructs ``DeltaTokenizer(path)`` (default engine), checks
an encode against the reference and exits after a random delay in [0, max-delay] s
(tests/tools/exit_check.py; with ``--stage``, counted from when the admission enters that module). A
tokenize run is ``delta-ray tokenize`` on a small text file. Prints each run and the counts; exits
1 if any run failed. Used by the slow test in test_clean_exit.py.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).parent


def fresh_cache(base: pathlib.Path, name: str, seed: bool) -> pathlib.Path:
    from delta_ray._runtime.cache_store import cache_root
    d = base / name
    d.mkdir(mode=0o700)
    if seed:
        for f in cache_root().glob("*.npy"):
            shutil.copy(f, d / f.name)
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--max-delay", type=float, default=15.0)
    ap.add_argument("--tokenize-runs", type=int, default=8)
    ap.add_argument("--empty", action="store_true", help="seed no tables: every run derives them")
    ap.add_argument("--stage", default=None, help="count the delay from this admission module (e.g. fuzz)")
    ap.add_argument("--tokenizer", default="qwen-3")
    args = ap.parse_args(argv)

    from delta_ray import DeltaTokenizer
    from delta_ray.apps.bundled import bundled_tokenizer_path
    path = bundled_tokenizer_path(args.tokenizer)
    if not args.empty:
        DeltaTokenizer(path, engine="reference")  # the tables exist in the current cache
    base = pathlib.Path(tempfile.mkdtemp(prefix="delta-ray-exit-"))
    text = base / "input.txt"
    text.write_text("".join(f"line {i}: the quick brown fox, {i * 7919} \u00e9t\u00e9 \u4e2d\u6587\n"
                            for i in range(2000)), encoding="utf-8")
    rng = random.Random()
    failures = {"script": 0, "tokenize": 0}
    counts = {"script": 0, "tokenize": 0}
    jobs = [("script", i) for i in range(args.runs)]
    for i in range(args.tokenize_runs):  # spread over the script runs
        jobs.insert(round((i + 1) * len(jobs) / (args.tokenize_runs + 1)), ("tokenize", i))
    for kind, i in jobs:
        cache = fresh_cache(base, f"{kind}-{i}", not args.empty)
        env = dict(os.environ, DELTA_RAY_CACHE=str(cache), DELTA_RAY_FAST_BACKGROUND="1")
        env.pop("RAY_ADDRESS", None)
        if kind == "script":
            delay = 0.0 if i % 5 == 0 else rng.uniform(0.0, args.max_delay)
            cmd = [sys.executable, str(HERE / "exit_check.py"), path, f"{delay:.2f}",
                   *([args.stage] if args.stage else [])]
        else:
            delay = 0.0
            cmd = [sys.executable, "-m", "delta_ray.apps.cli", "tokenize", str(text), "--tokenizer", path,
                   "--output", str(base / f"out-{i}")]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        ok = proc.returncode == 0 and not proc.stderr
        counts[kind] += 1
        failures[kind] += not ok
        tail = proc.stderr.strip().splitlines()[-1][:160] if proc.stderr.strip() else ""
        print(f"{kind} {i}: delay {delay:5.2f} s, exit {proc.returncode}, {time.monotonic() - t0:5.1f} s, "
              f"stderr {len(proc.stderr)} B {tail!r}", flush=True)
        shutil.rmtree(cache, ignore_errors=True)
    for kind in counts:
        print(f"{kind}: {counts[kind] - failures[kind]} of {counts[kind]} exited 0 with empty stderr")
    shutil.rmtree(base, ignore_errors=True)
    return 1 if any(failures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
