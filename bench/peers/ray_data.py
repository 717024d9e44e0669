"""The Ray Data pipelines' tokenize step as users write it: a ``map_batches`` class over pyarrow batches.

Ray names each actor's process after its class, which bench_data's memory sampler looks for.
"""
from __future__ import annotations

import pyarrow as pa


class FastokensTokenize:
    """The fastokens UDF a Ray Data user writes: encode the batch, IDs as ``pa.array`` of lists."""

    def __init__(self, path: str):
        import fastokens
        self.tok = fastokens.Tokenizer.from_file(path)

    def __call__(self, batch: pa.Table) -> pa.Table:
        encs = self.tok.encode_batch(batch.column("text").to_pylist(), add_special_tokens=True)
        return batch.append_column("input_ids", pa.array([e.ids for e in encs], pa.list_(pa.int32())))


class ReferenceTokenize:
    """The same UDF with the reference tokenizer (what users write first)."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer
        self.tok = Tokenizer.from_file(path)

    def __call__(self, batch: pa.Table) -> pa.Table:
        encs = self.tok.encode_batch(batch.column("text").to_pylist(), add_special_tokens=True)
        return batch.append_column("input_ids", pa.array([e.ids for e in encs], pa.list_(pa.int32())))
