"""On-disk cache of per-code-point tables derived from the installed reference.

Keyed by a table name, a format version and the ``tokenizers`` version, so an upgrade of the
reference re-derives every table. Written through :mod:`delta_ray.cache_store` (private directory,
exclusive temporary file, rename), so concurrent processes never read a partial file.
"""
from __future__ import annotations

import io
from typing import Callable

import numpy as np
import tokenizers

from .cache_store import atomic_write, cache_root, private_dir, read_file

cache_dir = cache_root  # the one root (kept under its old name for callers)


def cached_table(name: str, version: int, derive: Callable[[], np.ndarray], shape: tuple, dtype) -> np.ndarray:
    """The cached table, or derive it, store it atomically and return it."""
    directory = private_dir()
    path = directory / f"{name}-v{version}-tokenizers-{tokenizers.__version__}.npy" if directory else None
    raw = read_file(path) if path is not None else None
    if raw is not None:
        try:
            table = np.load(io.BytesIO(raw), allow_pickle=False)
            if table.shape == shape and table.dtype == np.dtype(dtype):
                return table
        except Exception:  # noqa: BLE001 - a damaged file is derived again
            pass
    table = derive()
    if path is not None:
        buf = io.BytesIO()
        np.save(buf, table, allow_pickle=False)
        atomic_write(path, buf.getvalue())
    return table
