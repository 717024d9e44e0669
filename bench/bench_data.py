"""Ray Data batch tokenization: a naive ``map_batches`` pipeline against ``delta_ray.tokenize_dataset``.

    python bench/bench_data.py [--scale 1.0] [--tokenizer qwen-3] [--repeats 2] [--stats]

One corpus with skewed document lengths (many short documents and a few of several million
characters; real text from ../shared/corpus when present, else the standard library) is put in
the object store once as Arrow blocks of ``--batch-size`` rows, then tokenized by

(a) naive: what users write today -- an actor class whose ``__call__`` runs the HF tokenizer's
    ``encode_batch`` on a numpy batch and returns the IDs as Python lists;
(b) delta-ray: ``delta_ray.tokenize_dataset`` (list<int32> built from Arrow buffers, long
    documents cut at safe cuts, the offset-free batch encode).

Fairness: the same Ray instance and the same input blocks (no read in the timed part); the same
actor pool size (``--concurrency``), CPU reservation (``--num-cpus``, fractional so that other
tasks are never starved on a small machine), batch size and worker environment; each run is
timed end to end (actor start-up with tokenizer loading, tokenization, materialization in the
object store), and the runs alternate (a, b, a, b, ...) so machine noise and warm caches fall on
both. Besides wall time it reports the CPU time the actors spent in their batch calls (from Ray
Data's stats), which a busy machine disturbs less. Every row of the two outputs is compared
(sorted by document id: Ray Data does not preserve order) and must be identical; the exit status
is 1 otherwise.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from delta_ray.bundled import TEST_TOKENIZERS, bundled_tokenizer_path  # noqa: E402
from delta_ray.sample_text import corpus  # noqa: E402

KINDS = ("english", "code", "multilingual")


def build_corpus(scale: float, seed: int) -> list[str]:
    """Short documents (log-normal lengths, median ~700 chars) plus three long ones (3M, 2M, 4M at scale 1)."""
    rng = np.random.default_rng(seed)
    short_total = int(12_000_000 * scale)
    long_sizes = {"english": int(3_000_000 * scale), "code": int(2_000_000 * scale),
                  "multilingual": int(4_000_000 * scale)}
    docs: list[str] = []
    per_kind = short_total // len(KINDS)
    for kind in KINDS:
        text = corpus(kind, per_kind)
        pos = 0
        while pos < len(text):
            n = int(np.clip(rng.lognormal(np.log(700), 1.0), 1, 40_000))
            docs.append(text[pos:pos + n])
            pos += n
    for kind, n in long_sizes.items():
        text = corpus(kind, n)
        # A different starting point than the short documents, so the long ones are not duplicates.
        docs.append(text[n // 3:] + "\n" + text[: n // 3])
    order = rng.permutation(len(docs))
    return [docs[i] for i in order]


def input_dataset(ray, docs: list[str], rows_per_block: int):
    """The corpus as a materialized dataset of ``rows_per_block``-row Arrow blocks, built once and
    consumed by every run (no read in the timed part: both pipelines see exactly the same blocks)."""
    table = pa.table({"id": pa.array(np.arange(len(docs), dtype=np.int64)), "text": pa.array(docs, pa.large_string())})
    blocks = [table.slice(i, rows_per_block) for i in range(0, len(docs), rows_per_block)]
    return ray.data.from_arrow(blocks).materialize()


class NaiveHFTokenize:
    """The usual Ray Data tokenization UDF: HF ``encode_batch``, IDs returned as Python lists."""

    def __init__(self, path: str, add_special_tokens: bool):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(path)
        self.add_special_tokens = add_special_tokens

    def __call__(self, batch: dict) -> dict:
        encs = self.tok.encode_batch(batch["text"].tolist(), add_special_tokens=self.add_special_tokens)
        batch["input_ids"] = [e.ids for e in encs]
        batch["num_tokens"] = [len(e.ids) for e in encs]
        return batch


def run_naive(ray, ds, path: str, args) -> tuple[float, object]:
    t0 = time.perf_counter()
    ds = ds.map_batches(NaiveHFTokenize, fn_constructor_args=(path, not args.no_special_tokens),
                        batch_size=args.batch_size, compute=ray.data.ActorPoolStrategy(size=args.concurrency),
                        num_cpus=args.num_cpus)
    out = ds.materialize()
    return time.perf_counter() - t0, out


def run_delta(ray, ds, path: str, args) -> tuple[float, object]:
    import delta_ray

    t0 = time.perf_counter()
    ds = delta_ray.tokenize_dataset(ds, path, add_special_tokens=not args.no_special_tokens,
                                    batch_size=args.batch_size, concurrency=args.concurrency,
                                    num_cpus=args.num_cpus, engine=args.current_engine)
    out = ds.materialize()
    return time.perf_counter() - t0, out


def _processes():
    """(command line, resident bytes) of every process this user can read (Linux /proc)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/statm") as f:
                rss_pages = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        yield cmd, rss_pages * os.sysconf("SC_PAGE_SIZE")


class ActorPeakRSS:
    """Samples the resident memory of the pipelines' actor processes (Ray names them after their
    UDF class) every 50 ms in a background thread; ``peak_mb()`` is the largest one seen."""

    def __init__(self, marker: str):
        import threading

        self.marker, self.peak = marker, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.wait(0.05):
            self.peak = max([self.peak] + [rss for cmd, rss in _processes() if self.marker in cmd])

    def peak_mb(self) -> float:
        return self.peak / 2 ** 20


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def udf_cpu_seconds(stats: str) -> float | None:
    """Total remote CPU time of the MapBatches operator, from ``Dataset.stats()`` (None if absent)."""
    in_map = False
    for line in stats.splitlines():
        if line.startswith("Operator "):
            in_map = "MapBatches" in line
        elif in_map and "Remote cpu time" in line:
            m = re.search(r"([0-9.]+)(us|ms|s|m|h) total", line)
            return float(m.group(1)) * _UNITS[m.group(2)] if m else None
    return None


def ids_by_doc(ray, ds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(doc ids, per-row lengths, flattened int64 IDs), rows sorted by doc id."""
    tables = []
    for block in ray.get(ds.to_arrow_refs()):
        col = block.column("input_ids")
        if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
            # Ray Data turns a batch whose rows all have the same length into a tensor column.
            rows = [np.asarray(r, dtype=np.int64).ravel() for r in col.to_numpy(zero_copy_only=False)]
            col = pa.array(rows, pa.large_list(pa.int64()))
        else:
            col = col.cast(pa.large_list(pa.int64()))
        tables.append(pa.table({"id": block.column("id"), "input_ids": col}))
    table = pa.concat_tables(tables).sort_by("id").combine_chunks()
    lists = table.column("input_ids").chunk(0)
    return (table.column("id").to_numpy(), pc.list_value_length(lists).to_numpy(),
            pc.list_flatten(lists).to_numpy())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", default="qwen-3", help=f"bundled name ({', '.join(TEST_TOKENIZERS)}) or a path")
    p.add_argument("--scale", type=float, default=1.0, help="corpus size: 1.0 = 12M chars of short docs + 9M long")
    p.add_argument("--repeats", type=int, default=2, help="alternating runs of each pipeline")
    p.add_argument("--concurrency", type=int, default=None, help="actors per pipeline (default: CPU count)")
    p.add_argument("--num-cpus", type=float, default=0.5, help="CPUs reserved per actor (both pipelines)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--rows-per-block", type=int, default=None,
                   help="rows per input block (default: --batch-size, so blocks spread over the actors)")
    p.add_argument("--no-special-tokens", action="store_true")
    p.add_argument("--rayon-threads", type=int, default=None,
                   help="RAYON_NUM_THREADS in the workers (both pipelines; default: the library default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engines", default="reference,fast",
                   help="delta-ray engines to run beside the naive pipeline (reference, fast, auto)")
    p.add_argument("--stats", action="store_true", help="print Ray Data's per-operator task times of each run")
    args = p.parse_args(argv)

    import ray
    import ray.data

    path = bundled_tokenizer_path(args.tokenizer) if args.tokenizer in TEST_TOKENIZERS else args.tokenizer
    cpus = os.cpu_count() or 1
    args.concurrency = args.concurrency or cpus
    docs = build_corpus(args.scale, args.seed)
    lengths = np.array([len(d) for d in docs])
    big = lengths >= 1_000_000
    print(f"corpus: {len(docs):,} documents, {lengths.sum():,} chars; {big.sum()} long documents "
          f"({lengths[big].sum():,} chars, largest {lengths.max():,}); median {int(np.median(lengths)):,} chars")
    print(f"tokenizer {args.tokenizer}; {cpus} CPUs; actor pool {args.concurrency} x {args.num_cpus} CPU; "
          f"batch_size {args.batch_size}; RAYON_NUM_THREADS={args.rayon_threads or 'default'}")

    env = {"RAYON_NUM_THREADS": str(args.rayon_threads)} if args.rayon_threads else {}
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": env} if env else None)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        source = input_dataset(ray, docs, args.rows_per_block or args.batch_size)
        print(f"input: {source.num_blocks()} blocks")
        del docs
        engines = [e for e in args.engines.split(",") if e]
        names = ["naive"] + [f"delta-ray[{e}]" for e in engines]
        times: dict[str, list[float]] = {k: [] for k in names}
        cpu: dict[str, list[float]] = {k: [] for k in names}
        peak: dict[str, float] = {k: 0.0 for k in names}
        outputs = {}
        for r in range(args.repeats):
            for name in names:
                with ActorPeakRSS("NaiveHFTokenize" if name == "naive" else "TokenizeBatch") as rss:
                    if name == "naive":
                        elapsed, out = run_naive(ray, source, path, args)
                    else:
                        args.current_engine = name[len("delta-ray["):-1]
                        elapsed, out = run_delta(ray, source, path, args)
                peak[name] = max(peak[name], rss.peak_mb())
                times[name].append(elapsed)
                outputs[name] = out  # keep the last output of each for the comparison
                stats = out.stats()
                used = udf_cpu_seconds(stats)
                if used is not None:
                    cpu[name].append(used)
                print(f"  run {r + 1} {name:20s} {elapsed:6.2f} s wall"
                      + (f", {used:6.2f} s CPU in the actors' batch calls" if used is not None else ""), flush=True)
                if args.stats:
                    keep = ("tasks executed", "Remote wall time", "Remote cpu time")
                    print("\n".join("    " + ln.strip() for ln in stats.splitlines()
                                    if any(k in ln for k in keep)))
                del out
        t0 = time.perf_counter()
        a_ids, a_len, a_vals = ids_by_doc(ray, outputs["naive"])
        n = len(lengths)
        same = True
        for name in names[1:]:
            b_ids, b_len, b_vals = ids_by_doc(ray, outputs[name])
            same_rows = np.array_equal(a_ids, np.arange(n)) and np.array_equal(b_ids, np.arange(n))
            ok = same_rows and np.array_equal(a_len, b_len) and np.array_equal(a_vals, b_vals)
            same &= ok
            tokens = int(b_len.sum())
            if not ok and same_rows and np.array_equal(a_len, b_len):
                bad = np.unique(np.searchsorted(np.cumsum(a_len), np.flatnonzero(a_vals != b_vals), side="right"))
                print(f"{name}: rows with different IDs: {len(bad)} (first doc ids {bad[:10].tolist()})")
            elif not ok:
                print(f"{name}: row sets or lengths differ")
            print(f"{name}: compared {n:,} rows ({tokens:,} tokens) with the naive pipeline (the reference): "
                  f"{'identical' if ok else 'DIFFERENT'}")
        print(f"comparisons took {time.perf_counter() - t0:.1f} s")
        best = {k: min(v) for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in times.items()}
        for k in times:
            print(f"{k:20s} best {best[k]:6.2f} s = {tokens / best[k] / 1e6:6.3f} M tokens/s; "
                  f"median {med[k]:6.2f} s = {tokens / med[k] / 1e6:6.3f} M tokens/s")
        for k in names[1:]:
            print(f"speed-up {k} / naive: {best['naive'] / best[k]:.2f}x (best), "
                  f"{med['naive'] / med[k]:.2f}x (median)  (target >= 1.3x)")
        print("peak actor RSS (largest actor process; target <= 2048 MB with the 4M-character document): "
              + ", ".join(f"{k} {v:,.0f} MB" for k, v in peak.items()))
        if all(cpu.values()):
            c = {k: statistics.median(v) for k, v in cpu.items()}
            print("actor CPU (median; less sensitive to a busy machine): "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in c.items()))
        return 0 if same else 1
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
