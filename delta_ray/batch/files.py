"""Tokenize files to Parquet at the machine's limit: Ray-free, resumable, output from engine buffers.

What ``delta-ray tokenize`` runs on one node. Each input is split into *units* (Parquet row
groups, a large one streamed in batches of about ``batch_bytes``; text and JSONL, compressed or
not, streamed in pieces of about ``batch_bytes`` of input, never held whole); units from all
inputs go, in order, to a thread pool whose threads read their unit and encode it with
:meth:`TokenizerCore.encode_batch_flat` (the engine drops the GIL, so the threads use every core);
the ``list<int32>`` column is built from the engine's flat values buffer plus offsets, with no
Python object per token. Each input's units are written in order by that input's own writer
thread (several inputs are written at once: Parquet writing drops the GIL), so the output keeps the
input's row order.

One run per output directory: a run holds an exclusive lock on ``<out>/.delta-ray.lock``
(:func:`output_lock`), so two runs cannot remove each other's temporary files or publish each
other's rows; the kernel drops the lock when a process dies.

Atomic and resumable: an input's output is written to a hidden temporary file, renamed into place
when complete, and then recorded in a manifest (``_delta_ray_done/<output>.json``: the input's path,
size and mtime, the tokenizer's digest and the options, the rows and tokens written, the output's
size and SHA-256; Parquet readers skip ``_`` and ``.`` names). A rerun skips an input whose manifest
matches and whose output file still has the size and SHA-256 the manifest records (and the rows,
read from its Parquet footer), and redoes the rest from scratch, so a run killed at any point and
rerun gives exactly the output of an uninterrupted run; stray temporary files of a killed run are
removed. An input listed twice (two spellings, a symlink or a hard link) is refused: its
documents would be written twice.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._core.text_columns import BatchSpec, encode_table
from .._tokenizer_core import TokenizerCore
from ..tokenizer import DeltaTokenizer
from .inputs import check_distinct, conform, input_kind, json_table, line_chunks, stream_tables, units

MANIFEST_FORMAT = 2  # 2: the output's size and SHA-256 (a manifest without them is redone)
TMP_MARK = ".delta-ray-tmp"
MANIFESTS = "_delta_ray_done"  # readers of the output directory skip names starting with "_" or "."


def output_name(path: str) -> str:
    """The output file of an input: its stem plus a digest of its absolute path (no collisions)."""
    p = Path(path).resolve()
    stem = p.name.split(".")[0] or "input"
    return f"{stem}-{hashlib.sha256(str(p).encode()).hexdigest()[:10]}.parquet"


# The one batch specification (columns, flags, batch bytes, engine, threads): see text_columns.
Options = BatchSpec


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


# -- the run --------------------------------------------------------------------------------------
def _manifest(path: str, digest: str, opts: Options) -> dict:
    st = os.stat(path)
    return {"format": MANIFEST_FORMAT, "input": str(Path(path).resolve()), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "tokenizer_sha256": digest, "options": opts.digest()}


def _manifest_path(out_dir: Path, name: str) -> Path:
    return out_dir / MANIFESTS / (name + ".json")


def temp_path(out_dir: Path, name: str) -> Path:
    """A hidden temporary file for ``name`` that no other writer can share (this process's id and
    a random part): a stray of a killed run, or a second writer, never meets this one."""
    return out_dir / f".{name}.{os.getpid()}-{uuid.uuid4().hex[:16]}{TMP_MARK}"


def is_previous_output(out_dir: str) -> bool:
    """Whether a directory holds this tool's earlier output (a rerun may resume into it): its
    manifests, or at least the lock file of a run that stopped before its first output."""
    return (Path(out_dir) / MANIFESTS).is_dir() or (Path(out_dir) / LOCK_NAME).is_file()


def check_text_column(path: str, opts: BatchSpec) -> None:
    """Refuse, before any work, an input whose text column is missing or not text (the spec's one
    schema check; a JSONL input by its first MiB of whole lines, a text input always has it). What
    it reads is bounded: a first line longer than ``opts.max_record_bytes`` is refused here."""
    kind = input_kind(path)
    if kind == "parquet":
        schema = pq.ParquetFile(path).schema_arrow
    elif kind == "json":
        chunks = line_chunks(path, 1 << 20, opts.max_record_bytes)
        try:
            head = next(chunks, b"")  # the first MiB of whole lines (at least one line)
        finally:
            chunks.close()
        schema = json_table(head, path).schema if head.strip() else None
    else:
        return
    if schema is not None:
        opts.check_schema(schema, where=path)


def file_sha256(path: Path) -> tuple[int, str]:
    """A file's size and SHA-256, read in 1 MiB blocks (hashlib drops the GIL on each)."""
    h, size = hashlib.sha256(), 0
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
            size += n
    return size, h.hexdigest()


def _done(out_dir: Path, name: str, expect: dict) -> dict | None:
    """The manifest of an input done earlier with the same input, tokenizer and options, if the
    output file it names is still the file that run wrote: its size and SHA-256 as recorded (the
    whole file: a footer digest would miss changed IDs, which are written without statistics), and
    the rows recorded (its Parquet footer). A file replaced or cut short since is redone."""
    try:
        doc = json.loads(_manifest_path(out_dir, name).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or {k: doc.get(k) for k in expect} != expect:
        return None
    target = out_dir / name
    try:
        if target.stat().st_size != doc.get("output_size") or file_sha256(target) != \
                (doc.get("output_size"), doc.get("output_sha256")):
            return None
        rows = pq.ParquetFile(target).metadata.num_rows
    except (OSError, pa.ArrowException):
        return None
    if rows != doc.get("rows"):
        return None
    return doc


LOCK_NAME = ".delta-ray.lock"


class OutputLocked(RuntimeError):
    """Another run is writing to the same output directory."""


@contextmanager
def output_lock(out_dir: Path):
    """Hold the output directory's lock (an exclusive ``flock`` on ``<out>/.delta-ray.lock``) for
    a run: two runs on one directory would remove each other's temporary files, overwrite each
    other's outputs and publish a file under another run's manifest. The kernel drops the lock
    when the process dies, so a killed run never leaves the directory locked."""
    fd = os.open(out_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputLocked(f"{out_dir}: another delta-ray tokenize is writing to this directory") from None
        yield
    finally:
        os.close(fd)  # releases the lock


class _OutputFile:
    """One input's output, written by its own thread so that several files are written at once.

    Units are written in submission order (a one-thread executor); the file is renamed into place
    and its manifest written only after every unit was written, so a failure or a kill leaves at
    most a hidden temporary file, never a partial output that a rerun would skip.
    """

    def __init__(self, out: Path, path: str, name: str, expect: dict, opts: Options):
        self.out, self.path, self.name, self.expect, self.opts = out, path, name, expect, opts
        self.tmp = temp_path(out, name)
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
                self._schema = table.schema
            elif not table.schema.equals(self._schema):  # a later piece of a JSONL input
                table = conform(table, self._schema, self.path)
            self._writer.write_table(table)
            self._rows += table.num_rows
            self._tokens += tokens
        except BaseException as exc:
            self._failed = exc
            raise

    def _publish(self) -> None:
        if self._failed is not None:
            raise self._failed
        size = digest = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            size, digest = file_sha256(self.tmp)  # what this run wrote, read back from the page cache
            os.replace(self.tmp, self.out / self.name)
        doc = {**self.expect, "rows": self._rows, "tokens": self._tokens, "output_size": size,
               "output_sha256": digest}
        mp = _manifest_path(self.out, self.name)
        mp.parent.mkdir(exist_ok=True)
        tmp_doc = temp_path(mp.parent, mp.name)
        tmp_doc.write_text(json.dumps(doc))
        os.replace(tmp_doc, mp)


def tokenize_files(inputs: list[str], out_dir: str, dt: TokenizerCore | DeltaTokenizer, opts: Options, *,
                   threads: int | None = None, progress: Callable[[int, int, int], None] | None = None) -> Summary:
    """Tokenize ``inputs`` into ``out_dir`` (one Parquet file per input); returns the summary.

    ``dt`` is the user's :class:`~delta_ray.DeltaTokenizer` or the core it wraps.

    ``progress(text_bytes_done, text_bytes_total, tokens_done)`` is called as units complete.
    ``threads`` defaults to ``opts.threads``, else the CPUs this process may use. The output
    directory is locked for the run (:class:`OutputLocked` if another run holds it). A file listed
    twice (by two spellings or a link) is refused with a ValueError before anything is written.
    """
    if isinstance(dt, DeltaTokenizer):
        dt = dt.core
    check_distinct(inputs)  # before the output directory is touched
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        return _tokenize_files(inputs, out, dt, opts, threads=threads or opts.encode_threads(), progress=progress)


def _tokenize_files(inputs: list[str], out: Path, dt: TokenizerCore, opts: Options, *, threads: int,
                    progress: Callable[[int, int, int], None] | None) -> Summary:
    for stray in [*out.glob(f".*{TMP_MARK}"), *out.glob(f"{MANIFESTS}/.*{TMP_MARK}")]:
        stray.unlink()  # a killed run's half-written files
    summary = Summary(inputs=len(inputs))
    todo = []
    total_bytes = 0
    for path in inputs:
        if input_kind(path) is None:
            raise ValueError(f"{path}: unknown input type")
    names = [output_name(p) for p in inputs]
    expects = [_manifest(p, dt.digest, opts) for p in inputs]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="delta-ray-resume") as pool:
        docs = list(pool.map(_done, [out] * len(inputs), names, expects))  # hashes the outputs in parallel
    for path, name, expect, doc in zip(inputs, names, expects, docs):
        kind = input_kind(path)
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
                for load in units(path, kind, opts):
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


def _picked(batches: Iterator[pa.Array | pa.ChunkedArray], rows: list[int]) -> list:
    """The values at ``rows`` (sorted) of a column drawn batch by batch: only they are kept."""
    out, base, i = [], 0, 0
    for col in batches:
        end = base + len(col)
        while i < len(rows) and rows[i] < end:
            out.append(col[rows[i] - base].as_py())
            i += 1
        base = end
        if i == len(rows):
            break
    return out


def _texts(src: str, opts: BatchSpec) -> Iterator[pa.Array | pa.ChunkedArray]:
    """An input's text column, streamed as the run read it (never the whole input at once)."""
    if input_kind(src) == "parquet":
        for batch in pq.ParquetFile(src).iter_batches(columns=[opts.text_column]):
            yield batch.column(0)
        return
    for table in stream_tables(src, input_kind(src), opts):
        yield table.column(opts.text_column)


def verify_outputs(inputs: list[str], out_dir: str, reference, opts: BatchSpec, n: int,
                   seed: int = 0) -> tuple[int, list[str]]:
    """Compare ``n`` random rows of the outputs with the reference; returns (checked, mismatches).
    Inputs and outputs are streamed: only the sampled rows are kept."""
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
        rows = [int(r - lo) for r in picks if lo <= r < hi]
        if not rows:
            continue
        got = _picked((b.column(0) for b in pq.ParquetFile(dst).iter_batches(columns=[opts.output_column])), rows)
        texts = _picked(_texts(src, opts), rows)
        if len(texts) < len(rows):  # the input lost rows since its output was written
            bad.append(f"{src}: fewer rows than its output {dst.name}")
        for r, text, ids in zip(rows, texts, got):
            want = reference.encode(text, add_special_tokens=opts.add_special_tokens).ids
            checked += 1
            if ids != want:
                bad.append(f"{src} row {r}")
    return checked, bad
