"""``delta-ray tokenize``: text / JSONL / Parquet files to Parquet with the reference token IDs.

    delta-ray tokenize --tokenizer PATH INPUT... --output DIR [--text-column text]
                       [--concurrency N] [--no-special-tokens]

Inputs by extension: ``.txt`` is one document per line (empty lines skipped; Ray Data's
``read_text``), ``.jsonl``/``.json`` newline-delimited JSON objects (``read_json``), ``.parquet``
(``read_parquet``); ``.txt``/``.jsonl``/``.json`` may end in ``.gz``, ``.bz2`` or ``.zst``. The
output keeps the input columns (``--drop-text`` omits the text) and adds the ``list<int32>`` IDs and
an ``int32`` count column; ``--output`` is a new or empty local directory (on a multi-node cluster,
one every node can write: a shared file system) or a URI Ray Data can write to. Blocks are split to
``--batch-size`` rows so every actor of the pool gets work. A local Ray is started when none is
running and shut down afterwards; a Ray the caller already runs is left alone. Usage errors exit
with status 2, a failure while the pipeline runs (e.g. a null text) with status 1.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

_KINDS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_COMPRESSED = (".gz", ".bz2", ".zst")


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
                        help="tokenizer actors (default: the cluster's CPU count)")
    parser.add_argument("--num-cpus", type=float, default=0.5, help="CPUs reserved per actor (default: 0.5)")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="rows per block and per actor call (default: 256)")
    parser.add_argument("--no-special-tokens", action="store_true",
                        help="encode with add_special_tokens=False (no BOS/template tokens)")
    parser.add_argument("--drop-text", action="store_true", help="do not copy the text column to the output")


def _kind(path: str) -> str:
    name, compressed = path.lower(), False
    for comp in _COMPRESSED:
        if name.endswith(comp):
            name, compressed = name[: -len(comp)], True
            break
    kind = _KINDS.get(os.path.splitext(name)[1])
    if kind is None or (compressed and kind == "parquet"):
        raise UsageError(f"{path}: unknown input type (expected .txt, .jsonl, .json or .parquet; "
                         f"text and JSON may be compressed with {', '.join(_COMPRESSED)})")
    return kind


def _check_inputs(paths: list[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for p in paths:
        if not os.path.exists(p):
            raise UsageError(f"{p}: no such input file")
        if os.path.isdir(p):
            raise UsageError(f"{p}: is a directory; pass the files (e.g. {p}/*.parquet)")
        groups.setdefault(_kind(p), []).append(os.path.abspath(p))
    return groups


def _check_output(out: str) -> None:
    if "://" in out:  # a URI (s3://, gs://, ...): Ray Data's writer checks it
        return
    p = Path(out)
    if p.exists() and (not p.is_dir() or any(p.iterdir())):
        raise UsageError(f"{out}: output must be a new or empty directory")


def _read(groups: dict[str, list[str]], text_column: str):
    import ray.data

    parts = []
    for kind, paths in groups.items():
        if kind == "text":
            ds = ray.data.read_text(paths)
            if text_column != "text":
                ds = ds.rename_columns({"text": text_column})
        elif kind == "json":
            ds = ray.data.read_json(paths)
        else:
            ds = ray.data.read_parquet(paths)
        parts.append(ds)
    return parts[0] if len(parts) == 1 else parts[0].union(*parts[1:])


def _written_totals(out: str, count_column: str) -> tuple[int, int]:
    import pyarrow.compute as pc
    import pyarrow.dataset as pds

    table = pds.dataset(out, format="parquet").to_table(columns=[count_column])
    total = pc.sum(table.column(count_column)).as_py() or 0
    return table.num_rows, int(total)


def run(args: argparse.Namespace) -> int:
    try:
        groups = _check_inputs(list(args.inputs))
        _check_output(args.output)
        if args.concurrency is not None and args.concurrency < 1:
            raise UsageError("--concurrency must be >= 1")
        if args.batch_size < 1 or args.num_cpus <= 0:
            raise UsageError("--batch-size must be >= 1 and --num-cpus > 0")
        from delta_ray.loading import load_tokenizer
        try:
            loaded = load_tokenizer(args.tokenizer)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--tokenizer: {exc}") from exc
    except UsageError as exc:
        print(f"delta-ray tokenize: {exc}", file=sys.stderr)
        return 2

    # A stalled pipeline must not start a new cluster after we shut ours down (read at Ray import).
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    import ray

    started = False
    if not ray.is_initialized():
        from actors.local_ray import local_init_kwargs

        ray.init(**local_init_kwargs())
        started = True
    try:
        from actors.data import tokenize_dataset

        t0 = time.perf_counter()
        ds = _read(groups, args.text_column)
        # Reads often come in a few large blocks and an actor call takes whole blocks: split them
        # (streaming, no shuffle) so that every actor of the pool gets work and long documents spread.
        ds = ds.repartition(target_num_rows_per_block=args.batch_size)
        try:
            ds = tokenize_dataset(ds, loaded, text_column=args.text_column, output_column=args.output_column,
                                  count_column=args.count_column,
                                  add_special_tokens=not args.no_special_tokens,
                                  batch_size=args.batch_size, concurrency=args.concurrency,
                                  num_cpus=args.num_cpus)
        except (ValueError, TypeError) as exc:
            print(f"delta-ray tokenize: {exc}", file=sys.stderr)
            return 2
        if args.drop_text:
            ds = ds.drop_columns([args.text_column])
        ds.write_parquet(args.output)
        elapsed = time.perf_counter() - t0
        rows, tokens = _written_totals(args.output, args.count_column)
        print(f"tokenized {rows:,} documents into {tokens:,} tokens in {elapsed:.1f} s: "
              f"{tokens / max(elapsed, 1e-9):,.0f} tokens/s -> {args.output}")
        return 0
    except Exception as exc:  # a failure while the pipeline ran (e.g. null texts): say what, no traceback wall
        print(f"delta-ray tokenize: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if started:
            ray.shutdown()
