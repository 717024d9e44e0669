"""The text column the batch pipelines read and the ID columns they write."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from delta_ray.text_columns import checked_text_column, id_columns, is_text_type


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
