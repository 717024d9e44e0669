"""A conversation's IDs kept between turns, out of the cyclic garbage collector's sight.

A Python list is a container the collector traverses element by element on every full collection,
and it is never untracked: two dozen kept lists of 290K IDs made each full collection of a small
process take 47 ms instead of 4. A tuple of ints is untracked by the first collection it survives
(CPython untracks tuples that hold no container), so the IDs are kept as tuples of :data:`BLOCK`
IDs: the collector sees one short list of blocks per conversation (4.2 ms in the same process).

Every block but the last holds exactly :data:`BLOCK` IDs, so position ``k`` is in block
``k // BLOCK``: a turn that keeps the first ``k`` IDs rebuilds at most one block and appends its
tail, O(change + BLOCK); handing out the IDs is one copy of pointers into a fresh list (about what
``list.copy()`` costs), and a fork shares the blocks (tuples are immutable).
"""
from __future__ import annotations

import sys

__all__ = ["BLOCK", "KeptIds"]

BLOCK = 4096
_INT_BYTES = sys.getsizeof(1 << 20)  # a token ID above the small-int cache: its own int object
_TUPLE_BYTES = sys.getsizeof(())  # a tuple's header; its items are 8 bytes each
_SLOT_BYTES = sys.getsizeof([0]) - sys.getsizeof([])


class KeptIds:
    """IDs as immutable blocks, with whether all their ints are the process's shared table's
    (:mod:`delta_ray.core.id_lists`): if not, each ID's int object is counted too."""

    __slots__ = ("blocks", "n", "shared")

    def __init__(self, ids: list[int] = (), shared: bool = True):
        self.blocks: list[tuple[int, ...]] = []
        self.n = 0
        self.shared = shared
        self._append(ids)

    def _append(self, ids: list[int]) -> None:
        blocks, at = self.blocks, 0
        if blocks and len(blocks[-1]) < BLOCK:
            at = BLOCK - len(blocks[-1])
            blocks[-1] += tuple(ids[:at])
        for i in range(at, len(ids), BLOCK):
            blocks.append(tuple(ids[i:i + BLOCK]))
        self.n += len(ids)

    def replace_tail(self, k: int, ids: list[int], shared: bool) -> None:
        """Keep the first ``k`` IDs (``0 <= k <= n``), then ``ids``."""
        if not 0 <= k <= self.n:
            raise ValueError(f"cannot keep {k} of {self.n} IDs")
        whole, part = divmod(k, BLOCK)
        blocks = self.blocks
        if part:
            blocks[whole] = blocks[whole][:part]
            del blocks[whole + 1:]
        else:
            del blocks[whole:]
        self.n = k
        self.shared = self.shared and shared
        self._append(ids)

    def to_list(self, prefix: list[int], suffix: list[int]) -> list[int]:
        """``prefix``, the IDs, then ``suffix`` as a fresh list the caller owns."""
        out = prefix.copy()
        for block in self.blocks:
            out += block
        out += suffix
        return out

    def copy(self) -> KeptIds:
        """Another holder of the same IDs (the blocks are shared: they are immutable)."""
        other = KeptIds.__new__(KeptIds)
        other.blocks, other.n, other.shared = list(self.blocks), self.n, self.shared
        return other

    @property
    def nbytes(self) -> int:
        """What the blocks hold: their pointers and headers and, unless the ints are shared, one int
        object per ID (the few IDs under 257 are singletons: counted anyway, an upper bound)."""
        return (sys.getsizeof(self.blocks) + _TUPLE_BYTES * len(self.blocks) + _SLOT_BYTES * self.n
                + (0 if self.shared else _INT_BYTES * self.n))
