"""On-disk cache of per-code-point tables derived from the installed reference.

Keyed by a table name, a format version and the ``tokenizers`` version, so an upgrade of the
reference re-derives every table. Writes are atomic (rename), so concurrent processes never read a
partial file.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import tokenizers


def cache_dir() -> Path:
    """$DELTA_RAY_CACHE, else $XDG_CACHE_HOME/delta_ray, else ~/.cache/delta_ray."""
    base = os.environ.get("DELTA_RAY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "delta_ray")
    return Path(base)


def cached_table(name: str, version: int, derive: Callable[[], np.ndarray], shape: tuple, dtype) -> np.ndarray:
    """The cached table, or derive it, store it atomically and return it."""
    path = cache_dir() / f"{name}-v{version}-tokenizers-{tokenizers.__version__}.npy"
    if path.exists():
        try:
            table = np.load(path)
            if table.shape == shape and table.dtype == np.dtype(dtype):
                return table
        except Exception:  # noqa: BLE001 - a damaged file is derived again
            pass
    table = derive()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
    np.save(tmp, table)
    os.replace(tmp, path)
    return table
