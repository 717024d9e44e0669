"""Batch tokenization on Ray Data against the pipelines users write, side by side in one run.

    .venv/bin/python bench/bench_data.py [--mb 100] [--files 24] [--tokenizer llama3.2] [--repeats 3]
                                         [--corpora big,parquet24,jsonl24] [--pipelines ...] [--stats] [--warm]

Corpora (written once under a temporary directory, every row with an int64 ``id``):

* ``big``: one Parquet file of about ``--mb`` MB of text written with pyarrow's defaults (one row
  group), 0.2K-8K-character documents plus a 2M- and a 4M-character one;
* ``parquet24``: the same amount of text as ``--files`` Parquet files in a directory;
* ``jsonl24``: the same as ``--files`` JSONL files in a directory.

Pipelines, each timed end to end (read -> tokenize -> ``write_parquet`` / Parquet files):

* ``plain``: the script a user would write without Ray: pyarrow batches + fastokens
  ``encode_batch_flat`` + a ParquetWriter, one process, fastokens with its default threads;
* ``cli``: ``delta-ray tokenize``'s local path (:func:`delta_ray.batch.files.tokenize_files`);
* ``ray-fastokens``: the Ray Data pipeline a user would write with fastokens: ``read_parquet(dir)``
  / ``read_json(dir)``, ``map_batches`` with an actor pool of ``os.cpu_count()`` actors,
  ``num_cpus=0.5``, ``batch_format="pyarrow"``, Ray Data's default blocks and batches, the IDs
  built as ``pa.array(list of id lists)`` (the peer);
* ``tokenize_dataset``: :func:`delta_ray.tokenize_dataset` with its defaults on the same read as
  the peer's (tasks that Ray Data fuses with the write and the read; a bare file read that Ray Data
  would split, e.g. ``read_json(dir)``, it reads one task per file: ``actors/data_reads.py``);
* ``fastokens-per-file`` and ``td-per-file``: the fastokens pipeline and ``tokenize_dataset`` on
  ``read_parquet(dir, override_num_blocks=files)`` / ``read_json(...)``, one read task per file,
  as ``delta-ray tokenize --ray-data`` reads (where the files are at least as many as the CPUs and
  fewer than Ray Data's block target: ``actors/data_reads.py``; Ray Data's default read splits
  each file's output to reach its block target, and a split read does not fuse with the tasks
  after it); on a corpus of fewer files than CPUs it is the default read, and not run. ``td-per-file`` is the read a
  caller builds; on a bare JSON read ``tokenize_dataset`` reads so by itself;
* ``td-actors`` (not run unless named): ``tokenize_dataset(..., concurrency=os.cpu_count())``, its
  actor pool form;
* ``ray-reference``: the same user pipeline with the reference tokenizer's ``encode_batch`` (naive).

Every Ray run starts on a fresh local Ray, started as a user would (``ray.init(num_cpus=cores)``, no
worker environment; the start is not timed): no pipeline finds worker processes, actors or
tokenizers an earlier run left, as a job on a new cluster would not. ``--warm`` shares one Ray
between all runs instead (then tokenize_dataset's worker processes keep their tokenizer from one run
to the next, which the actor pools do not). The runs alternate (pipeline order rotated each
repeat), so load on this shared machine falls on all of them; the table gives medians. ``--stats`` prints Ray Data's
per-operator stats of each Ray run (where the time goes: read, map, write; actor utilisation).
Rows: every output's row count is checked, and ``--verify`` random rows of each output are compared
by id with the reference ``Tokenizer.from_file(p).encode(text).ids`` (exit status 1 on a mismatch).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench.corpora import corpus_rows  # noqa: E402
from bench.harness import ActorPeakRSS, in_own_process, user_env  # noqa: E402
from bench.peers.plain_script import timed_run as plain  # noqa: E402
from bench.peers.ray_data import FastokensTokenize, ReferenceTokenize  # noqa: E402
from delta_ray.apps.bundled import TEST_TOKENIZERS, bundled_tokenizer_path  # noqa: E402

PIPELINES = ("plain", "cli", "ray-fastokens", "tokenize_dataset", "fastokens-per-file", "td-per-file",
             "ray-reference")
PER_FILE = ("fastokens-per-file", "td-per-file")  # read with one task per file
# What the processes doing a pipeline's encode have in their title (Ray names them after the UDF).
MARKERS = {"ray-fastokens": "FastokensTokenize", "tokenize_dataset": "tokenize_batch_task",
           "td-per-file": "tokenize_batch_task", "fastokens-per-file": "FastokensTokenize",
           "td-actors": "TokenizeBatch", "ray-reference": "ReferenceTokenize"}


# -- corpora --------------------------------------------------------------------------------------
def make_corpora(root: str, mb: int, files: int, which: list[str]) -> dict[str, tuple[str, list[str]]]:
    """name -> (what Ray Data reads: a file or a directory, the files) for each wanted corpus."""
    rows = corpus_rows(mb)  # the same documents as bench_files
    table = pa.table({"id": np.arange(len(rows), dtype=np.int64), "text": rows})
    out: dict[str, tuple[str, list[str]]] = {}
    if "big" in which:
        big = os.path.join(root, "big.parquet")
        pq.write_table(table, big)  # pyarrow's defaults, as a user writes a file: one row group
        out["big"] = (big, [big])
    per = -(-len(rows) // files)
    for name, ext in (("parquet24", "parquet"), ("jsonl24", "jsonl")):
        if name not in which:
            continue
        d = os.path.join(root, name)
        os.makedirs(d)
        paths = []
        for i in range(files):
            part = table.slice(i * per, per)
            p = os.path.join(d, f"part{i:03d}.{ext}")
            if ext == "parquet":
                pq.write_table(part, p)
            else:
                with open(p, "w", encoding="utf-8") as fh:
                    for rid, text in zip(part.column("id").to_pylist(), part.column("text").to_pylist()):
                        fh.write(json.dumps({"id": rid, "text": text}) + "\n")
            paths.append(p)
        out[name] = (d, paths)
    return out


# -- the pipelines without Ray ------------------------------------------------------------------------
def cli(path_json: str, inputs: list[str], out: str) -> tuple[float, int]:
    """``delta-ray tokenize``'s local path, as the command runs it."""
    from delta_ray import DeltaTokenizer
    from delta_ray.batch.files import Options, tokenize_files
    # "fast": the admission blocking and cached (bench_files does the same); "auto" with nothing
    # cached would start on the reference while admitting in the background.
    dt = DeltaTokenizer(path_json, engine="fast", reuse="none")
    t0 = time.perf_counter()
    s = tokenize_files(inputs, out, dt, Options())
    return time.perf_counter() - t0, s.tokens


def cli_in_own_process(path_json: str, inputs: list[str], out: str) -> tuple:
    """:func:`cli` in a fresh process with the user's defaults (delta-ray pins fastokens to one
    thread per process when imported first; a plain script does not)."""
    # Admission in the foreground: an exit while it runs in the background can abort (issue 21, item 1).
    return in_own_process("bench.bench_data", "cli", path_json, inputs, out,
                          env=user_env(DELTA_RAY_FAST_BACKGROUND="0"))


# -- the Ray Data pipelines -------------------------------------------------------------------------
def read(ray, source: str, blocks: int | None = None):
    extra = {} if blocks is None else {"override_num_blocks": blocks}
    return ray.data.read_json(source, **extra) if "jsonl" in source else ray.data.read_parquet(source, **extra)


def per_file_blocks(ray, files: list[str]) -> int | None:
    """One read task per file, as a caller would ask for it where the files are at least as many
    as the CPUs; else None (the per-file pipelines are then the default read, and not run)."""
    return len(files) if len(files) >= max(1, int(ray.cluster_resources().get("CPU", 1))) else None


def run_ray(ray, name: str, path: str, source: str, out: str, files: list[str]):
    """One Ray Data pipeline end to end; returns (seconds, the Ray Data stats text)."""
    t0 = time.perf_counter()
    ds = read(ray, source, per_file_blocks(ray, files) if name in PER_FILE else None)
    if name in ("tokenize_dataset", "td-actors", "td-per-file"):
        from delta_ray import tokenize_dataset
        ds = tokenize_dataset(ds, path, concurrency=(os.cpu_count() or 1) if name == "td-actors" else None)
    else:
        udf = FastokensTokenize if name in ("ray-fastokens", "fastokens-per-file") else ReferenceTokenize
        ds = ds.map_batches(udf, fn_constructor_args=(path,), batch_format="pyarrow",
                            compute=ray.data.ActorPoolStrategy(size=os.cpu_count() or 1), num_cpus=0.5)
    ds.write_parquet(out)
    elapsed = time.perf_counter() - t0
    return elapsed, ds.stats()


# -- checks -------------------------------------------------------------------------------------------
def check_output(out: str, texts: dict[int, str], ref, verify: int, seed: int) -> tuple[int, int, str]:
    """(rows, tokens, problem or "") of an output directory: every row present once, ``verify``
    random rows equal to the reference by id."""
    import pyarrow.dataset as pds
    got = pds.dataset(out, format="parquet").to_table(columns=["id", "input_ids"])
    ids = got.column("id").to_numpy()
    tokens = int(pa.compute.sum(pa.compute.list_value_length(got.column("input_ids"))).as_py() or 0)
    if len(ids) != len(texts) or len(np.unique(ids)) != len(texts):
        return len(ids), tokens, f"{len(ids)} rows ({len(np.unique(ids))} distinct ids) for {len(texts)} inputs"
    rng = random.Random(seed)
    for r in rng.sample(range(len(ids)), min(verify, len(ids))):
        want = ref.encode(texts[int(ids[r])], add_special_tokens=True).ids
        if got.column("input_ids")[r].as_py() != want:
            return len(ids), tokens, f"row id {ids[r]} differs from the reference"
    return len(ids), tokens, ""


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def stage_cpu(stats: str) -> dict[str, float]:
    """Remote CPU seconds per stage (read, map, write) from ``Dataset.stats()``: what the workers
    spent, which a busy machine disturbs far less than wall time."""
    import re
    out: dict[str, float] = {}
    stage = None
    for line in stats.splitlines():
        line = line.strip()
        if line.startswith("Operator "):
            name = line.split(":", 1)[0]
            stage = "map" if "MapBatches" in name else "write" if "Write" in name else \
                "read" if "Read" in name or "ListFiles" in name else "other"
        elif stage and line.startswith("* Remote cpu time"):
            m = re.search(r"([0-9.]+)(us|ms|s|m|h) total", line)
            if m:
                out[stage] = out.get(stage, 0.0) + float(m.group(1)) * _UNITS[m.group(2)]
    return out


def brief_stats(stats: str) -> str:
    keep = ("Operator ", "tasks executed", "Remote wall time", "Remote cpu time", "UDF time",
            "Output num rows per block", "Output size bytes per block", "Operator throughput",
            "Total input num rows", "Total output num rows", "* Output num rows", "Dataset throughput",
            "Actor", "actors")
    return "\n".join("    " + ln.strip() for ln in stats.splitlines() if any(k in ln for k in keep))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", default="llama3.2", help=f"bundled name ({', '.join(TEST_TOKENIZERS)}) or a path")
    p.add_argument("--mb", type=int, default=100, help="MB of text per corpus")
    p.add_argument("--files", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3, help="alternating runs of each pipeline (medians)")
    p.add_argument("--corpora", default="big,parquet24,jsonl24")
    p.add_argument("--pipelines", default=",".join(PIPELINES))
    p.add_argument("--verify", type=int, default=200, help="random rows of each output checked against the reference")
    p.add_argument("--stats", action="store_true", help="print Ray Data's stats of each Ray run")
    p.add_argument("--warm", action="store_true", help="one Ray for all runs instead of a fresh one per Ray run")
    args = p.parse_args(argv)

    path = bundled_tokenizer_path(args.tokenizer) if args.tokenizer in TEST_TOKENIZERS else args.tokenizer
    cores = os.cpu_count() or 1
    pipelines = [x for x in args.pipelines.split(",") if x]
    root = tempfile.mkdtemp(prefix="delta-ray-bench-data-")
    import ray
    try:
        corpora = make_corpora(root, args.mb, args.files, [c for c in args.corpora.split(",") if c])
        from tokenizers import Tokenizer
        ref = Tokenizer.from_file(path)
        first = pq.read_table(corpora["big"][1][0]) if "big" in corpora else None
        print(f"# bench_data: {args.tokenizer}, {args.mb} MB of text per corpus, {cores} cores, "
              f"load average at start {os.getloadavg()[0]:.2f}; medians of {args.repeats} alternating runs, "
              f"{'one Ray for all runs' if args.warm else 'a fresh Ray per Ray run'}")
        start_ray(ray, cores)
        failed = False
        results: dict[str, dict[str, list[float]]] = {}
        tokens_of: dict[str, int] = {}
        peaks: dict[tuple[str, str], float] = {}
        procs: dict[tuple[str, str], list[int]] = {}
        cpus: dict[tuple[str, str], list[dict[str, float]]] = {}
        for cname, (source, files) in corpora.items():
            texts = None
            times: dict[str, list[float]] = {k: [] for k in pipelines}
            loads = []
            for r in range(args.repeats):
                order = pipelines[r % len(pipelines):] + pipelines[:r % len(pipelines)]
                for name in order:
                    out = os.path.join(root, f"out-{cname}-{name}-{r}")
                    loads.append(os.getloadavg()[0])
                    if name in ("plain", "cli"):
                        os.makedirs(out)
                        run = plain if name == "plain" else cli_in_own_process
                        elapsed, tokens = run(path, files, out)
                        stats = ""
                    else:
                        if name in PER_FILE and per_file_blocks(ray, files) is None:
                            continue  # fewer files than CPUs: the default read, timed as tokenize_dataset
                        if not args.warm:  # a fresh Ray: nothing left by an earlier run (not timed)
                            ray.shutdown()
                            start_ray(ray, cores)
                        with ActorPeakRSS(MARKERS[name]) as rss:
                            elapsed, stats = run_ray(ray, name, path, source, out, files)
                        peaks[(cname, name)] = max(peaks.get((cname, name), 0.0), rss.peak_mb())
                        procs.setdefault((cname, name), []).append(len(rss.pids))
                    times[name].append(elapsed)
                    if stats:
                        cpus.setdefault((cname, name), []).append(stage_cpu(stats))
                    if r == 0:  # check each pipeline's first output
                        if texts is None:
                            t = first if cname == "big" and first is not None else _texts_of(files)
                            texts = dict(zip(t.column("id").to_pylist(), t.column("text").to_pylist()))
                        rows, tokens, problem = check_output(out, texts, ref, args.verify, seed=r)
                        tokens_of.setdefault(cname, tokens)
                        if problem:
                            failed = True
                            print(f"  {cname} {name}: WRONG: {problem}")
                    print(f"  {cname} run {r + 1} {name:17s} {elapsed:6.2f} s  (load {loads[-1]:.2f})", flush=True)
                    if args.stats and stats:
                        print(brief_stats(stats))
                    shutil.rmtree(out, ignore_errors=True)
            results[cname] = times
            print(f"  {cname}: load average during the runs {min(loads):.2f}-{max(loads):.2f}")
        print("\n| pipeline | " + " | ".join(f"{c} M tokens/s" for c in results) + " |")
        print("| --- |" + " --- |" * len(results))
        for name in pipelines:
            cells = []
            for c, times in results.items():
                if not times[name]:
                    cells.append("(the default read)")
                    continue
                med = statistics.median(times[name])
                cell = f"{tokens_of[c] / med / 1e6:.2f}"
                if name in ("tokenize_dataset", "td-actors", "td-per-file"):
                    fk = "fastokens-per-file" if name == "td-per-file" else "ray-fastokens"
                    peer = [x for x in (fk, "ray-reference") if times.get(x)]
                    cell += "".join(f" ({statistics.median(times[x]) / med:.2f}x {x})" for x in peer)
                if name == "cli" and "plain" in times:
                    cell += f" ({statistics.median(times['plain']) / med:.2f}x plain)"
                cells.append(cell)
            print(f"| {name} | " + " | ".join(cells) + " |")
        print("\nRay Data workers' CPU seconds (medians; read / map / write; less disturbed by load than wall time):")
        for (c, n), runs in cpus.items():
            med = {k: statistics.median([r.get(k, 0.0) for r in runs]) for k in ("read", "map", "write")}
            print(f"  {c:10s} {n:17s} read {med['read']:6.2f}  map {med['map']:6.2f}  write {med['write']:6.2f}  "
                  f"total {sum(med.values()):6.2f}")
        print("peak RSS of the largest actor process: " + "; ".join(
            f"{c} {n} {mb:,.0f} MB" for (c, n), mb in peaks.items()))
        print("processes seen running the encode (each builds its tokenizer), per run: " + "; ".join(
            f"{c} {n} {'/'.join(map(str, k))}" for (c, n), k in procs.items()))
        print(f"(tokens: {', '.join(f'{c} {n:,}' for c, n in tokens_of.items())}; {args.verify} random rows of "
              f"each pipeline's first output checked against the reference: {'FAILED' if failed else 'exact'}; "
              f"load average at the end {os.getloadavg()[0]:.2f})")
        return 1 if failed else 0
    finally:
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)


def start_ray(ray, cores: int) -> None:
    for attempt in range(3):  # a loaded machine can time out Ray's start-up: try again
        try:
            ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, configure_logging=False)
            break
        except Exception:
            if attempt == 2:
                raise
            time.sleep(10)
    ray.data.DataContext.get_current().enable_progress_bars = False


def _texts_of(files: list[str]) -> pa.Table:
    from delta_ray.batch.inputs import read_json  # streamed; holds records over 1 MiB
    tables = [pq.read_table(f) if f.endswith(".parquet") else read_json(f) for f in files]
    return pa.concat_tables([t.select(["id", "text"]) for t in tables])


if __name__ == "__main__":
    sys.exit(main())
