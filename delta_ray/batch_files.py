"""Tokenize files to Parquet at the machine's limit: Ray-free, resumable, output from engine buffers.

What ``delta-ray tokenize`` runs on one node. Each input is split into *units* (Parquet row
groups, a large one streamed in batches of about ``batch_bytes``; or sub-batches of about
``batch_bytes`` of text); units from all inputs go, in order, to a
thread pool whose threads read their unit and encode it with
:meth:`TokenizerCore.encode_batch_flat` (the engine drops the GIL, so the threads use every core);
the ``list<int32>`` column is built from the engine's flat values buffer plus offsets, with no
Python object per token. Each input's units are written in order by that input's own writer
thread (several inputs are written at once: Parquet writing drops the GIL), so the output keeps the
input's row order.

Atomic and resumable: an input's output is written to a hidden temporary file, renamed into place
when complete, and then recorded in a manifest (``_delta_ray_done/<output>.json``: the input's path,
size and mtime, the tokenizer's digest and the options; Parquet readers skip ``_`` and ``.`` names). A rerun skips inputs whose manifest matches and redoes the
rest from scratch, so a run killed at any point and rerun gives exactly the output of an
uninterrupted run; stray temporary files of a killed run are removed.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import constants as C
from .text_columns import checked_text_column, id_columns, is_text_type
from .tokenizer import TokenizerCore

KINDS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
COMPRESSED = (".gz", ".bz2", ".zst")
MANIFEST_FORMAT = 1
TMP_MARK = ".delta-ray-tmp"
MANIFESTS = "_delta_ray_done"  # readers of the output directory skip names starting with "_" or "."


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


def output_name(path: str) -> str:
    """The output file of an input: its stem plus a digest of its absolute path (no collisions)."""
    p = Path(path).resolve()
    stem = p.name.split(".")[0] or "input"
    return f"{stem}-{hashlib.sha256(str(p).encode()).hexdigest()[:10]}.parquet"


@dataclass
class Options:
    text_column: str = "text"
    output_column: str = "input_ids"
    count_column: str | None = "num_tokens"
    add_special_tokens: bool = True
    drop_text: bool = False
    batch_bytes: int = C.BATCH_BYTES

    def digest(self) -> str:
        doc = {k: getattr(self, k) for k in ("text_column", "output_column", "count_column",
                                             "add_special_tokens", "drop_text")}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Summary:
    inputs: int = 0
    skipped: int = 0
    documents: int = 0
    tokens: int = 0
    text_bytes: int = 0
    seconds: float = 0.0
    outputs: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


# -- reading --------------------------------------------------------------------------------------
def _read_lines(path: str, column: str) -> pa.Table:
    """One document per non-empty line, as Ray Data's ``read_text`` does."""
    with pa.input_stream(path, compression="detect") as fh:
        data = fh.read().decode("utf-8")
    lines = [ln for ln in data.splitlines() if ln]
    return pa.table({column: pa.array(lines, pa.string())})


def _read_json(path: str) -> pa.Table:
    import pyarrow.json as pj
    with pa.input_stream(path, compression="detect") as fh:
        return pj.read_json(fh)


def _units(path: str, kind: str, opts: Options) -> Iterator[Callable[[], pa.Table]]:
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
    table = _read_lines(path, opts.text_column) if kind == "text" else _read_json(path)
    col = table.column(opts.text_column) if opts.text_column in table.column_names else None
    if col is None or table.num_rows == 0:
        yield (lambda t=table: t)
        return
    for start, end in byte_slices(col, opts.batch_bytes):
        yield (lambda s=start, e=end: table.slice(s, e - s))


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


# -- encoding one unit ----------------------------------------------------------------------------
def encode_table(dt: TokenizerCore, table: pa.Table, opts: Options) -> tuple[pa.Table, int, int]:
    """The unit with its IDs (and count) columns added; returns (table, tokens, text bytes)."""
    col = checked_text_column(table, opts.text_column)
    texts = col.to_pylist()
    nbytes = int(sum(c.nbytes for c in col.chunks))
    values, offsets = dt.encode_batch_flat(texts, add_special_tokens=opts.add_special_tokens)
    del texts
    ids, counts = id_columns(values, offsets)
    out = table.drop_columns([opts.text_column]) if opts.drop_text else table
    out = out.append_column(opts.output_column, ids)
    if opts.count_column:
        out = out.append_column(opts.count_column, counts)
    return out, int(offsets[-1]), nbytes


# -- the run --------------------------------------------------------------------------------------
def _manifest(path: str, digest: str, opts: Options) -> dict:
    st = os.stat(path)
    return {"format": MANIFEST_FORMAT, "input": str(Path(path).resolve()), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "tokenizer_sha256": digest, "options": opts.digest()}


def _manifest_path(out_dir: Path, name: str) -> Path:
    return out_dir / MANIFESTS / (name + ".json")


def _tmp_path(out_dir: Path, name: str) -> Path:
    return out_dir / f".{name}{TMP_MARK}"


def is_previous_output(out_dir: str) -> bool:
    """Whether a directory holds this tool's earlier output (a rerun may resume into it)."""
    return (Path(out_dir) / MANIFESTS).is_dir()


def check_text_column(path: str, opts: Options) -> None:
    """Refuse, before any work, an input whose text column is missing or not text."""
    kind = input_kind(path)
    if kind == "parquet":
        schema = pq.ParquetFile(path).schema_arrow
    elif kind == "json":
        import pyarrow.json as pj
        with pa.input_stream(path, compression="detect") as fh:
            head = fh.read(1 << 20)
        head = head[:head.rfind(b"\n") + 1] or head
        schema = pj.read_json(pa.BufferReader(head)).schema if head.strip() else None
    else:
        return
    if schema is None:
        return
    if opts.text_column not in schema.names:
        raise ValueError(f"{path}: no text column {opts.text_column!r}; its columns are {schema.names}")
    t = schema.field(opts.text_column).type
    if not (is_text_type(t) or pa.types.is_null(t)):
        raise TypeError(f"{path}: text column {opts.text_column!r} must hold strings, not {t}")


def _done(out_dir: Path, name: str, expect: dict) -> dict | None:
    try:
        doc = json.loads(_manifest_path(out_dir, name).read_text())
    except (OSError, ValueError):
        return None
    if not (out_dir / name).exists() or {k: doc.get(k) for k in expect} != expect:
        return None
    return doc


class _OutputFile:
    """One input's output, written by its own thread so that several files are written at once.

    Units are written in submission order (a one-thread executor); the file is renamed into place
    and its manifest written only after every unit was written, so a failure or a kill leaves at
    most a hidden temporary file, never a partial output that a rerun would skip.
    """

    def __init__(self, out: Path, path: str, name: str, expect: dict, opts: Options):
        self.out, self.path, self.name, self.expect, self.opts = out, path, name, expect, opts
        self.tmp = _tmp_path(out, name)
        self._writer: pq.ParquetWriter | None = None
        self._rows = self._tokens = 0
        self._failed: BaseException | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="delta-ray-write")

    def write(self, table: pa.Table, tokens: int):
        return self._thread.submit(self._write, table, tokens)

    def publish(self):
        done = self._thread.submit(self._publish)
        self._thread.shutdown(wait=False)  # its thread ends after the queued writes and this
        return done

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)
        if self._writer is not None:  # not published: a failed run (the rename never happened)
            self._writer.close()
            self._writer = None

    def _write(self, table: pa.Table, tokens: int) -> None:
        if self._failed is not None:
            return
        try:
            if self._writer is None:
                # Token IDs barely repeat within a page: dictionary encoding and min/max statistics
                # cost half the write time of the IDs column (measured) and buy nothing.
                opts = self.opts
                plain = [c for c in table.schema.names if c not in (opts.output_column, opts.count_column)]
                self._writer = pq.ParquetWriter(self.tmp, table.schema, use_dictionary=plain or False,
                                                write_statistics=plain or False)
            self._writer.write_table(table)
            self._rows += table.num_rows
            self._tokens += tokens
        except BaseException as exc:
            self._failed = exc
            raise

    def _publish(self) -> None:
        if self._failed is not None:
            raise self._failed
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            os.replace(self.tmp, self.out / self.name)
        doc = {**self.expect, "rows": self._rows, "tokens": self._tokens}
        mp = _manifest_path(self.out, self.name)
        mp.parent.mkdir(exist_ok=True)
        tmp_doc = mp.parent / f".{mp.name}{TMP_MARK}"
        tmp_doc.write_text(json.dumps(doc))
        os.replace(tmp_doc, mp)


def tokenize_files(inputs: list[str], out_dir: str, dt: TokenizerCore, opts: Options, *,
                   threads: int | None = None, progress: Callable[[int, int, int], None] | None = None) -> Summary:
    """Tokenize ``inputs`` into ``out_dir`` (one Parquet file per input); returns the summary.

    ``progress(text_bytes_done, text_bytes_total, tokens_done)`` is called as units complete.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stray in [*out.glob(f".*{TMP_MARK}"), *out.glob(f"{MANIFESTS}/.*{TMP_MARK}")]:
        stray.unlink()  # a killed run's half-written files
    threads = threads or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    summary = Summary(inputs=len(inputs))
    todo = []
    total_bytes = 0
    for path in inputs:
        kind = input_kind(path)
        if kind is None:
            raise ValueError(f"{path}: unknown input type")
        name = output_name(path)
        expect = _manifest(path, dt.digest, opts)
        doc = _done(out, name, expect)
        summary.outputs.append(str(out / name))
        if doc is not None:
            summary.skipped += 1
            continue
        todo.append((path, kind, name, expect))
        total_bytes += os.path.getsize(path)
    t0 = time.perf_counter()
    done_bytes = 0
    window = 2 * threads  # units read and encoded ahead of the writers, and units queued to write
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="delta-ray-tokenize") as pool:
        def work(load):
            return encode_table(dt, load(), opts)

        def submissions():
            for path, kind, name, expect in todo:
                for load in _units(path, kind, opts):
                    yield path, name, expect, load

        pending: list = []
        it = submissions()

        def refill():
            while len(pending) < window:
                try:
                    path, name, expect, load = next(it)
                except StopIteration:
                    return
                pending.append((path, name, expect, pool.submit(work, load)))

        current: _OutputFile | None = None
        outputs: list[_OutputFile] = []
        writes: list = []  # write futures not yet known to be done, oldest first
        try:
            refill()
            while pending:
                path, name, expect, fut = pending.pop(0)
                table, tokens, nbytes = fut.result()
                refill()
                if current is None or current.path != path:
                    if current is not None:
                        writes.append(current.publish())
                    current = _OutputFile(out, path, name, expect, opts)
                    outputs.append(current)
                writes.append(current.write(table, tokens))
                while len(writes) > window:  # bounds the encoded tables held for writing
                    writes.pop(0).result()
                summary.documents += table.num_rows
                summary.tokens += tokens
                summary.text_bytes += nbytes
                done_bytes += nbytes
                if progress is not None:
                    progress(done_bytes, total_bytes, summary.tokens)
            if current is not None:
                writes.append(current.publish())
            for w in writes:
                w.result()
        finally:
            for o in outputs:
                o.close()
    summary.seconds = time.perf_counter() - t0
    return summary


def verify_outputs(inputs: list[str], out_dir: str, reference, opts: Options, n: int,
                   seed: int = 0) -> tuple[int, list[str]]:
    """Compare ``n`` random rows of the outputs with the reference; returns (checked, mismatches)."""
    rng = random.Random(seed)
    out = Path(out_dir)
    files = [(p, out / output_name(p)) for p in inputs]
    sizes = [pq.ParquetFile(f).metadata.num_rows for _, f in files]
    total = sum(sizes)
    if total == 0 or n <= 0:
        return 0, []
    picks = sorted(rng.sample(range(total), min(n, total)))
    bad, checked = [], 0
    bounds = np.cumsum([0] + sizes)
    for (src, dst), lo, hi in zip(files, bounds[:-1], bounds[1:]):
        rows = [r - lo for r in picks if lo <= r < hi]
        if not rows:
            continue
        got = pq.read_table(dst, columns=[opts.output_column]).column(opts.output_column)
        kind = input_kind(src)
        if kind == "parquet":
            texts = pq.read_table(src, columns=[opts.text_column]).column(opts.text_column)
        elif kind == "text":
            texts = _read_lines(src, opts.text_column).column(opts.text_column)
        else:
            texts = _read_json(src).column(opts.text_column)
        for r in rows:
            text = texts[r].as_py()
            want = reference.encode(text, add_special_tokens=opts.add_special_tokens).ids
            checked += 1
            if got[r].as_py() != want:
                bad.append(f"{src} row {r}")
    return checked, bad
