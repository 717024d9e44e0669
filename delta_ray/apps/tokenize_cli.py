"""``delta-ray tokenize``: text / JSONL / Parquet files to Parquet with the reference token IDs.

    delta-ray tokenize --tokenizer PATH INPUT... --output DIR [--text-column text] [--engine auto]
                       [--threads N] [--verify N] [--no-special-tokens] [--drop-text] [--ray-data]
                       [--max-record-bytes N]

By default the job runs on this machine at its limit, without Ray (:mod:`delta_ray.batch.files`):
one Parquet file per input, read in parallel and encoded on every core from the engine's flat
buffers, each written atomically; a rerun skips the inputs already done, so a killed run rerun
gives exactly the output of an uninterrupted one. It shows a progress bar with tokens/s, ends with
a summary, and ``--verify N`` checks N random rows against the reference. ``--ray-data`` runs the
same encode on Ray Data instead (for a cluster; one directory of part files): tasks fused with the
reads and writes by default (one read task per file where Ray Data would split the files:
:func:`delta_ray.actors.data_reads.per_file_read`), an actor pool with ``--concurrency``. Both
paths take one :class:`~delta_ray._core.text_columns.BatchSpec` built from the options (:func:`spec_of`):
the columns, ``--no-special-tokens``, ``--drop-text``, ``--batch-bytes``, ``--engine`` and
``--threads`` mean the same on both; ``--concurrency``, ``--num-cpus`` and ``--batch-size`` size the
Ray Data stage and are refused without ``--ray-data``. One output directory takes one run at a time
(a lock); a rerun skips an input only if its output file still has the size and SHA-256 (and the
rows) its manifest records. One file listed twice (the same path, or through a symlink or a hard
link) is a usage error on both paths: its documents would be written twice.

Inputs by extension: ``.txt`` is one document per line (empty lines skipped; Ray Data's
``read_text``), ``.jsonl``/``.json`` newline-delimited JSON objects (``read_json``), ``.parquet``
(``read_parquet``); ``.txt``/``.jsonl``/``.json`` may end in ``.gz``, ``.bz2`` or ``.zst`` (streamed
in pieces of ``--batch-bytes``, never decompressed whole; without ``--ray-data`` a line longer than
``--max-record-bytes``, 64 MiB by default, is refused naming the file and the line's offset; on both
paths a JSONL line nested too deep or holding too many items or keys is refused the same way, before
pyarrow parses it: :mod:`delta_ray._core.json_scan`). The
output keeps the input columns (``--drop-text`` omits the text) and adds the ``list<int32>`` IDs and
an ``int32`` count column; ``--output`` is a new or empty local directory (on a multi-node cluster,
one every node can write: a shared file system) or a URI Ray Data can write to; its rows keep the
input columns, in the order Ray Data's blocks finish. A local Ray is started when none is
running and shut down afterwards; a Ray the caller already runs is left alone. Usage errors exit
with status 2, a failure while the pipeline runs (e.g. a null text) with status 1.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

from delta_ray._core import constants as C
from delta_ray._core.loading import load_tokenizer
from delta_ray._core.text_columns import BatchSpec
from delta_ray._tokenizer_core import TokenizerCore
from delta_ray.batch import files as batch_files
from delta_ray.batch.inputs import COMPRESSED, DuplicateInput, check_distinct, check_json_file, input_kind


class UsageError(Exception):
    """A bad command line: reported with exit status 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="files: .txt (one document per line), .jsonl/.json, .parquet "
                             "(.txt/.jsonl/.json may be .gz/.bz2/.zst compressed)")
    parser.add_argument("--tokenizer", required=True, help="tokenizer.json or a directory holding one")
    parser.add_argument("--output", "-o", required=True, metavar="DIR",
                        help="directory for the Parquet output (must not exist or be empty)")
    parser.add_argument("--text-column", default="text", help="column holding the texts (default: text)")
    parser.add_argument("--output-column", default="input_ids", help="IDs column (default: input_ids)")
    parser.add_argument("--count-column", default="num_tokens", help="token count column (default: num_tokens)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="--ray-data: an actor pool of this many tokenizer actors (default: no pool; "
                             "Ray Data tasks fused with the reads and writes)")
    parser.add_argument("--num-cpus", type=float, default=None,
                        help="--ray-data: CPUs reserved per task or actor (default: 1 per task, as Ray Data's "
                             "reads, so they fuse; 0.5 per actor)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="--ray-data: rows per call (default: whole Ray Data blocks)")
    parser.add_argument("--batch-bytes", type=int, default=None,
                        help=f"most text encoded at once, in bytes (default: {8 << 20})")
    parser.add_argument("--max-record-bytes", type=int, default=None,
                        help=f"longest line of a text/JSONL input, in bytes after decompression (default: "
                             f"{C.MAX_RECORD_BYTES}); a longer one is refused naming the file and offset. Not with "
                             "--ray-data (Ray Data reads with its own readers)")
    parser.add_argument("--no-special-tokens", action="store_true",
                        help="encode with add_special_tokens=False (no BOS/template tokens)")
    parser.add_argument("--drop-text", action="store_true", help="do not copy the text column to the output")
    parser.add_argument("--threads", type=int, default=None,
                        help="encode threads (default: the CPUs; with --ray-data, per actor: its node's CPUs)")
    parser.add_argument("--verify", type=int, default=0, metavar="N",
                        help="check N random output rows against the reference tokenizer")
    parser.add_argument("--engine", default="auto", choices=("auto", "fast", "reference"),
                        help="encoder inside the cuts (default auto: the fast tier once admitted)")
    parser.add_argument("--ray-data", action="store_true",
                        help="run on Ray Data (a cluster) instead of this machine's threads")


# Options that size the Ray Data pool: refused on the local path rather than silently ignored.
RAY_ONLY = ("concurrency", "num_cpus", "batch_size")
# Options of delta-ray's own reader: refused with --ray-data (whose readers are Ray Data's).
LOCAL_ONLY = ("max_record_bytes",)


def spec_of(args: argparse.Namespace):
    """The one batch specification both paths run with, from the command line."""
    fields = dict(text_column=args.text_column, output_column=args.output_column,
                  count_column=args.count_column or None, add_special_tokens=not args.no_special_tokens,
                  drop_text=args.drop_text, engine=args.engine, threads=args.threads)
    for name in ("batch_bytes", "max_record_bytes"):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    try:
        return BatchSpec(**fields)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from exc


def _check_inputs(paths: list[str]) -> dict[str, list[str]]:
    """The inputs grouped by kind, or a UsageError: a missing file, a directory, an unknown type,
    one file listed twice (by two spellings or a link: its documents would be written twice)."""
    groups: dict[str, list[str]] = {}
    for p in paths:
        if not os.path.exists(p):
            raise UsageError(f"{p}: no such input file")
        if os.path.isdir(p):
            raise UsageError(f"{p}: is a directory; pass the files (e.g. {p}/*.parquet)")
        kind = input_kind(p)
        if kind is None:
            raise UsageError(f"{p}: unknown input type (expected .txt, .jsonl, .json or .parquet; "
                             f"text and JSON may be compressed with {', '.join(COMPRESSED)})")
        groups.setdefault(kind, []).append(os.path.abspath(p))
    try:
        check_distinct(paths)
    except DuplicateInput as exc:
        raise UsageError(str(exc)) from None
    return groups


def _check_output(out: str, ray_data: bool) -> None:
    if "://" in out:  # a URI (s3://, gs://, ...): Ray Data's writer checks it
        if not ray_data:
            raise UsageError(f"{out}: a URI output needs --ray-data")
        return
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{out}: output must be a new or empty directory")
    if p.exists() and any(p.iterdir()) and (ray_data or not batch_files.is_previous_output(out)):
        raise UsageError(f"{out}: output must be a new or empty directory (or an earlier run's, to resume)")


def _read(groups: dict[str, list[str]], text_column: str):
    import ray.data

    from delta_ray.actors.data_reads import per_file_read  # lazy: the Ray glue, for --ray-data only

    readers = {"text": ray.data.read_text, "json": ray.data.read_json, "parquet": ray.data.read_parquet}
    for path in groups.get("json", []):  # Ray Data hands the file to pyarrow's reader: bounded first
        check_json_file(path)
    parts = []
    for kind, paths in groups.items():
        ds = per_file_read(readers[kind](paths))
        if kind == "text" and text_column != "text":
            ds = ds.rename_columns({"text": text_column})
        parts.append(ds)
    return parts[0] if len(parts) == 1 else parts[0].union(*parts[1:])


def _run_local(args: argparse.Namespace, loaded, spec) -> int:
    """This machine at its limit: threads over every core, atomic per-input outputs, resumable."""
    opts = spec
    inputs = [os.path.abspath(p) for p in args.inputs]
    dt = TokenizerCore(loaded, engine=spec.engine, reuse="none")
    bar = _progress()
    try:
        summary = batch_files.tokenize_files(inputs, args.output, dt, spec, progress=bar)
    except (ValueError, TypeError, OSError, batch_files.OutputLocked) as exc:
        print(f"\ndelta-ray tokenize: failed: {exc}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    print(f"tokenized {summary.documents:,} documents into {summary.tokens:,} tokens in {summary.seconds:.1f} s: "
          f"{summary.tokens_per_s:,.0f} tokens/s ({summary.inputs - summary.skipped} of {summary.inputs} inputs; "
          f"{summary.skipped} already done) -> {args.output}   [{dt.admission.engine}]")
    if args.verify:
        checked, bad = batch_files.verify_outputs(inputs, args.output, loaded.tokenizer, opts, args.verify)
        if bad:
            print(f"verify: {len(bad)} of {checked} rows differ from the reference: {bad[:5]}", file=sys.stderr)
            return 1
        print(f"verify: {checked} random rows equal the reference")
    return 0


class _progress:
    """A tqdm bar over input bytes with tokens/s, when stderr is a terminal; silent otherwise."""

    def __init__(self):
        self._bar = None
        self._t0 = time.perf_counter()
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm  # lazy: optional; without it, no bar
                self._bar = tqdm(total=0, unit="B", unit_scale=True, desc="tokenize", file=sys.stderr)
            except ImportError:
                pass

    def __call__(self, done: int, total: int, tokens: int) -> None:
        if self._bar is None:
            return
        self._bar.total = total
        self._bar.n = done
        rate = tokens / max(time.perf_counter() - self._t0, 1e-9)
        self._bar.set_postfix_str(f"{tokens:,} tokens, {rate / 1e6:.2f}M tokens/s", refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _written_totals(out: str, count_column: str | None, output_column: str) -> tuple[int, int]:
    # lazy: pyarrow.dataset is heavy at import, and only the summary and --verify read outputs back
    import pyarrow.compute as pc
    import pyarrow.dataset as pds

    if count_column is None:
        table = pds.dataset(out, format="parquet").to_table(columns=[output_column])
        total = pc.sum(pc.list_value_length(table.column(output_column))).as_py() or 0
    else:
        table = pds.dataset(out, format="parquet").to_table(columns=[count_column])
        total = pc.sum(table.column(count_column)).as_py() or 0
    return table.num_rows, int(total)


def _verify_output(out: str, reference, spec, n: int, seed: int = 0) -> tuple[int, list[str]]:
    """``n`` random rows of a ``--ray-data`` output compared with the reference by their own text
    column (Ray Data does not keep the inputs' row order, so rows are checked by content)."""
    import pyarrow.dataset as pds  # lazy: heavy at import, as above

    table = pds.dataset(out, format="parquet").to_table(columns=[spec.text_column, spec.output_column])
    rng = random.Random(seed)
    rows = sorted(rng.sample(range(table.num_rows), min(n, table.num_rows)))
    bad = []
    for r in rows:
        want = reference.encode(table.column(spec.text_column)[r].as_py(),
                                add_special_tokens=spec.add_special_tokens).ids
        if table.column(spec.output_column)[r].as_py() != want:
            bad.append(f"output row {r}")
    return len(rows), bad


def run(args: argparse.Namespace) -> int:
    try:
        spec = spec_of(args)
        groups = _check_inputs(list(args.inputs))
        _check_output(args.output, args.ray_data)
        if not args.ray_data:
            given = [f"--{o.replace('_', '-')}" for o in RAY_ONLY if getattr(args, o) is not None]
            if given:
                raise UsageError(f"{', '.join(given)} size the Ray Data pool: use them with --ray-data")
        else:
            given = [f"--{o.replace('_', '-')}" for o in LOCAL_ONLY if getattr(args, o) is not None]
            if given:
                raise UsageError(f"{', '.join(given)} bound delta-ray's own reader: not with --ray-data "
                                 "(Ray Data reads the inputs with its own readers)")
        if args.concurrency is not None and args.concurrency < 1:
            raise UsageError("--concurrency must be >= 1")
        if (args.batch_size is not None and args.batch_size < 1) or (args.num_cpus is not None and args.num_cpus <= 0):
            raise UsageError("--batch-size must be >= 1 and --num-cpus > 0")
        if args.ray_data and args.verify and spec.drop_text:
            raise UsageError("--verify with --ray-data checks rows by their text: not with --drop-text")
        try:
            loaded = load_tokenizer(args.tokenizer)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--tokenizer: {exc}") from exc
        if not args.ray_data:
            for p in args.inputs:
                try:
                    batch_files.check_text_column(p, spec)
                except (ValueError, TypeError) as exc:
                    raise UsageError(str(exc)) from exc
    except UsageError as exc:
        print(f"delta-ray tokenize: {exc}", file=sys.stderr)
        return 2
    if not args.ray_data:
        return _run_local(args, loaded, spec)
    return _run_ray_data(args, loaded, spec, groups)


def _run_ray_data(args: argparse.Namespace, loaded, spec, groups: dict[str, list[str]]) -> int:
    """The same specification on Ray Data (a cluster)."""
    # A stalled pipeline must not start a new cluster after we shut ours down (read at Ray import).
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    import ray

    started = False
    if not ray.is_initialized():
        from delta_ray.actors.local_ray import local_init_kwargs  # lazy: the Ray glue

        ray.init(**local_init_kwargs())
        started = True
    try:
        from delta_ray.actors.data import tokenize_dataset  # lazy: the Ray glue

        t0 = time.perf_counter()
        ds = _read(groups, spec.text_column)
        pool = {k: getattr(args, k) for k in RAY_ONLY if getattr(args, k) is not None}
        try:
            ds = tokenize_dataset(ds, loaded, spec, **pool)
        except (ValueError, TypeError) as exc:
            print(f"delta-ray tokenize: {exc}", file=sys.stderr)
            return 2
        ds.write_parquet(args.output)
        elapsed = time.perf_counter() - t0
        rows, tokens = _written_totals(args.output, spec.count_column, spec.output_column)
        print(f"tokenized {rows:,} documents into {tokens:,} tokens in {elapsed:.1f} s: "
              f"{tokens / max(elapsed, 1e-9):,.0f} tokens/s -> {args.output}")
        if args.verify:
            checked, bad = _verify_output(args.output, loaded.tokenizer, spec, args.verify)
            if bad:
                print(f"verify: {len(bad)} of {checked} rows differ from the reference: {bad[:5]}", file=sys.stderr)
                return 1
            print(f"verify: {checked} random rows equal the reference")
        return 0
    except Exception as exc:  # a failure while the pipeline ran (e.g. null texts): say what, no traceback wall
        print(f"delta-ray tokenize: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if started:
            ray.shutdown()
