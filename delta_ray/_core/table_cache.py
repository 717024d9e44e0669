"""Per-code-point tables derived from the installed reference, cached on disk by its version.

A table (the character classes, the NFC anchors, the verified fold sets) is keyed by its name, a
format version and the reference's version, so an upgrade of ``tokenizers`` re-derives every table;
it is read and written through the private cache (:mod:`delta_ray._runtime.cache_store`).
"""
from __future__ import annotations

import io
from typing import Callable

import numpy as np
from numpy.typing import DTypeLike

from .._runtime.cache_store import atomic_write, private_dir_fd, read_file
from .reference_version import reference_version


def cached_table(name: str, version: int, derive: Callable[[], np.ndarray], shape: tuple[int, ...],
                 dtype: DTypeLike) -> np.ndarray:
    """A per-code-point numpy table derived from the installed reference: the cached copy (right
    shape and dtype), or ``derive()`` stored atomically and returned."""
    name = f"{name}-v{version}-tokenizers-{reference_version()}.npy"
    with private_dir_fd() as dfd:
        raw = read_file(name, dir_fd=dfd) if dfd is not None else None
    if raw is not None:
        try:
            table: np.ndarray = np.load(io.BytesIO(raw), allow_pickle=False)
            if table.shape == shape and table.dtype == np.dtype(dtype):
                return table
        except Exception:  # noqa: BLE001 - a damaged file is derived again
            pass
    table = derive()
    buf = io.BytesIO()
    np.save(buf, table, allow_pickle=False)
    with private_dir_fd() as dfd:
        if dfd is not None:
            atomic_write(name, buf.getvalue(), dir_fd=dfd)
    return table


