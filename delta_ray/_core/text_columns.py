"""One batch specification for every batch path: the columns read and written, and how to encode them.

``delta-ray tokenize`` (``apps/tokenize_cli.py``; local: ``batch/files.py``, ``--ray-data``: ``actors/data.py``) and
``tokenize_dataset`` (``actors/data.py``, whose actors are ``TokenizeBatch``) all take one
:class:`BatchSpec`, check a schema with :meth:`BatchSpec.check_schema` and a batch's text column
with :func:`checked_text_column` (one null rule: a missing text has no reference IDs, so nulls are
refused, and a column typed null holds only nulls), and encode a table with :func:`encode_table`:
the same ``list<int32>`` IDs and ``int32`` counts, built from an engine's flat (values, offsets)
buffers with no Python object per token.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from delta_ray._core import constants as C

from .assembly import flat_list_array, to_arrow


def is_text_type(t: Any) -> bool:
    """Whether an Arrow type holds UTF-8 text (string, large_string or string_view)."""
    return pa.types.is_string(t) or pa.types.is_large_string(t) or (
        hasattr(pa.types, "is_string_view") and pa.types.is_string_view(t))


def machine_threads() -> int:
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class BatchSpec:
    """What a batch job reads, writes and how it encodes: the same for every batch path.

    ``text_column`` holds the texts; ``output_column`` receives the ``list<int32>`` IDs and
    ``count_column`` (None: none) the ``int32`` counts, both replacing a column of that name;
    ``add_special_tokens`` as in the reference ``encode``; ``drop_text`` omits the text from the
    output; ``batch_bytes`` bounds the text encoded at once (UTF-8 bytes; a larger row alone), which
    bounds the Python strings and buffers held; ``engine`` is the encoder inside the cuts;
    ``threads`` the encode threads of one process (an actor), None for the CPUs it may use;
    ``max_record_bytes`` the longest line (after decompression) of a text or JSONL input that
    delta-ray's own reader holds (``delta-ray tokenize`` without ``--ray-data``; Ray Data reads with
    its own readers): a longer one is refused with a ValueError naming the file and the byte
    offset, so a newline-free input (a small ``.gz`` can hold gigabytes) is never held whole.
    """

    text_column: str = "text"
    output_column: str = "input_ids"
    count_column: str | None = "num_tokens"
    add_special_tokens: bool = True
    drop_text: bool = False
    batch_bytes: int = C.BATCH_BYTES
    engine: str = "auto"
    threads: int | None = None
    max_record_bytes: int = C.MAX_RECORD_BYTES

    def __post_init__(self) -> None:
        for name in ("text_column", "output_column"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise TypeError(f"{name} must be a non-empty str, got {value!r}")
        if self.count_column is not None and (not isinstance(self.count_column, str) or not self.count_column):
            raise TypeError(f"count_column must be a non-empty str or None, got {self.count_column!r}")
        if self.output_column == self.text_column or self.count_column in (self.text_column, self.output_column):
            raise ValueError("text_column, output_column and count_column must be distinct, got "
                             f"{self.text_column!r}, {self.output_column!r}, {self.count_column!r}")
        if not isinstance(self.add_special_tokens, bool) or not isinstance(self.drop_text, bool):
            raise TypeError("add_special_tokens and drop_text must be bools")
        if not isinstance(self.batch_bytes, int) or isinstance(self.batch_bytes, bool) or self.batch_bytes < 1:
            raise ValueError(f"batch_bytes must be a positive int, got {self.batch_bytes!r}")
        if not isinstance(self.max_record_bytes, int) or isinstance(self.max_record_bytes, bool) \
                or self.max_record_bytes < 1:
            raise ValueError(f"max_record_bytes must be a positive int, got {self.max_record_bytes!r}")
        if self.engine not in C.ENGINES:
            raise ValueError(f"engine must be one of {C.ENGINES}, got {self.engine!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                         or self.threads < 1):
            raise ValueError(f"threads must be an int >= 1 or None, got {self.threads!r}")

    def encode_threads(self) -> int:
        """Encode threads in this process: ``threads``, else the CPUs it may use."""
        return self.threads or machine_threads()

    def digest(self) -> str:
        """A digest of what decides the output's content (for resuming: the columns, the flags)."""
        doc = {k: getattr(self, k) for k in ("text_column", "output_column", "count_column",
                                             "add_special_tokens", "drop_text")}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def check_schema(self, schema: pa.Schema, where: str = "") -> None:
        """Refuse, before any work, a schema whose text column is missing (ValueError), typed null
        (ValueError: only nulls) or not text (TypeError); ``where`` prefixes the message."""
        prefix = f"{where}: " if where else ""
        names = list(schema.names)
        if self.text_column not in names:
            raise ValueError(f"{prefix}no text column {self.text_column!r}; the columns are {names}. "
                             "Name the column holding the texts with text_column / --text-column.")
        t = schema.field(self.text_column).type
        if pa.types.is_null(t):
            raise ValueError(f"{prefix}text column {self.text_column!r} holds only nulls")
        if not is_text_type(t):
            hint = " (decode the bytes to str first)" if pa.types.is_binary(t) or pa.types.is_large_binary(t) else ""
            raise TypeError(f"{prefix}text column {self.text_column!r} must hold strings, not {t}{hint}")


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


class FlatEncoder(Protocol):
    def encode_batch_flat(self, texts: list[str], *, add_special_tokens: bool = True,
                          threads: int | None = None) -> tuple[np.ndarray, np.ndarray]: ...


def _put_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    idx = table.schema.get_field_index(name)
    if idx >= 0:
        return table.set_column(idx, name, values)
    return table.append_column(name, values)


def encode_table(dt: FlatEncoder, table: pa.Table, spec: BatchSpec, *, threads: int = 1,
                 null_hint: str = "") -> tuple[pa.Table, int, int]:
    """``table`` with its IDs (and count) columns, the text dropped if ``spec.drop_text``; returns
    (table, tokens, text bytes). The texts become Python strings only for the engine call."""
    col = checked_text_column(table, spec.text_column, null_hint=null_hint)
    nbytes = int(sum(c.nbytes for c in col.chunks))
    texts = col.to_pylist()
    values, offsets = dt.encode_batch_flat(texts, add_special_tokens=spec.add_special_tokens, threads=threads)
    del texts
    ids, counts = id_columns(values, offsets)
    out = table.drop_columns([spec.text_column]) if spec.drop_text else table
    out = _put_column(out, spec.output_column, ids)
    if spec.count_column is not None:
        out = _put_column(out, spec.count_column, counts)
    return out, int(offsets[-1]), nbytes
