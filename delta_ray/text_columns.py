"""The text column both batch pipelines read and the ID columns they write, defined once.

``delta-ray tokenize`` (``batch_files.py``) and ``tokenize_dataset`` (``actors/data.py``) take the
same Arrow text column and produce the same ``list<int32>`` IDs and ``int32`` counts from an
engine's flat (values, offsets) buffers, with no Python object per token.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from .assembly import flat_list_array, to_arrow


def is_text_type(t: Any) -> bool:
    """Whether an Arrow type holds UTF-8 text (string, large_string or string_view)."""
    return pa.types.is_string(t) or pa.types.is_large_string(t) or (
        hasattr(pa.types, "is_string_view") and pa.types.is_string_view(t))


def checked_text_column(table: pa.Table, name: str, *, null_hint: str = "") -> pa.ChunkedArray:
    """``table[name]`` if it holds text and no nulls (the reference has no IDs for a missing text);
    otherwise a ValueError or TypeError that names the problem."""
    if name not in table.column_names:
        raise ValueError(f"no text column {name!r}; the columns are {table.column_names}")
    col = table.column(name)
    if col.null_count:
        raise ValueError(f"column {name!r} has {col.null_count} null text(s){null_hint}")
    if not is_text_type(col.type):
        raise TypeError(f"text column {name!r} must hold strings, got {col.type}")
    return col


def id_columns(values: np.ndarray, offsets: np.ndarray) -> tuple[pa.ListArray, pa.Int32Array]:
    """A flat batch's IDs as ``list<int32>`` rows (zero-copy values) and the rows' ``int32`` counts."""
    return flat_list_array(values, offsets), to_arrow(np.diff(offsets).astype(np.int32))
