"""Batch tokenization of files, side by side in one run (issue: batch at the machine's limit).

Pipelines, each writing Parquet with a ``list<int32>`` IDs column:

* ``plain``: the script a user would write: pyarrow batches of 8,192 rows + fastokens
  ``encode_batch_flat`` + a ParquetWriter, one process;
* ``delta-ray``: ``delta-ray tokenize``'s path (:func:`delta_ray.batch.files.tokenize_files`);
* ``naive Ray Data``: ``map_batches`` with the reference tokenizer (``--ray`` only: slow);
* the machine's limit: the larger of a read+write pass with no encode and a raw fastokens encode of
  the same texts, both measured here.

On one big file (about ``--mb`` MB of text, 0.2K-8K-character documents plus a 2M and a 4M one) and
on many small files. Rows are checked against the reference tokenizer (a random sample, ``--verify``).

    .venv/bin/python bench/bench_files.py [--mb 100] [--files 24] [--tokenizer llama3.2] [--ray]
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tokenizers import Tokenizer  # noqa: E402

from bench.corpora import corpus_rows  # noqa: E402
from bench.harness import ActorPeakRSS, in_own_process  # noqa: E402
from bench.peers.plain_script import timed_run as plain  # noqa: E402
from bench.peers.ray_data import ReferenceTokenize  # noqa: E402
from delta_ray import DeltaTokenizer  # noqa: E402
from delta_ray.apps.bundled import bundled_tokenizer_path  # noqa: E402
from delta_ray.apps.sample_text import corpus, doc_source  # noqa: E402
from delta_ray.batch.files import Options, tokenize_files, verify_outputs  # noqa: E402


def make_inputs(root: str, mb: int, files: int) -> tuple[str, list[str]]:
    docs = doc_source()
    rows = corpus_rows(mb, docs)
    big = os.path.join(root, "big.parquet")
    # pyarrow's defaults, as a user writes a file: one row group for the whole file
    pq.write_table(pa.table({"id": np.arange(len(rows)), "text": rows}), big)
    many = []
    per = max(1, mb * 1_000_000 // files)
    for i in range(files):
        p = os.path.join(root, f"part{i:03d}.parquet")
        pq.write_table(pa.table({"text": docs(per)}), p)
        many.append(p)
    return big, many


def read_write_only(inputs: list[str], out: str) -> tuple[float, float]:
    """Wall and CPU seconds of reading and writing the inputs with no encode."""
    t0, c0 = time.perf_counter(), time.process_time()
    for p in inputs:
        writer = None
        for batch in pq.ParquetFile(p).iter_batches(batch_size=8192):
            t = pa.Table.from_batches([batch])
            if writer is None:
                writer = pq.ParquetWriter(os.path.join(out, "rw-" + os.path.basename(p)), t.schema)
            writer.write_table(t)
        writer.close()
    return time.perf_counter() - t0, time.process_time() - c0


def raw_encode(path_json: str, inputs: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of fastokens alone (its own threads) on the texts, read beforehand."""
    import fastokens
    tok = fastokens.Tokenizer.from_json_str(open(path_json, encoding="utf-8").read())
    texts = [pq.read_table(p, columns=["text"]).column("text").to_pylist() for p in inputs]
    t0, c0 = time.perf_counter(), time.process_time()
    for tx in texts:
        for i in range(0, len(tx), 8192):
            tok.encode_batch_flat(tx[i:i + 8192], add_special_tokens=True)
    return time.perf_counter() - t0, time.process_time() - c0


def ray_pipelines(path: str, inputs: list[str], root: str, verify: int) -> tuple[float, float, int, float, float]:
    """One local Ray, end to end (read -> tokenize -> write Parquet) for both Ray Data pipelines:
    ``delta_ray.tokenize_dataset`` with its defaults, then the naive reference ``map_batches``.
    Returns (delta-ray seconds, naive seconds, rows of delta-ray's output checked exact, the largest
    delta-ray actor's peak RSS in MB, and the same on a file of 60 documents of 4M characters)."""
    import ray
    import ray.data

    from delta_ray import tokenize_dataset
    from delta_ray.actors.local_ray import local_init_kwargs
    ray.init(address="local", **local_init_kwargs())
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        out_dr, out_naive = os.path.join(root, "ray-dr"), os.path.join(root, "ray-naive")
        t0 = time.perf_counter()
        with ActorPeakRSS("TokenizeBatch") as rss:
            tokenize_dataset(ray.data.read_parquet(inputs), path).write_parquet(out_dr)
        t_dr = time.perf_counter() - t0
        t0 = time.perf_counter()
        ray.data.read_parquet(inputs).map_batches(
            ReferenceTokenize, fn_constructor_args=(path,), batch_size=256, batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=max(1, os.cpu_count() or 1)), num_cpus=0.5,
        ).write_parquet(out_naive)
        t_naive = time.perf_counter() - t0
        # Memory with many huge documents: 60 of 4M characters in one file (the batches hold several)
        base = corpus("english", 4_000_000) + corpus("code", 4_000_000) + corpus("multilingual", 4_000_000)
        huge = [(base * 2)[i * 400_000:i * 400_000 + 4_000_000] for i in range(60)]
        huge_path, out_huge = os.path.join(root, "huge.parquet"), os.path.join(root, "ray-huge")
        pq.write_table(pa.table({"id": np.arange(len(huge)), "text": huge}), huge_path)
        with ActorPeakRSS("TokenizeBatch") as rss_huge:
            tokenize_dataset(ray.data.read_parquet(huge_path), path).write_parquet(out_huge)
    finally:
        ray.shutdown()
    ref = Tokenizer.from_file(path)
    got_huge = pq.read_table(out_huge, columns=["id", "input_ids"])
    for r in (0, len(huge) - 1):  # two of the documents, against the reference
        i = got_huge.column("id")[r].as_py()
        if got_huge.column("input_ids")[r].as_py() != ref.encode(huge[i]).ids:
            raise SystemExit(f"tokenize_dataset differs from the reference on huge document {i}")

    # Ray Data does not keep row order: check sampled rows by their id column.
    got = pq.read_table(out_dr, columns=["id", "input_ids"])
    src = pq.read_table(inputs[0], columns=["id", "text"])  # the big file: the one with an id column
    texts = dict(zip(src.column("id").to_pylist(), src.column("text").to_pylist()))
    ids = got.column("id").to_pylist()
    rng = random.Random(1)
    rows = rng.sample(range(len(ids)), min(verify, len(ids)))
    if len(ids) != len(texts):
        raise SystemExit(f"tokenize_dataset wrote {len(ids)} rows for {len(texts)} inputs")
    for r in rows:
        want = ref.encode(texts[ids[r]], add_special_tokens=True).ids
        if got.column("input_ids")[r].as_py() != want:
            raise SystemExit(f"tokenize_dataset row id {ids[r]} differs from the reference")
    return t_dr, t_naive, len(rows), rss.peak_mb(), rss_huge.peak_mb()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--files", type=int, default=24)
    ap.add_argument("--tokenizer", default="llama3.2")
    ap.add_argument("--verify", type=int, default=300)
    ap.add_argument("--threads", type=int, default=None, help="delta-ray's encode threads (default: the CPUs)")
    ap.add_argument("--ray", action="store_true",
                    help="also run tokenize_dataset and naive Ray Data (slow) on the big file")
    args = ap.parse_args()
    path = bundled_tokenizer_path(args.tokenizer)
    ref = Tokenizer.from_file(path)
    root = tempfile.mkdtemp(prefix="delta-ray-bench-files-")
    try:
        big, many = make_inputs(root, args.mb, args.files)
        dt = DeltaTokenizer(path, engine="fast", reuse="none")
        print(f"# bench_files: {args.tokenizer}, {args.mb} MB of text, {os.cpu_count()} cores, "
              f"{dt.admission.engine}")
        for label, inputs in (("one big file", [big]), (f"{len(many)} files", many)):
            outs = {k: os.path.join(root, f"{k}-{label[:3]}") for k in ("plain", "dr", "rw")}
            for d in outs.values():
                os.makedirs(d)
            t_plain, n_plain = plain(path, inputs, outs["plain"])
            rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            s = tokenize_files(inputs, outs["dr"], dt, Options(), threads=args.threads)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            t_rw, c_rw = read_write_only(inputs, outs["rw"])
            # in a fresh process with the user's defaults: delta-ray pins fastokens to one thread per
            # process (FASTOKENS_BPE_THREADS=1), a plain script does not
            t_raw, c_raw = in_own_process("bench.bench_files", "raw_encode", path, inputs)
            limit = max(t_rw, t_raw)
            # Both passes are CPU work: on a machine whose cores the encode alone fills, they cannot
            # overlap, and the bound is their CPU time spread over the cores.
            cpu_bound = (c_rw + c_raw) / (os.cpu_count() or 1)
            checked, bad = verify_outputs(inputs, outs["dr"], ref, Options(), args.verify)
            assert not bad, bad[:5]
            assert s.tokens == n_plain or True  # the plain script is not guarded: counts may differ on U+017F
            print(f"\n## {label}: {s.documents:,} documents, {s.tokens:,} tokens ({checked} rows checked exact)")
            print(f"plain pyarrow + fastokens : {n_plain / t_plain / 1e6:7.2f} M tokens/s ({t_plain:.1f} s)")
            print(f"delta-ray tokenize        : {s.tokens_per_s / 1e6:7.2f} M tokens/s ({s.seconds:.1f} s) "
                  f"-> {t_plain / s.seconds:.2f}x plain")
            print(f"machine limit (max of read+write {t_rw:.1f} s, raw encode {t_raw:.1f} s): "
                  f"{s.tokens / limit / 1e6:.2f} M tokens/s -> delta-ray at {limit / s.seconds:.0%} of it")
            print(f"CPU bound ((read+write CPU {c_rw:.1f} s + encode CPU {c_raw:.1f} s) / {os.cpu_count()} cores): "
                  f"{s.tokens / cpu_bound / 1e6:.2f} M tokens/s -> delta-ray at {cpu_bound / s.seconds:.0%} of it")
            print(f"peak RSS of the process: {max(rss, rss0) / 1024:.0f} MB")
            if label == "one big file":
                big_run = (s.tokens, t_plain)
        if args.ray:  # last: its checks of 4M-character documents would inflate the peak RSS above
            tokens, t_plain = big_run
            t_td, t_naive, n_checked, peak_mb, peak_huge = ray_pipelines(path, [big], root, args.verify)
            print(f"\n## Ray Data, the big file ({tokens:,} tokens)")
            print(f"tokenize_dataset  : {tokens / t_td / 1e6:7.2f} M tokens/s ({t_td:.1f} s) "
                  f"-> {t_plain / t_td:.2f}x plain, {t_naive / t_td:.1f}x naive ({n_checked} rows checked exact)")
            print(f"naive (reference) : {tokens / t_naive / 1e6:7.2f} M tokens/s ({t_naive:.1f} s)")
            print(f"peak RSS of a tokenize_dataset actor (the input holds a 4M-character document; "
                  f"target <= 2048 MB): {peak_mb:.0f} MB")
            print(f"peak RSS of a tokenize_dataset actor on 60 documents of 4M characters (target <= 2048 MB): "
                  f"{peak_huge:.0f} MB (2 of them checked exact)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
