"""The post-processor's template: the fixed IDs an admitted tokenizer adds around one sequence.

Admission proves that ``encode(x, add_special_tokens=True)`` is ``prefix + encode(x, False) +
suffix`` with the same ``prefix``/``suffix`` for every ``x`` (``Admission.prefix_ids`` /
``suffix_ids``: a BOS for llama3.2 and glm-4, nothing for qwen-3). Every place that post-processes
IDs (a stateless answer, a flat batch, a session's Arrow parts, a session answer that sends only
what changed) goes through one :class:`Template`, so this arithmetic exists once. An unadmitted
configuration has no template here: the reference post-processes its own whole encodes.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from .admission import Admission
from .assembly import to_arrow

_INT32 = pa.int32()


def _frozen(ids: Sequence[int]) -> np.ndarray:
    out = np.array(ids, dtype=np.int32).reshape(-1)
    out.flags.writeable = False  # shared by every answer that includes it
    return out


class Template:
    """``prefix`` and ``suffix`` IDs around one sequence, as numpy and Arrow arrays built once.

    :meth:`when` picks it or the empty template from a request's ``add_special_tokens``, so a call
    site never branches on the flag: ``template.when(add).apply(ids)``.
    """

    __slots__ = ("prefix", "suffix", "added", "_before", "_after")

    def __init__(self, prefix: Sequence[int] = (), suffix: Sequence[int] = ()):
        self.prefix = _frozen(prefix)
        self.suffix = _frozen(suffix)
        self.added = len(self.prefix) + len(self.suffix)  # IDs the template adds to a sequence
        self._before = (to_arrow(self.prefix),) if len(self.prefix) else ()
        self._after = (to_arrow(self.suffix),) if len(self.suffix) else ()

    @classmethod
    def of(cls, admission: Admission) -> "Template":
        """The template an :class:`~delta_ray._core.admission.Admission` proved (empty if unadmitted)."""
        return cls(admission.prefix_ids, admission.suffix_ids) if admission else NO_TEMPLATE

    def when(self, add_special_tokens: bool) -> "Template":
        """This template for ``add_special_tokens=True``, the empty one for ``False``."""
        return self if add_special_tokens else NO_TEMPLATE

    def __bool__(self) -> bool:
        return self.added > 0

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Template) and np.array_equal(self.prefix, other.prefix)
                and np.array_equal(self.suffix, other.suffix))

    def __hash__(self) -> int:
        return hash((self.prefix.tobytes(), self.suffix.tobytes()))

    def __repr__(self) -> str:
        return f"Template(prefix={self.prefix.tolist()}, suffix={self.suffix.tolist()})"

    # -- one sequence ------------------------------------------------------------------------------
    def apply(self, ids: np.ndarray) -> np.ndarray:
        """One sequence's raw IDs, post-processed (the same array when the template is empty)."""
        if not self.added:
            return ids
        return np.concatenate([self.prefix, ids, self.suffix])

    def count(self, n_raw: int) -> int:
        """How many IDs a sequence of ``n_raw`` raw IDs has once post-processed."""
        return n_raw + self.added

    def start(self, k: int) -> int:
        """Where a raw IDs position ``k`` of a sequence that kept its first ``k`` raw IDs begins in
        the post-processed IDs: ``k`` after the prefix, or 0 when nothing was kept (``k == 0``: the
        answer resends everything, the prefix included). The IDs before it are the previous
        answer's (prefix and kept IDs); the old suffix is always after it."""
        return k + len(self.prefix) if k else 0

    def tail(self, k: int, raw_tail: np.ndarray) -> np.ndarray:
        """The post-processed IDs from :meth:`start` on, given the raw IDs from ``k`` on (the same
        array when the template is empty)."""
        if not self.added:
            return raw_tail
        if k:
            return np.concatenate([raw_tail, self.suffix]) if len(self.suffix) else raw_tail
        return np.concatenate([self.prefix, raw_tail, self.suffix])

    # -- Arrow: a session's parts -----------------------------------------------------------------
    def chunks(self, parts: tuple[Any, ...]) -> tuple[Any, ...]:
        """A sequence's raw Arrow chunks with the template's chunks (built once) around them."""
        if not self.added:
            return parts
        return self._before + parts + self._after

    def chunked_arrays(self, chunks: tuple[Any, ...]) -> pa.ChunkedArray:
        """:meth:`chunked` for parts that are int32 Arrow arrays already, none empty (a pool's
        splice of a worker's answer): no per-part test."""
        return pa.chunked_array(self._before + chunks + self._after if self.added else chunks, type=_INT32)

    def chunked(self, id_parts: Sequence[Any]) -> pa.ChunkedArray:
        """A sequence's raw int32 parts (numpy, or int32 Arrow arrays already made) as one
        zero-copy ChunkedArray, post-processed."""
        return pa.chunked_array(self.chunks(tuple(p if isinstance(p, pa.Array) else to_arrow(p)
                                                  for p in id_parts if len(p))), type=_INT32)

    # -- a flat batch: one values buffer and int64 offsets ----------------------------------------
    def apply_flat(self, values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every row of a flat ``(values, offsets)`` batch post-processed, in one vectorized pass
        (the same buffers when the template is empty)."""
        if not self.added:
            return values, offsets
        n, p, s = len(offsets) - 1, len(self.prefix), len(self.suffix)
        new_offsets = offsets + np.arange(n + 1, dtype=np.int64) * self.added
        out = np.empty(len(values) + n * self.added, dtype=np.int32)
        # One byte per slot marks the template's slots; the rows' values fill the rest in order (a
        # boolean-mask assignment: one pass, no int64 index array as long as the batch).
        is_value = np.ones(len(out), dtype=bool)
        for i in range(p):
            is_value[new_offsets[:-1] + i] = False
        for i in range(s):
            is_value[new_offsets[1:] - s + i] = False
        out[is_value] = values
        del is_value
        for i, t in enumerate(self.prefix.tolist()):
            out[new_offsets[:-1] + i] = t
        for i, t in enumerate(self.suffix.tolist()):
            out[new_offsets[1:] - s + i] = t
        return out, new_offsets


NO_TEMPLATE = Template()  # add_special_tokens=False, or no post-processing to add
