"""The safe-cut predicate: one test serves the planner's chunks and the session repair.

A position b of a text S is a *safe cut* when the reference's encoding of S equals the encoding of
S[:b] followed by the encoding of S[b:] (both without post-processing). Three guards, in pipeline
order (docs/proof.md §1-§4 give the argument for each):

1. added tokens: no occurrence of an added-token string crosses b (:mod:`special_tokens`);
2. normalizer (NFC only): anchors a < b < c within ``NFC_WINDOW`` code points (or the text's ends)
   before which NFC always splits, no added-token occurrence in [a, c), and
   NFC(S[a:c]) == NFC(S[a:b]) + NFC(S[b:c]); the transition is then checked on the normalized
   characters on either side of b;
3. pre-tokenizer: its transition table accepts the class transition (x, y) at b
   (:mod:`delta_ray._core.pretok.transitions`; under tokenizers 1.x a hand-written :mod:`families` table).

BPE and the byte-level mapping act per pre-tokenized piece, so equal pieces give equal IDs.

A normalizer that prepends a character to every section of text (``Prepend``: Phi-3) would give
S[b:] one more; there the piece after a cut leaves out S[b], which the table requires to be that
character (``piece_skip``, :func:`delta_ray._core.plan.split_at`), and ``check`` also requires that
no added-token occurrence touches b - 1, b or b + 1, so b lies inside a section and S[b + 1:] starts
one (docs/proof.md §3).

``check`` returns the *evidence span* (lo, ext) of a safe cut: the decision read only
``text[lo:ext]`` (ext == len(text) + 1 when it relied on the text's end). The cut is then safe in
every text that holds the same characters at [lo, ext) and does not start after lo: a session
checkpoint stays valid while its ext lies inside the stored text (``open_end=True`` forbids using
the end as an anchor), and neighbouring cuts compose when each one's evidence lies between its
neighbours (docs/proof.md §4).
"""
from __future__ import annotations

from typing import Callable, Protocol, cast

import numpy as np

from .special_tokens import SpecialTokenIndex

NFC_WINDOW = 256
SCAN_NEAR = 32  # positions a backward scan tests one by one before it tests whole blocks at once
SCAN_BLOCK = 256  # the first block's length; each next block doubles, up to SCAN_BLOCK_MAX
SCAN_BLOCK_MAX = 1 << 16
_NO_POSITIONS = np.zeros(0, dtype=np.int64)


class TransitionTable(Protocol):
    """A pre-tokenizer's character classes and the class transitions at which a cut is safe: derived
    from its steps (:mod:`delta_ray._core.pretok.transitions`) or a hand-written family (tokenizers 1.x)."""

    def class_table(self) -> np.ndarray:
        """uint8 class id per code point."""

    @property
    def accept_matrix(self) -> np.ndarray:
        """bool (n_classes, n_classes): a cut between classes x and y is safe for the pre-tokenizer."""

    @property
    def piece_skip(self) -> int:
        """Characters a piece that starts at a cut leaves out (1 where a ``Prepend`` writes one back)."""


class CutPredicate:
    """Decides safe cuts for one admitted tokenizer configuration."""

    def __init__(self, family: TransitionTable, specials: SpecialTokenIndex,
                 normalize: Callable[[str], str] | None = None,
                 anchors: np.ndarray | bytes | None = None):
        self.family = family
        self.specials = specials
        self.normalize = normalize  # the reference NFC, or None for an identity normalizer
        self.piece_skip = family.piece_skip
        if normalize is not None and self.piece_skip:
            raise ValueError("no NFC predicate prepends")
        self.anchors: bytes | None = None  # the anchor table as bytes (set below), None without NFC
        if normalize is not None and anchors is None:
            raise ValueError("an NFC predicate needs the anchor table")
        # Per-character lookups as bytes: indexing a bytes object by an int is one C step, indexing
        # a numpy array makes a numpy scalar (the turn's tail scan does this per character).
        self._cls = family.class_table().tobytes()
        self._acc = tuple(bytes(row) for row in np.asarray(family.accept_matrix, dtype=np.uint8))
        # The same tables for numpy: a block of positions is class-tested in one call.
        self._cls_np = np.frombuffer(self._cls, dtype=np.uint8)
        self._acc_np = np.asarray(family.accept_matrix, dtype=bool)
        if anchors is not None:  # a uint8 table, or the bytes another predicate holds
            self.anchors = bytes(anchors) if isinstance(anchors, (bytes, bytearray)) else \
                np.asarray(anchors, dtype=np.uint8).tobytes()

    def check(self, text: str, b: int, open_end: bool = False) -> tuple[int, int] | None:
        """The evidence span (lo, ext) if b is a safe cut of text, else None."""
        n = len(text)
        if b <= 0 or b >= n:
            return None
        x, y = text[b - 1], text[b]
        if not self._acc[self._cls[ord(x)]][self._cls[ord(y)]]:
            return None
        if self.specials.crosses(text, b):
            return None
        # Uncapped: an extent past the end means the decision could not see a whole occurrence.
        extent = b + max(1, self.specials.max_len - 1)
        if self.piece_skip:  # S[b + 1:] starts a section of the text, inside the one holding b
            if b + 1 >= n or self.specials.overlaps(text, b - 1, b + 2):
                return None
            return b - 1, max(extent, b + 1 + max(1, self.specials.max_len))
        if self.normalize is None:
            return b - 1, max(extent, b + 1)
        # NFC guard. ASCII fast path: ASCII characters never compose backward and S[b+1] is an
        # anchor, so normalization is the identity on x and y and cannot cross b.
        anchors = cast(bytes, self.anchors)  # an NFC predicate holds its anchor table (__init__)
        if ord(x) < 128 and ord(y) < 128:
            if b + 1 < n and anchors[ord(text[b + 1])]:
                return b - 1, max(extent, b + 2)
            if b + 1 == n and not open_end:
                return b - 1, n + 1
        a = b - 1
        lo = max(0, b - NFC_WINDOW)
        while a > lo and not anchors[ord(text[a])]:
            a -= 1
        if not anchors[ord(text[a])] and a != 0:
            return None
        c = b + 1
        hi = min(n, b + NFC_WINDOW)
        while c < hi and not anchors[ord(text[c])]:
            c += 1
        if c >= n:
            if open_end:
                return None
            c_extent = n + 1
        elif anchors[ord(text[c])]:
            # text[c] was read, and so was every added-token occurrence starting before c.
            c_extent = c + max(1, self.specials.max_len - 1)
        else:
            return None
        c = min(c, n)
        if self.specials.overlaps(text, a, c):
            return None
        left = self.normalize(text[a:b])
        right = self.normalize(text[b:c])
        if not left or not right or self.normalize(text[a:c]) != left + right:
            return None
        if not self._acc[self._cls[ord(left[-1])]][self._cls[ord(right[0])]]:
            return None
        return a, max(extent, c_extent)

    def candidates(self, text: str, lo: int, hi: int) -> np.ndarray:
        """The positions b in [lo, hi] (and 0 < b < len(text)) whose class transition the family
        accepts, ascending: the first test of :meth:`check`, for a whole block in one numpy call."""
        lo, hi = max(lo, 1), min(hi, len(text) - 1)
        if hi < lo:
            return _NO_POSITIONS
        codes = np.frombuffer(text[lo - 1:hi + 1].encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        cls = self._cls_np.take(codes)
        return np.flatnonzero(self._acc_np[cls[:-1], cls[1:]]) + lo

    def scan_back(self, text: str, start: int, stop: int, open_end: bool = False,
                  min_lo: int = 0, max_ext: int | None = None) -> tuple[int, int, int] | None:
        """The largest safe cut b in [stop, start] whose evidence lies in [min_lo, max_ext]: (b, lo, ext).

        Every position is tested once: the nearest ``SCAN_NEAR`` one by one (a cut is usually a few
        characters back), then blocks of doubling length whose class tests run in one numpy call
        each, so a long region without a cut costs O(length) at numpy's speed, not Python's."""
        cls, acc = self._cls, self._acc
        b = min(start, len(text) - 1)
        stop = max(stop, 1)
        near = max(stop, b - SCAN_NEAR)
        while b >= near:
            if acc[cls[ord(text[b - 1])]][cls[ord(text[b])]]:
                span = self.check(text, b, open_end)
                if span is not None and span[0] >= min_lo and (max_ext is None or span[1] <= max_ext):
                    return b, span[0], span[1]
            b -= 1
        size = SCAN_BLOCK
        while b >= stop:
            a = max(stop, b - size + 1)
            for c in self.candidates(text, a, b)[::-1].tolist():
                span = self.check(text, c, open_end)
                if span is not None and span[0] >= min_lo and (max_ext is None or span[1] <= max_ext):
                    return c, span[0], span[1]
            b = a - 1
            size = min(2 * size, SCAN_BLOCK_MAX)
        return None
