"""Assembling IDs: pieces in input order into numpy and Arrow int32 buffers (the template: template.py)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

EMPTY = np.zeros(0, dtype=np.int32)
_I32 = np.dtype(np.int32)
_PA_INT32 = pa.int32()
_STRIDES = (4,)  # a 1-D contiguous int32 array
# Where a request's path copies IDs with pyarrow (a compact turn's join, a keyless prompt's answer):
# the C allocator, not pyarrow's default pool. On Linux that pool is mimalloc, whose arena is advised
# for transparent huge pages (smaps flag "hg"), and an occasional compact turn faulted in a fresh 2 MB
# page inside its join: kernel time that set the turn's tail latency.
COPY_POOL = pa.system_memory_pool()


def concat_ids(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Concatenate int32 ID arrays (no copy for a single part)."""
    if not parts:
        return EMPTY
    if len(parts) == 1:
        return np.asarray(parts[0], dtype=np.int32)
    return np.concatenate(parts).astype(np.int32, copy=False)


def ids_to_numpy(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An int32 Arrow answer as one numpy array: a zero-copy view of a null-free ``Int32Array``,
    one concatenation of its chunks' views for a ``ChunkedArray``.

    Not ``to_numpy(zero_copy_only=False)``: pyarrow imports pandas on its first such call (seconds,
    on the first request of a server or the first encode of a drop-in tokenizer)."""
    if isinstance(ids, pa.ChunkedArray):
        chunks = [ids_to_numpy(c) for c in ids.chunks]
        return concat_ids(chunks)
    if ids.null_count or ids.type != pa.int32():
        raise TypeError(f"expected null-free int32 IDs, got {ids.type} with {ids.null_count} nulls")
    return np.frombuffer(ids.buffers()[1], dtype=np.int32, count=len(ids), offset=ids.offset * 4)


def decode_ids(ids: Any) -> list[int]:
    """Token IDs to decode (a list, numpy or Arrow) as the reference's list of ints, or a clear
    error: TypeError for anything but integers, ValueError for an ID outside [0, 2**32) (the
    reference's own errors name neither the value nor its position)."""
    if isinstance(ids, (pa.Array, pa.ChunkedArray)):
        ids = ids_to_numpy(ids)
    elif isinstance(ids, (str, bytes)):
        raise TypeError(f"token IDs must be a sequence of integers, not {type(ids).__name__}")
    try:
        arr = np.asarray(ids)
    except ValueError:
        raise TypeError("token IDs must be a flat sequence of integers") from None
    if arr.dtype.kind not in "iub":
        items = list(ids) if isinstance(ids, (list, tuple)) else list(arr.ravel())
        for i, x in enumerate(items):
            if not isinstance(x, (int, np.integer)):
                raise TypeError(f"token IDs must be integers: position {i} holds a {type(x).__name__}")
        arr = np.array([int(x) for x in items], dtype=object)
    flat = arr.ravel()
    if flat.size and (flat.min() < 0 or flat.max() >= 1 << 32):
        i = int(np.flatnonzero((flat < 0) | (flat >= 1 << 32))[0])
        raise ValueError(f"token IDs must be in [0, 2**32): position {i} holds {flat[i]}")
    out: list[int] = flat.tolist()
    return out


def flat_list_array(values: np.ndarray, offsets: np.ndarray) -> pa.ListArray:
    """A ``list<int32>`` array straight from a flat batch's buffers (zero-copy values)."""
    if len(offsets) and offsets[-1] > np.iinfo(np.int32).max:
        raise OverflowError(f"{int(offsets[-1])} IDs exceed list<int32> offsets; use smaller batches")
    return pa.ListArray.from_arrays(to_arrow(offsets.astype(np.int32)), to_arrow(values))


def to_arrow(ids: np.ndarray) -> pa.Int32Array:
    """Wrap an int32 buffer as a pyarrow array (zero-copy).

    ``pa.Array.from_buffers`` rather than ``pa.array``: the latter imports pandas on its first call
    (a long stall on the first request of every process).
    """
    if type(ids) is np.ndarray and ids.strides == _STRIDES and ids.dtype == _I32:
        # Every ID part of a session (the engine's buffer, its slices, a join) is already a 1-D
        # contiguous native int32 array: wrap it as it is (numpy's conversion is one more native
        # region a turn touches after an idle). Anything else is converted below.
        return pa.Array.from_buffers(_PA_INT32, len(ids), [None, pa.py_buffer(ids)])
    buf = np.ascontiguousarray(ids, dtype=np.int32)
    return pa.Array.from_buffers(_PA_INT32, len(buf), [None, pa.py_buffer(buf)])


def one_chunk(ids: np.ndarray) -> pa.ChunkedArray:
    """One int32 buffer as a one-chunk ChunkedArray (zero-copy): a session answer's type for IDs
    made in one piece (an unadmitted configuration's reference encode)."""
    return pa.chunked_array([to_arrow(ids)], type=pa.int32())


def flat_from_pieces(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One int32 values buffer and int64 offsets from per-text arrays."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    if len(arrays):
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
    values = np.concatenate(arrays).astype(np.int32, copy=False) if len(arrays) else np.zeros(0, np.int32)
    return values, offsets
