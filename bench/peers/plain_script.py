"""The batch script a user writes instead of delta-ray (the demo's corpus peer, and bench_data's and
bench_files' ``plain`` pipeline).

pyarrow reads each Parquet file in batches of 8,192 rows (a JSONL file whole), fastokens ``encode_batch_flat`` encodes a
batch (its own threads, its defaults), the IDs become a ``list<int32>`` column built from the
engine's buffer, and a ParquetWriter writes it. Without fastokens: the reference's
``encode_batch``. Prints one JSON line: seconds (after loading the tokenizer), tokens, engine.

    python bench/peers/plain_script.py TOKENIZER_JSON OUT_DIR INPUT.parquet|INPUT.jsonl...

Run as a script, not ``-m``, and importing nothing of this project: importing ``delta_ray`` would pin
fastokens to one thread.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def batches(path: str):
    """A Parquet file's batches of 8,192 rows; a JSONL file read with a block that holds it
    (pyarrow's default block, 1 MiB, refuses longer records)."""
    if path.endswith(".parquet"):
        return pq.ParquetFile(path).iter_batches(batch_size=8192)
    import pyarrow.json as pj
    opts = pj.ReadOptions(block_size=os.path.getsize(path) + 1)
    return pj.read_json(path, read_options=opts).to_batches(max_chunksize=8192)


def output_path(out_dir: str, path: str) -> str:
    """One Parquet file per input, named after it."""
    name = os.path.basename(path)
    return os.path.join(out_dir, name if name.endswith(".parquet") else name + ".parquet")


def main(argv: list[str]) -> None:
    path, out_dir, inputs = argv[0], argv[1], argv[2:]
    try:
        import fastokens
        tok = fastokens.Tokenizer.from_file(path)
        engine = "fastokens"

        def encode(texts):
            buf, offs = tok.encode_batch_flat(texts, add_special_tokens=True)
            return np.frombuffer(buf, dtype="<u4").view("<i4"), np.frombuffer(offs, dtype="<u8").astype(np.int32)
    except ImportError:
        from tokenizers import Tokenizer
        ref = Tokenizer.from_file(path)
        engine = "tokenizers"

        def encode(texts):
            ids = [np.asarray(e.ids, dtype=np.int32) for e in ref.encode_batch(texts)]
            offs = np.zeros(len(ids) + 1, dtype=np.int32)
            np.cumsum([len(x) for x in ids], out=offs[1:])
            return (np.concatenate(ids) if ids else np.zeros(0, np.int32)), offs
    t0, total = time.perf_counter(), 0
    for p in inputs:
        writer = None
        for batch in batches(p):
            vals, offs = encode(batch.column("text").to_pylist())
            table = pa.Table.from_batches([batch]).append_column(
                "input_ids", pa.ListArray.from_arrays(pa.array(offs), pa.array(vals)))
            if writer is None:
                writer = pq.ParquetWriter(output_path(out_dir, p), table.schema)
            writer.write_table(table)
            total += len(vals)
        if writer is not None:
            writer.close()
    print(json.dumps({"seconds": time.perf_counter() - t0, "tokens": total, "engine": engine}))


def run(tokenizer_path: str, out_dir: str, inputs: list[str]) -> dict:
    """Run this script in its own process with the user's defaults (importing delta_ray pins
    fastokens to one thread per process; a plain script does not) and return its JSON line:
    the one plain baseline that the demo and the benchmarks share."""
    import subprocess
    env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"}
    res = subprocess.run([sys.executable, os.path.abspath(__file__), tokenizer_path, out_dir, *inputs],
                         env=env, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"the plain script failed ({res.returncode}): {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def timed_run(tokenizer_path: str, inputs: list[str], out_dir: str) -> tuple[float, int]:
    """:func:`run`'s seconds and tokens, in the benches' argument order (the inputs, then where to write)."""
    res = run(tokenizer_path, out_dir, inputs)
    return res["seconds"], res["tokens"]


if __name__ == "__main__":
    main(sys.argv[1:])
