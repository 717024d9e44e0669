"""One read task per file: the read rule ``delta-ray tokenize --ray-data`` and ``tokenize_dataset`` share.

Left alone, Ray Data aims a read at 200 blocks of at least 1 MiB (or 2 per CPU) and, with fewer
files than that, splits each read task's output to get there (with more, it groups files into
tasks and splits nothing). A split read cannot fuse with the tasks after it (Ray's fusion rule
refuses an upstream with a split factor), so each small block then costs a task, an object-store
round trip and a write of its own, slower than one fused read-tokenize-write task per file. With
fewer files than CPUs the split is what spreads the work, so it is kept then. Ray Data
still splits a file too big for one block (``target_max_block_size``), so memory stays bounded
either way.

``delta-ray tokenize --ray-data`` and ``tokenize_dataset`` both take their reads through
:func:`per_file_read`. ``tokenize_dataset`` gets a dataset its caller built; where that dataset is
exactly a file read whose block count Ray Data would choose (``ray.data.read_json(dir)``,
``read_text(dir)``, ... with no ``override_num_blocks``; Ray 2.60's ``read_parquet`` plans a
``ListFiles -> ReadFiles`` pair that does not split, left as it is), it tokenizes
:func:`per_file_read` of it instead: the same datasource, so the same rows in the same order, read
one task per file. Anything else (a read with its block count set, stages after the read, another
source, a Ray Data whose internals differ) is left exactly as given.
"""
from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["read_blocks", "per_file_read"]


def read_blocks(n_files: int, cluster_cpus: float, ray_blocks: int) -> int | None:
    """``override_num_blocks`` for a Ray Data read of ``n_files`` files that Ray Data would read as
    ``ray_blocks`` blocks: one read task per file where Ray Data would split the files' output
    (fewer files than its blocks) and there are at least as many files as CPUs; else None (Ray
    Data's choice: with more files than its blocks it groups files into tasks and splits nothing,
    which fuses as it is; 10,000 small files are not 10,000 tasks)."""
    return n_files if max(1, int(cluster_cpus)) <= n_files < ray_blocks else None


def _ray_blocks(datasource: Any) -> int:
    """The blocks Ray Data's read rule aims a default read of ``datasource`` at, by its own formula
    (2 per CPU, at least ``read_op_min_num_blocks`` of ``target_min_block_size``, ...) and the
    process-wide context the rule reads at execution."""
    from ray.data._internal.util import _autodetect_parallelism
    from ray.data.context import DataContext

    ctx = DataContext.get_current()
    return _autodetect_parallelism(-1, ctx.target_max_block_size, ctx, datasource)[0]


def _file_count(datasource: Any) -> int | None:
    """The files a file-based datasource reads (after its extension filter), or None."""
    paths = getattr(datasource, "_pq_paths", None)  # third-party seam: ParquetDatasource's fragments' paths
    if isinstance(paths, list):
        return len(paths)
    from ray.data.datasource.file_based_datasource import FileBasedDatasource
    if isinstance(datasource, FileBasedDatasource):
        return len(datasource._paths())  # third-party seam: the file list Ray Data reads
    return None


def per_file_read(dataset: Any) -> Any:
    """``dataset`` read with one task per file where :func:`read_blocks` says so (Ray Data would
    split the files' output) and ``dataset`` is a bare file read with Ray Data's block count;
    otherwise ``dataset`` itself (never an error: on a Ray Data whose private plan differs the read
    is simply Ray Data's)."""
    try:
        import ray
        from ray.data import Dataset
        from ray.data._internal.logical.interfaces import LogicalPlan
        from ray.data._internal.logical.operators import Read
        from ray.data._internal.stats import DatasetStats

        read = dataset._logical_plan.dag  # third-party seam: Ray Data's plan (checked below, else left alone)
        if (type(read) is not Read or read.parallelism != -1
                or read.datasource is not read.datasource_or_legacy_reader):  # a legacy Reader: left alone
            return dataset
        n_files = _file_count(read.datasource)
        if not n_files or read_blocks(n_files, ray.cluster_resources().get("CPU", 1),
                                      _ray_blocks(read.datasource)) is None:
            return dataset
        # The caller's Read is not touched (Ray's optimizer writes its detected parallelism into it).
        ours = dataclasses.replace(read, parallelism=n_files, num_outputs=n_files, detected_parallelism=None)
        context = dataset.context.copy()  # as read_datasource: each dataset its own context
        return Dataset(LogicalPlan(ours, context), context, DatasetStats(metadata={"Read": []}, parent=None))
    except Exception:  # a private seam: any mismatch leaves Ray Data's own read
        return dataset
