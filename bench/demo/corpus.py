"""The corpus section: Parquet files tokenized to Parquet, throughput against a plain script.

delta-ray runs ``delta-ray tokenize``'s local path (:func:`delta_ray.batch.files.tokenize_files`:
this machine, every core, no Ray; the ``--ray-data`` path is for clusters and is not shown here).
The plain script (:mod:`bench.peers.plain_script`, pyarrow + fastokens with its defaults) runs in
its own process. The reference's ``encode_batch`` (all cores) then encodes every document, and every row of
both outputs is compared with it.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.peers import plain_script
from delta_ray._tokenizer_core import TokenizerCore
from delta_ray.apps.sample_text import doc_source
from delta_ray.batch.files import Options, output_name, tokenize_files
from delta_ray.tokenizer import DeltaTokenizer

from .baselines import Engines
from .report import Table, out, progress, verdict

FILES = 4


def write_corpus(root: str, mb: int) -> tuple[list[str], int, int]:
    """``FILES`` Parquet files of documents of 200-8,000 characters (prose, code, multilingual);
    returns (paths, documents, text bytes)."""
    draw = doc_source(multilingual_chars=2_000_000)
    paths, docs, nbytes = [], 0, 0
    per = mb * 1_000_000 // FILES
    for i in range(FILES):
        rows = draw(per)
        p = os.path.join(root, f"part{i}.parquet")
        pq.write_table(pa.table({"text": rows}), p)
        paths.append(p)
        docs += len(rows)
        nbytes += sum(len(r.encode("utf-8")) for r in rows)
    return paths, docs, nbytes


def _flat(path: str, column: str) -> tuple[np.ndarray, np.ndarray]:
    """A ``list<int32>`` column of a Parquet file as (values, offsets)."""
    col = pq.read_table(path, columns=[column]).column(column).combine_chunks()
    return (col.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False),
            col.offsets.to_numpy(zero_copy_only=False).astype(np.int64) - col.offsets[0].as_py())


def corpus_section(eng: Engines, dt: DeltaTokenizer, mb: int) -> bool:
    root = tempfile.mkdtemp(prefix="delta-ray-demo-corpus-")
    try:
        with progress(f"writing a corpus ({FILES} Parquet files)"):
            inputs, docs, nbytes = write_corpus(root, mb)
        out_plain, out_dr = os.path.join(root, "plain"), os.path.join(root, "delta-ray")
        os.makedirs(out_plain)
        with progress("plain pyarrow + fastokens script (its own process)"):
            plain = plain_script.run(eng.path, out_plain, inputs)
        engine = "fast" if dt.core.uses_fast_engine else "reference"
        tok = TokenizerCore(dt.core.loaded, engine=engine, reuse="none")  # as `delta-ray tokenize` builds it
        with progress("delta-ray tokenize (local path: this machine, every core, no Ray)"):
            summary = tokenize_files(inputs, out_dr, tok, Options())
        tok.shadow.drain()
        # The reference, all cores (encode_batch), every document; both outputs compared row by row.
        ok_dr = ok_plain = True
        ref_s, ref_tokens = 0.0, 0
        with progress("the reference (encode_batch, all cores) and every row compared"):
            for p in inputs:
                texts = pq.read_table(p, columns=["text"]).column("text").to_pylist()
                dv, do = _flat(os.path.join(out_dr, output_name(p)), "input_ids")
                pv, po = _flat(os.path.join(out_plain, os.path.basename(p)), "input_ids")
                for i in range(0, len(texts), 1024):
                    t0 = time.perf_counter()
                    encs = eng.reference.encode_batch(texts[i:i + 1024])
                    ids = [np.asarray(e.ids, dtype=np.int32) for e in encs]
                    ref_s += time.perf_counter() - t0
                    del encs
                    for j, want in enumerate(ids, start=i):
                        ref_tokens += len(want)
                        ok_dr &= eng.checks.same("delta-ray tokenize", dv[do[j]:do[j + 1]], want)
                        ok_plain &= eng.checks.same("plain script", pv[po[j]:po[j + 1]], want)
        ok_dr &= summary.tokens == ref_tokens and summary.documents == docs
        t = Table(f"A corpus: {nbytes / 1e6:.0f} MB of text, {docs:,} documents in {FILES} Parquet files -> Parquet "
                  "with a list<int32> IDs column",
                  ["pipeline", "seconds", "tokens/s", "vs plain", "exact rows"])
        t.add("reference tokenizers (encode_batch, all cores)", f"{ref_s:.1f}", f"{ref_tokens / ref_s / 1e6:.2f} M",
              f"{plain['seconds'] / ref_s:.2f}x", f"{docs:,}/{docs:,}")
        t.add(f"plain pyarrow + {plain['engine']} script", f"{plain['seconds']:.1f}",
              f"{plain['tokens'] / plain['seconds'] / 1e6:.2f} M", "1.00x", f"{docs:,}/{docs:,}" if ok_plain else "NO")
        t.add("delta-ray tokenize (local path)", f"{summary.seconds:.1f}", f"{summary.tokens_per_s / 1e6:.2f} M",
              f"{plain['seconds'] / summary.seconds:.2f}x", f"{docs:,}/{docs:,}" if ok_dr else "NO")
        t.print()
        verdict(f"delta-ray tokenize {summary.tokens_per_s / 1e6:.2f} M tokens/s vs the plain script "
                f"{plain['tokens'] / plain['seconds'] / 1e6:.2f} M ({plain['seconds'] / summary.seconds:.2f}x) and the "
                f"reference {ref_tokens / ref_s / 1e6:.2f} M; "
                f"{'every row equals the reference' if ok_dr else 'MISMATCH against the reference'}")
        out("     (one machine, no Ray: `delta-ray tokenize --ray-data` runs the same encode on a cluster)")
        return ok_dr
    finally:
        shutil.rmtree(root, ignore_errors=True)
