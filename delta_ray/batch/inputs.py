"""The inputs of ``delta-ray tokenize``: what kind a file is, and its rows as a stream of units.

Parquet row groups (a large one streamed in batches of about ``batch_bytes``); text and JSONL,
compressed or not, streamed in pieces of about ``batch_bytes`` of input cut after a newline, never
held whole (one line is capped at ``max_record_bytes``, so a newline-free input is refused, not held).
:mod:`delta_ray.batch.files` runs the units; :func:`byte_slices` also bounds what a Ray Data actor encodes at once.
JSONL is scanned before pyarrow parses it (:func:`json_table`,
:func:`check_json_file`): nesting depth, items and keys per line are bounded.
"""
from __future__ import annotations

import os
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from delta_ray._core import constants as C

from .._core.json_scan import JsonLinesBound
from .._core.text_columns import BatchSpec

KINDS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
COMPRESSED = (".gz", ".bz2", ".zst")


def input_kind(path: str) -> str | None:
    """``text``, ``json`` or ``parquet`` from the file name, or None."""
    name, compressed = path.lower(), False
    for comp in COMPRESSED:
        if name.endswith(comp):
            name, compressed = name[: -len(comp)], True
            break
    kind = KINDS.get(os.path.splitext(name)[1])
    if kind is None or (compressed and kind == "parquet"):
        return None
    return kind


class DuplicateInput(ValueError):
    """One file listed twice among a run's inputs (by two spellings, a symlink or a hard link)."""


def check_distinct(paths: list[str]) -> None:
    """Refuse a file listed twice, by its ``(st_dev, st_ino)``: the same path, a symlink or a hard
    link to it. Listed twice, every document would be written twice (under a manifest a rerun
    trusts), or two writers would race on one output; :class:`DuplicateInput` names both spellings."""
    seen: dict[tuple[int, int], str] = {}
    for p in paths:
        st = os.stat(p)
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise DuplicateInput(f"{seen[key]} and {p} are the same file (listed twice, or through a link); "
                                 "list each input once")
        seen[key] = p


# -- reading --------------------------------------------------------------------------------------
class RecordTooLong(ValueError):
    """A line of a text or JSONL input longer than ``max_record_bytes`` (no newline in time)."""


def newline_cut(block: bytes) -> int:
    """The end of the last whole line in ``block`` (just after its last ``\n``), or 0 if none.
    Only a block just read is ever scanned, never the line held so far: scanning the held line
    again at every block made a newline-free input quadratic."""
    return block.rfind(b"\n") + 1


def _too_long(path: str, start: int, limit: int) -> RecordTooLong:
    return RecordTooLong(
        f"{path}: the line starting at byte {start:,} of the (decompressed) input runs past "
        f"max_record_bytes ({limit:,} bytes) without a newline; split it, or raise the limit "
        "(--max-record-bytes / BatchSpec.max_record_bytes)")


def _check_inner_lines(path: str, block: bytes, cut: int, pos: int, limit: int) -> None:
    """Refuse a line lying wholly inside ``block[:cut]`` and longer than ``limit`` (possible only
    when a block is larger than the limit): one vectorized pass over the block."""
    nl = np.flatnonzero(np.frombuffer(block, np.uint8, count=cut) == 10)  # every \n up to the cut
    over = np.flatnonzero(np.diff(nl) - 1 > limit)  # the lines between two newlines of the block
    if over.size:
        raise _too_long(path, pos + int(nl[over[0]]) + 1, limit)


def line_chunks(path: str, max_bytes: int, max_record_bytes: int = C.MAX_RECORD_BYTES) -> Iterator[bytes]:
    """The decompressed input in pieces of about ``max_bytes``, each ending at a newline (or at the
    end): a compressed input is streamed, never held whole (a small ``.gz`` can hold gigabytes).
    A cut after ``\n`` is a line boundary for ``str.splitlines`` and a UTF-8 character boundary.

    A line longer than ``max_record_bytes`` raises :class:`RecordTooLong` (a ValueError naming the
    file and the line's byte offset) as soon as it is seen to be: at most that plus one block is
    held, and each byte is scanned for a newline at most twice, whatever the lines' lengths."""
    with pa.input_stream(path, compression="detect") as fh:
        held: list[bytes] = []  # the pieces of the line not yet ended, in order
        held_bytes = 0
        pos = 0  # bytes of the decompressed input before ``block``
        while True:
            block = fh.read(max_bytes)
            if not block:
                break
            cut = newline_cut(block)
            if cut == 0:  # the open line goes on: keep the block, scan nothing more
                held.append(block)
                held_bytes += len(block)
                if held_bytes > max_record_bytes:
                    raise _too_long(path, pos + len(block) - held_bytes, max_record_bytes)
                pos += len(block)
                continue
            first = block.find(b"\n") + 1  # where the open line (or the block's first) ends
            if held_bytes + first - 1 > max_record_bytes:
                raise _too_long(path, pos - held_bytes, max_record_bytes)
            if cut - first > max_record_bytes:
                _check_inner_lines(path, block, cut, pos, max_record_bytes)
            if held:
                chunk = b"".join([*held, memoryview(block)[:cut]])
            else:
                chunk = block if cut == len(block) else block[:cut]
            held = [block[cut:]] if cut < len(block) else []
            held_bytes = len(block) - cut
            if held_bytes > max_record_bytes:
                raise _too_long(path, pos + cut, max_record_bytes)
            pos += len(block)
            yield chunk
        if held:
            yield b"".join(held)


def lines_table(chunk: bytes, column: str) -> pa.Table:
    """One document per non-empty line, as Ray Data's ``read_text`` does."""
    lines = [ln for ln in chunk.decode("utf-8").splitlines() if ln]
    return pa.table({column: pa.array(lines, pa.string())})


def json_table(chunk: bytes, where: str = "JSON input", offset: int = 0) -> pa.Table:
    """The JSON lines of a piece; its block size holds the piece whole (pyarrow's default, 1 MiB,
    refuses a record longer than that: "straddles two block boundaries").

    The piece is first scanned at the bytes level (:class:`~delta_ray._core.json_scan.JsonLinesBound`):
    a line nested deeper than ``MAX_JSON_DEPTH`` (pyarrow's recursive parser overflows its stack,
    SIGSEGV, at about 15,000 levels) or holding more than ``MAX_JSON_ITEMS`` items or
    ``MAX_JSON_KEYS`` keys (pyarrow's memory: a column per distinct key) is refused with a
    ValueError naming ``where`` and the line's byte offset (``offset``: the piece's own)."""
    JsonLinesBound(where, offset).feed(chunk)
    return pj.read_json(pa.BufferReader(chunk), read_options=pj.ReadOptions(block_size=len(chunk) + 1))


def check_json_file(path: str, block_bytes: int = C.BATCH_BYTES) -> None:
    """The check of :func:`json_table` over a whole JSONL input (decompressed as streamed, any line
    length), for readers that hand the file to pyarrow themselves (``delta-ray tokenize
    --ray-data``: Ray Data's ``read_json``). One scan carried across the blocks: a value spanning
    lines is bounded as pyarrow's reader would parse it, from any line end its blocks may start at."""
    bound = JsonLinesBound(path)
    with pa.input_stream(path, compression="detect") as fh:
        while block := fh.read(block_bytes):
            bound.feed(block)


def json_pieces(path: str, max_bytes: int, max_record_bytes: int = C.MAX_RECORD_BYTES) -> Iterator[pa.Table]:
    """A JSONL input as tables of about ``max_bytes`` of input each (:func:`line_chunks` through
    :func:`json_table`), each piece scanned with its offset in the input."""
    offset = 0
    for chunk in line_chunks(path, max_bytes, max_record_bytes):
        yield json_table(chunk, path, offset)
        offset += len(chunk)


def stream_tables(path: str, kind: str, spec: BatchSpec) -> Iterator[pa.Table]:
    """A text or JSONL input as tables of about ``spec.batch_bytes`` of input each, read as drawn."""
    if kind == "text":
        chunks = line_chunks(path, spec.batch_bytes, spec.max_record_bytes)
        tables = (lines_table(c, spec.text_column) for c in chunks)
    else:
        tables = json_pieces(path, spec.batch_bytes, spec.max_record_bytes)
    for table in tables:
        if table.num_rows:
            yield table


def read_json(path: str) -> pa.Table:
    """A whole JSONL input, streamed in pieces (their schemas unified)."""
    parts = [p for p in json_pieces(path, C.BATCH_BYTES) if p.num_rows]
    if not parts:
        return pa.table({})
    return pa.concat_tables(parts, promote_options="permissive")


def conform(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    """A later piece of a JSONL input in its file's schema (that of the first piece): missing
    columns become nulls, types are cast; a column the first piece lacks, or a cast that fails, is
    a ValueError (one Parquet file has one schema)."""
    if table.schema.equals(schema):
        return table
    extra = [n for n in table.column_names if n not in schema.names]
    if extra:
        raise ValueError(f"{where}: columns {extra} appear after the first {C.BATCH_BYTES >> 20} MiB; "
                         "one output file has one schema (convert the input to Parquet first)")
    cols = []
    for f in schema:
        if f.name in table.column_names:
            try:
                cols.append(table.column(f.name).cast(f.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(f"{where}: column {f.name!r} changes type to "
                                 f"{table.schema.field(f.name).type} (first {f.type}): {exc}") from exc
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def units(path: str, kind: str, opts: BatchSpec) -> Iterator[Callable[[], pa.Table]]:
    """Loaders for the input's units, in row order (each loads when called, in a worker thread)."""
    if kind == "parquet":
        pf = pq.ParquetFile(path)
        meta = pf.metadata
        groups: list[int] = []
        size = 0

        def read_groups(g: tuple) -> Callable[[], pa.Table]:
            return lambda: pq.ParquetFile(path).read_row_groups(list(g))
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            if rg.total_byte_size > 2 * opts.batch_bytes and rg.num_rows > 1:
                # A large row group (pyarrow writes a 100 MB file as one by default) would be one
                # unit: one thread, and the whole group as Python strings at once. Stream it in
                # batches of about batch_bytes instead, read here (the caller draws units only as
                # fast as the threads take them), so its batches encode in parallel.
                if groups:
                    yield read_groups(tuple(groups))
                    groups, size = [], 0
                rows = max(1, rg.num_rows * opts.batch_bytes // rg.total_byte_size)
                for batch in pf.iter_batches(batch_size=rows, row_groups=[i]):
                    yield (lambda t=pa.Table.from_batches([batch]): t)
                continue
            groups.append(i)
            size += rg.total_byte_size
            if size >= opts.batch_bytes:
                yield read_groups(tuple(groups))
                groups, size = [], 0
        if groups:
            yield read_groups(tuple(groups))
        elif meta.num_row_groups == 0:
            yield (lambda: pq.ParquetFile(path).schema_arrow.empty_table())
        return
    # Text and JSONL (compressed or not) are streamed: each piece is read when the caller draws
    # it, and the caller draws only as fast as the threads take units, so memory stays bounded.
    empty = True
    for table in stream_tables(path, kind, opts):
        empty = False
        yield (lambda t=table: t)
    if empty:
        yield (lambda: pa.table({opts.text_column: pa.array([], pa.string())}))


def byte_slices(texts: pa.Array | pa.ChunkedArray, max_bytes: int) -> Iterator[tuple[int, int]]:
    """Consecutive row ranges ``[start, end)`` covering ``texts``, each holding at most
    ``max_bytes`` of UTF-8 (or one row, when that row alone is larger)."""
    cum = np.cumsum(np.asarray(pa.compute.binary_length(texts).fill_null(0), dtype=np.int64))
    start, n = 0, len(cum)
    while start < n:
        base = cum[start - 1] if start else 0
        end = int(np.searchsorted(cum, base + max_bytes, side="right"))
        end = min(max(end, start + 1), n)
        yield start, end
        start = end
