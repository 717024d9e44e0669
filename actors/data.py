"""Ray Data batch pipeline: ``tokenize_dataset`` adds the reference tokenizer's IDs to a dataset.

Every row gets exactly ``Tokenizer.from_file(p).encode(text, add_special_tokens=...).ids`` as a
``list<int32>`` column (plus an ``int32`` count column). The work runs on an actor pool
(``map_batches`` with a callable class, ``batch_format="pyarrow"``): each actor builds one
:class:`~delta_ray._tokenizer_core.TokenizerCore` from the tokenizer configuration *bytes* (checked by
SHA-256, so no worker needs the driver's file system) and encodes the blocks it is given with
:func:`delta_ray._core.text_columns.encode_table` (the batch specification every batch path shares): long
documents cut at safe cuts, the pieces of a slice of at most ``batch_bytes`` of text in one
GIL-releasing batch encode spread over the node's cores, the output column built from the engine's
values buffer plus offsets, without a Python object per token.

How it drives Ray Data (measured against the ``map_batches`` + fastokens pipeline users write; see
bench/bench_data.py): by default the work runs as Ray Data *tasks* reserving what a read task
reserves, so Ray Data fuses ``tokenize -> write``, and the read before them where it does not split
the read's output, into one task per block: no object-store round trip of the texts or the IDs
between stages, no actor pool to start, and a tokenizer built
only in the worker processes that actually get a block (once per process, in the process's bounded
cache :mod:`.tokenizer_cache`), not in every actor of a pool while one of them does the work.
Building a tokenizer costs seconds of CPU (the fast engine and the reference both parse the
configuration), so on a small node this is the difference; hence also: the workers build the
reference lazily (only a guarded text, a fallback or the shadow check's background thread needs
it, and once this machine's admission is cached the fast tier needs nothing else), and the driver
neither builds the reference nor loads the fast engine when that admission is cached. Ray Data's
own blocks are kept (no repartition: each block costs a task, an object-store put and a write).
Ray Data splits each read task's output when the files are fewer than the blocks it aims at (2 per
CPU, or up to 200 of at least 1 MiB), and a split read does not fuse: 24 JSONL files of 30 MB
become 120 blocks, each a task and a write of its own. So a dataset that is exactly a file read
with Ray Data's block count (e.g. ``read_json(dir)``) is tokenized as the same read with one task
per file, where Ray Data would split it and the files are at least as many as the CPUs
(:mod:`.data_reads`, the rule ``delta-ray tokenize --ray-data`` reads by); any other dataset is
taken as given. ``batch_size=`` bundles blocks into fewer tasks too, at the cost of a batch bounded
in rows rather than bytes; each call encodes its block on every core of its node in slices of ``batch_bytes`` (so one
block of a 100 MB file still uses the whole machine, and huge documents never hold more than a slice as Python strings).
``concurrency=`` asks for an actor pool instead (the earlier default), whose actors reserve a fraction of a CPU so that
reads and writes always have cores.
"""
from __future__ import annotations

import dataclasses
import io
import os
import pickle
from typing import Any, Iterator

import pyarrow as pa

from delta_ray._core import constants as C
from delta_ray._core.config import TokenizerConfig
from delta_ray._core.loading import LoadedTokenizer, load_tokenizer
from delta_ray._core.text_columns import BatchSpec, checked_text_column, encode_table
from delta_ray._engine.native import FastEngineUnavailable
from delta_ray._runtime.exit_guard import start_thread
from delta_ray._tokenizer_core import TokenizerCore
from delta_ray._verify.admit import cached_admission_exists
from delta_ray.batch.inputs import byte_slices
from delta_ray.tokenizer import DeltaTokenizer

from .data_reads import per_file_read
from .tokenizer_cache import build_tokenizer, cached, get_tokenizer

__all__ = ["tokenize_dataset", "TokenizeBatch", "TokenizerSource", "tokenize_batch_task"]


# what the actors add when a text is null: how to fix the dataset in Ray Data's own terms
def _null_hint(column: str) -> str:
    return ("; the reference tokenizer has no IDs for a missing text. Drop or fill them first, e.g. "
            f"ds.filter(expr=\"{column} IS NOT NULL\") or map_batches(...) replacing None with \"\"")


# Ray Data stores a column Arrow refuses (a str holding a lone surrogate: not valid UTF-8) as pickled
# Python objects of this extension type; the texts are then checked here, row by row.
PICKLED_OBJECTS = "ray.data.arrow_pickled_object"


def is_pickled_objects(t: pa.DataType) -> bool:
    """Whether an Arrow type is Ray Data's column of pickled Python objects."""
    return isinstance(t, pa.ExtensionType) and t.extension_name == PICKLED_OBJECTS


class _PlainValues(pickle.Unpickler):
    """Loads a str (any plain value), never a class or function: no code runs while we look."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"{module}.{name}")


def _unpickled(raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return _PlainValues(io.BytesIO(raw)).load()
    except Exception:  # noqa: BLE001 - an object that needs a class: not a text, whatever it is
        return NotImplemented


def text_strings(batch: pa.Table, column: str) -> pa.Table:
    """``batch`` with its text column as Arrow strings when Ray Data stored it as pickled Python
    objects (it does when a value is not valid Unicode, e.g. a lone surrogate): a ValueError
    names the column and the row of the batch holding text the reference refuses (or a null), a
    TypeError one holding something else than a str; valid texts are encoded as any others."""
    idx = batch.schema.get_field_index(column)
    if idx < 0 or not is_pickled_objects(batch.schema.field(idx).type):
        return batch
    texts: list[str] = []
    for chunk in batch.column(idx).chunks:
        for raw in chunk.storage.to_pylist():
            row, value = len(texts), _unpickled(raw)
            if value is None:
                raise ValueError(f"column {column!r} has a null text (row {row} of its batch)"
                                 f"{_null_hint(column)}")
            if not isinstance(value, str):
                raise TypeError(f"text column {column!r} must hold strings; row {row} of its batch holds "
                                "another Python object")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"text column {column!r}, row {row} of its batch: not valid Unicode (a lone surrogate "
                    f"U+{ord(value[exc.start]):04X} at character {exc.start}), which the reference tokenizer "
                    "refuses; drop or repair such rows first, e.g. text.encode('utf-8', 'replace')"
                    ".decode('utf-8')") from None
            texts.append(value)
    return batch.set_column(idx, column, pa.array(texts, pa.large_string()))


class TokenizeBatch:
    """The actor-side callable: one TokenizerCore per actor, one threaded batch encode per slice."""

    def __init__(self, config_bytes: bytes, digest: str, config: TokenizerConfig, spec: BatchSpec,
                 fallback: bool = False, *, core: TokenizerCore | None = None):
        """``fallback``: the driver chose ``"fast"`` for ``"auto"``; a node where the fast tier is
        unavailable then encodes with the reference instead of failing. ``core``: a tokenizer
        already built for these bytes and options (the task form's process cache)."""
        # The reference is built lazily (on a guarded text, a fallback or a shadow sample): a
        # worker whose fast tier is admitted (cached) skips about a CPU-second of start-up.
        self.tokenizer = core if core is not None else build_tokenizer(
            config_bytes, digest, config, lazy=True, fallback=fallback)
        self.spec = spec
        # Resolved here, in the actor: the CPUs of the node it runs on, not the driver's.
        self.encode_threads = spec.threads or min(spec.encode_threads(), _ACTOR_THREADS_CAP)

    def __call__(self, batch: pa.Table) -> pa.Table | Iterator[pa.Table]:
        """The batch with its IDs; a batch over ``batch_bytes`` of text is encoded in slices of at
        most that much, yielded one by one (Ray Data takes a generator), so the Python strings
        and engine buffers held at once stay bounded whatever the rows' sizes."""
        spec = self.spec
        batch = text_strings(batch, spec.text_column)
        col = checked_text_column(batch, spec.text_column, null_hint=_null_hint(spec.text_column))
        if col.nbytes <= spec.batch_bytes:
            return self._encode(batch)
        return (self._encode(batch.slice(a, b - a)) for a, b in byte_slices(col, spec.batch_bytes))

    def _encode(self, batch: pa.Table) -> pa.Table:
        return encode_table(self.tokenizer, batch, self.spec, threads=self.encode_threads,
                            null_hint=_null_hint(self.spec.text_column))[0]


class TokenizerSource:
    """What a task needs to get its tokenizer: the configuration bytes (SHA-256 checked), the options,
    whether to fall back to the reference. Sent to the workers inside the operator Ray Data puts.

    Unpickling it in a worker process (which Ray does when a task starts, *before* the fused read
    of the block) starts building the process's tokenizer in a background thread unless the
    process's cache already holds it: the 2-3 CPU-seconds of the fast engine's load then overlap
    the block's read (seconds for JSON) instead of following it. The task's own call takes the
    same cache entry (waiting for that build), so the tokenizer is still built once per process,
    and a build that failed in the background is simply redone, raising, on the task's thread."""

    def __init__(self, config_bytes: bytes, digest: str, config: TokenizerConfig, fallback: bool = False):
        self.config_bytes, self.digest, self.config, self.fallback = config_bytes, digest, config, fallback

    def core(self) -> TokenizerCore:
        """The process's tokenizer for this source (built lazily: see :mod:`.tokenizer_cache`)."""
        return get_tokenizer(self.config_bytes, self.digest, self.config, lazy=True, fallback=self.fallback)

    def __getstate__(self) -> dict:
        return dict(self.__dict__)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if not cached(self.digest, self.config, self.fallback):
            start_thread(self._prefetch, "delta-ray-tokenizer-prefetch")

    def _prefetch(self) -> None:
        try:
            self.core()
        except Exception:  # noqa: BLE001 - the task's own call builds again and raises
            pass


def tokenize_batch_task(batch: pa.Table, source: TokenizerSource, spec: BatchSpec) -> pa.Table | Iterator[pa.Table]:
    """The task form of :class:`TokenizeBatch` (what ``tokenize_dataset`` runs by default): the same
    call, with the tokenizer from the process's cache (:mod:`.tokenizer_cache`, shared with the
    pool's tasks and bounded), built lazily on this process's first block (started early by
    :class:`TokenizerSource`) and kept for the next ones (Ray reuses a job's worker processes)."""
    core = source.core()
    return TokenizeBatch(source.config_bytes, source.digest, source.config, spec, source.fallback, core=core)(batch)


def _as_loaded(tokenizer: Any, engine: str = "reference") -> LoadedTokenizer:
    """The configuration the workers get. A path whose fast tier has a cached, passing admission
    on this machine is only read and hashed, not built (1-1.5 s of the driver's time before any
    block is read): that admission ran the reference on exactly these bytes, and every worker
    builds what it needs itself. Otherwise the reference is built here, so a file it refuses fails
    now, with the path in the message."""
    if isinstance(tokenizer, (str, os.PathLike)) and engine != "reference":
        lazy = load_tokenizer(tokenizer, lazy=True)
        if cached_admission_exists(lazy.config_bytes):
            return lazy
    if isinstance(tokenizer, DeltaTokenizer):
        tokenizer = tokenizer.core
    if isinstance(tokenizer, TokenizerCore):
        return tokenizer.loaded
    return load_tokenizer(tokenizer)


def _resolve_engine(tokenizer: Any, loaded: LoadedTokenizer, spec: BatchSpec) -> BatchSpec:
    """``engine="auto"`` decided once, in the driver, before any actor starts: an actor left to
    decide alone would encode with the reference while admitting the fast tier in the background
    (50-100x slower for the first seconds or minutes of every actor). The admission is blocking
    here and cached on disk, so later runs and the actors on this node find it at once; actors on
    other nodes admit it themselves ("fast": one process per node probes, under its lock)."""
    if spec.engine != "auto":
        return spec
    if isinstance(tokenizer, DeltaTokenizer):
        tokenizer = tokenizer.core
    if isinstance(tokenizer, TokenizerCore) and tokenizer.uses_fast_engine:
        return dataclasses.replace(spec, engine="fast")
    if cached_admission_exists(loaded.config_bytes):
        # Passing and cached: no need to load the engine here too (2-3 s); workers load their own.
        return dataclasses.replace(spec, engine="fast")
    try:
        TokenizerCore(loaded, TokenizerConfig(engine="fast", reuse="none"))
    except FastEngineUnavailable:
        return dataclasses.replace(spec, engine="reference")
    return dataclasses.replace(spec, engine="fast")


def _check_schema(dataset, spec: BatchSpec) -> None:
    # Only a schema Ray Data already holds (from_* sources, Parquet footers): fetching one runs
    # upstream work, e.g. a JSON read of a whole file plus a worker start (4.8 s of a 20 s
    # jsonl24 run in bench_data); the workers check every batch anyway.
    schema = dataset.schema(fetch_if_missing=False)
    if schema is None:
        return
    names = list(schema.names)
    types = list(schema.types)
    if spec.text_column in names and (not isinstance(types[names.index(spec.text_column)], pa.DataType)
                                      or is_pickled_objects(types[names.index(spec.text_column)])):
        return  # e.g. a pandas object column, Ray's pickled objects: checked per batch by the workers
    arrow = pa.schema([(n, t if isinstance(t, pa.DataType) else pa.null()) for n, t in zip(names, types)])
    spec.check_schema(arrow, where="dataset")


_ACTOR_THREADS_CAP = 8  # an actor's encode threads when not given: its node's CPUs, at most this many


def tokenize_dataset(dataset, tokenizer, spec: BatchSpec | None = None, *, batch_size: int | None = None,
                     concurrency: int | tuple[int, int] | None = None, num_cpus: float | None = None,
                     chunk_size: int = C.CHUNK_SIZE, cut_threshold: int = C.CUT_THRESHOLD,
                     **columns: Any):
    """Return ``dataset`` with the reference token IDs of its text column added (lazily, like Ray Data).

    Args:
        dataset: a ``ray.data.Dataset`` with a string column (``text_column``, default ``"text"``).
        tokenizer: a path to tokenizer.json, a directory holding one, a ``tokenizers.Tokenizer``, a
            :class:`~delta_ray._core.loading.LoadedTokenizer` or a :class:`~delta_ray.DeltaTokenizer`. Its
            configuration bytes (not a path) travel to the workers, which check their SHA-256.
        spec: the batch specification (:class:`~delta_ray._core.text_columns.BatchSpec`), the same one
            ``delta-ray tokenize`` uses; its fields may also be given as keywords (they replace the
            spec's): ``text_column``, ``output_column`` (the ``list<int32>`` IDs, replaced if it
            exists), ``count_column`` (``int32`` IDs per row; None for none), ``add_special_tokens``
            (as in the reference ``encode``), ``drop_text``, ``batch_bytes`` (the most text a
            worker encodes at once: a larger block is encoded and yielded in slices, so huge
            documents stay bounded in memory), ``engine`` (``"auto"``, ``"fast"``,
            ``"reference"``; ``"auto"`` is decided here, once: see :func:`_resolve_engine`) and
            ``threads`` (a worker's encode threads; default its node's CPUs, at most 8).
        batch_size: rows per call; default None: whole blocks as Ray Data makes them (each
            block costs Ray Data a task, an object-store put and a write, tens of milliseconds on a
            small machine: measured, smaller blocks were slower). Blocks are never repartitioned:
            a worker spreads each slice over its node's cores, so one block of a big file still
            uses the whole node.
        concurrency: None (default): Ray Data tasks, fused with the write after them and with the
            read before them where Ray Data does not split the read (one task per block reads,
            tokenizes and writes it; a bare file read that Ray Data would split, of at least as many
            files as CPUs, is read one task per file to keep it fused), the tokenizer
            built once per worker process that gets a block and kept there for later blocks and datasets (at most
            two configurations per process, :mod:`.tokenizer_cache`). An int, or ``(min, max)`` for an autoscaling pool:
            an actor pool of that many actors instead (each builds its tokenizer when it starts and
            frees it when the dataset is done; blocks then travel through the object store).
        num_cpus: CPUs reserved per task or actor. Default: Ray Data's default for tasks (1, the
            same as its reads and writes, which is what lets Ray Data fuse them), 0.5 for actors.
            Keep an actor's fractional: actors holding every CPU leave none for the read and write
            tasks and the pipeline stalls.
        chunk_size, cut_threshold: a text from ``cut_threshold`` characters is cut at safe cuts into
            chunks of about ``chunk_size`` characters, so one huge document spreads over threads.

    Row order: as Ray Data's execution gives it. Rows within a block keep their order; blocks leave
    as they finish, unless the dataset was created with ``DataContext.get_current()
    .execution_options.preserve_order = True``, which gives exactly the input's order. Every input
    column is kept (except the text with ``drop_text``): join the output on an id column of the
    input (``delta-ray tokenize --ray-data`` keeps order and columns the same way).

    Validation happens before anything runs when Ray Data already knows the schema without
    executing anything (``from_*`` sources, Parquet reads, and stages that keep a known schema): a
    missing text column raises ``ValueError``, a non-string one ``TypeError``. A schema Ray Data
    would have to run work to learn (a JSON or CSV read, after a UDF stage) is not fetched; the
    workers then raise the same errors on the first batch. Null texts are only seen while the dataset executes: the
    first batch holding one fails with a ``ValueError`` naming the column, which the consuming call (``materialize``,
    ``write_parquet``, ...) raises wrapped as Ray Data does for any UDF error
    (``ray.exceptions.UserCodeException``, or the ``ValueError`` itself with
    ``DataContext.raise_original_map_exception``). Filter or fill nulls first. A text that is not
    valid Unicode (a str holding a lone surrogate: the reference refuses it), which Ray Data stores
    in a column of pickled Python objects, fails the same way, with a ``ValueError`` naming the
    column and the row of its batch; such a column holding only valid texts is encoded as any.
    """
    import ray.data

    if spec is not None and not isinstance(spec, BatchSpec):
        raise TypeError(f"spec must be a BatchSpec, got {type(spec).__name__}")
    unknown = sorted(set(columns) - {f.name for f in dataclasses.fields(BatchSpec)})
    if unknown:
        raise TypeError(f"tokenize_dataset() got unexpected keyword arguments {unknown}")
    spec = dataclasses.replace(spec or BatchSpec(), **columns)
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    if num_cpus is not None and (not isinstance(num_cpus, (int, float)) or isinstance(num_cpus, bool)
                                 or num_cpus <= 0):
        raise ValueError(f"num_cpus must be > 0 or None, got {num_cpus!r}")
    if isinstance(concurrency, tuple):
        if len(concurrency) != 2 or not all(isinstance(c, int) and c >= 1 for c in concurrency) \
                or concurrency[0] > concurrency[1]:
            raise ValueError(f"concurrency must be an int >= 1 or a (min, max) pair, got {concurrency!r}")
    elif concurrency is not None and (not isinstance(concurrency, int) or isinstance(concurrency, bool)
                                      or concurrency < 1):
        raise ValueError(f"concurrency must be an int >= 1 or a (min, max) pair, got {concurrency!r}")
    loaded = _as_loaded(tokenizer, spec.engine)
    _check_schema(dataset, spec)
    fallback = spec.engine == "auto"
    spec = _resolve_engine(tokenizer, loaded, spec)
    # Validated once here, then sent as it is to every worker.
    config = TokenizerConfig(chunk_size=chunk_size, cut_threshold=cut_threshold, threads=spec.threads,
                             reuse="none", engine=spec.engine)
    args = (loaded.config_bytes, loaded.digest, config, spec, fallback)

    if concurrency is None:
        # Tasks with the read's resources: Ray Data fuses read -> tokenize -> write into one task
        # per block (num_cpus left unset unless given: an explicit value unlike the read's stops
        # the fusion). The configuration bytes travel once, in the operator Ray Data puts.
        extra = {} if num_cpus is None else {"num_cpus": num_cpus}
        source = TokenizerSource(loaded.config_bytes, loaded.digest, config, fallback)
        return per_file_read(dataset).map_batches(tokenize_batch_task, fn_args=(source, spec),
                                                  batch_size=batch_size, batch_format="pyarrow",
                                                  zero_copy_batch=True, **extra)
    if isinstance(concurrency, tuple):
        compute = ray.data.ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1])
    else:
        compute = ray.data.ActorPoolStrategy(size=concurrency)
    return dataset.map_batches(
        TokenizeBatch,
        fn_constructor_args=args,
        batch_size=batch_size,
        batch_format="pyarrow",
        zero_copy_batch=True,
        compute=compute,
        num_cpus=0.5 if num_cpus is None else num_cpus,
    )
