"""The text column the batch pipelines read and the ID columns they write."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from delta_ray._core.text_columns import checked_text_column, id_columns, is_text_type


def test_text_types():
    assert is_text_type(pa.string()) and is_text_type(pa.large_string())
    assert not is_text_type(pa.binary()) and not is_text_type(pa.int32())


def test_checked_text_column_names_each_problem():
    t = pa.table({"text": ["a", None], "n": [1, 2], "s": ["x", "y"]})
    assert checked_text_column(t, "s").to_pylist() == ["x", "y"]
    with pytest.raises(ValueError, match="no text column 'body'"):
        checked_text_column(t, "body")
    with pytest.raises(ValueError, match="1 null text.*drop them"):
        checked_text_column(t, "text", null_hint="; drop them")
    with pytest.raises(TypeError, match="must hold strings, got int64"):
        checked_text_column(t, "n")


def test_id_columns_rows_and_counts():
    values = np.arange(7, dtype=np.int32)
    offsets = np.array([0, 3, 3, 7], dtype=np.int64)
    ids, counts = id_columns(values, offsets)
    assert ids.type == pa.list_(pa.int32()) and counts.type == pa.int32()
    assert ids.to_pylist() == [[0, 1, 2], [], [3, 4, 5, 6]] and counts.to_pylist() == [3, 0, 4]


def test_more_ids_than_list_int32_offsets_hold_is_refused():
    with pytest.raises(OverflowError, match="list<int32>"):
        id_columns(np.zeros(1, dtype=np.int32), np.array([0, 2**31], dtype=np.int64))


def test_batch_spec_refuses_bad_fields():
    from delta_ray._core.text_columns import BatchSpec

    assert BatchSpec().digest() == BatchSpec(engine="reference", threads=2, batch_bytes=5).digest()
    assert BatchSpec().digest() != BatchSpec(drop_text=True).digest()
    for bad, err in ((dict(text_column=""), TypeError), (dict(count_column=""), TypeError),
                     (dict(output_column="text"), ValueError), (dict(count_column="input_ids"), ValueError),
                     (dict(batch_bytes=0), ValueError), (dict(engine="gpu"), ValueError),
                     (dict(threads=0), ValueError), (dict(add_special_tokens=1), TypeError)):
        with pytest.raises(err):
            BatchSpec(**bad)


def test_one_schema_check_with_one_null_rule():
    from delta_ray._core.text_columns import BatchSpec

    spec = BatchSpec()
    spec.check_schema(pa.schema([("text", pa.large_string()), ("id", pa.int64())]))
    with pytest.raises(ValueError, match="f.jsonl: no text column 'text'"):
        spec.check_schema(pa.schema([("body", pa.string())]), where="f.jsonl")
    with pytest.raises(ValueError, match="only nulls"):
        spec.check_schema(pa.schema([("text", pa.null())]))
    with pytest.raises(TypeError, match="decode the bytes"):
        spec.check_schema(pa.schema([("text", pa.binary())]))


def test_encode_table_columns_and_drop_text():
    from delta_ray._core.text_columns import BatchSpec, encode_table

    class Fake:  # two IDs per text: the column plumbing, not the encode
        def encode_batch_flat(self, texts, *, add_special_tokens=True, threads=None):
            n = len(texts)
            return (np.arange(2 * n, dtype=np.int32), np.arange(0, 2 * n + 1, 2, dtype=np.int64))
    t = pa.table({"text": ["a", "bb"], "ids": [[9], [9]], "k": [1, 2]})
    out, tokens, nbytes = encode_table(Fake(), t, BatchSpec(output_column="ids", drop_text=True))
    assert out.column_names == ["ids", "k", "num_tokens"] and tokens == 4 and nbytes >= 3
    assert out.column("ids").to_pylist() == [[0, 1], [2, 3]] and out.column("num_tokens").to_pylist() == [2, 2]
    out, _, _ = encode_table(Fake(), t, BatchSpec(count_column=None))
    assert out.column_names == ["text", "ids", "k", "input_ids"]
