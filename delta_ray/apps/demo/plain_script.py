"""The batch script a user writes instead of delta-ray (the demo's corpus baseline).

pyarrow reads each Parquet file in batches of 8,192 rows, fastokens ``encode_batch_flat`` encodes a
batch (its own threads, its defaults), the IDs become a ``list<int32>`` column built from the
engine's buffer, and a ParquetWriter writes it. Without fastokens: the reference's
``encode_batch``. Prints one JSON line: seconds (after loading the tokenizer), tokens, engine.

    python delta_ray/demo/plain_script.py TOKENIZER_JSON OUT_DIR INPUT.parquet...

Run as a script, not ``-m``: importing ``delta_ray`` would pin fastokens to one thread.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


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
        for batch in pq.ParquetFile(p).iter_batches(batch_size=8192):
            vals, offs = encode(batch.column("text").to_pylist())
            table = pa.Table.from_batches([batch]).append_column(
                "input_ids", pa.ListArray.from_arrays(pa.array(offs), pa.array(vals)))
            if writer is None:
                writer = pq.ParquetWriter(os.path.join(out_dir, os.path.basename(p)), table.schema)
            writer.write_table(table)
            total += len(vals)
        if writer is not None:
            writer.close()
    print(json.dumps({"seconds": time.perf_counter() - t0, "tokens": total, "engine": engine}))


if __name__ == "__main__":
    main(sys.argv[1:])
