"""Where the added-token split could move a boundary: occurrences of any added-token string.

The reference first splits the raw text on added tokens, matched leftmost-longest. If no
occurrence of any added-token string (selected or not, overlapping ones included) crosses a cut,
the matches on each side are exactly the matches of the whole text, so the split commutes with the
cut. This module finds such occurrences in a small window with one compiled pattern.
"""
from __future__ import annotations

import re
from typing import Iterable


class SpecialTokenIndex:
    """All added-token strings of a tokenizer, searchable for occurrences near a position."""

    def __init__(self, contents: Iterable[str]):
        tokens = sorted({t for t in contents if t}, key=len, reverse=True)
        self.tokens = tokens
        self.max_len = max((len(t) for t in tokens), default=0)
        # A lookahead alternation finds, at every start position, the longest token starting there
        # (alternatives are ordered longest first), overlapping occurrences included.
        self._rx = re.compile("(?=(" + "|".join(map(re.escape, tokens)) + "))") if tokens else None
        # Every occurrence starts with one of these characters (one or two for the admitted families:
        # "<", "["): a window holding none of them before ``hi`` holds no occurrence that starts
        # before ``hi``, so the regex need not run (a str.find each; the regex engine is one more
        # native region a turn touches after an idle). Many distinct first characters: regex only.
        firsts = sorted({t[0] for t in tokens})
        self._firsts = tuple(firsts) if len(firsts) <= 4 else None

    def crosses(self, text: str, b: int) -> bool:
        """Whether some occurrence [s, e) of an added-token string has s < b < e."""
        return self._touches(text, b, b)

    def overlaps(self, text: str, lo: int, hi: int) -> bool:
        """Whether some occurrence [s, e) of an added-token string intersects [lo, hi)."""
        return hi > lo and self._touches(text, lo, hi)

    def _touches(self, text: str, lo: int, hi: int) -> bool:
        # Some occurrence [s, e) with s < hi and e > lo: for lo == hi == b, one that crosses b.
        if self._rx is None:
            return False
        start = max(0, lo - self.max_len + 1)
        if self._firsts is not None:
            for c in self._firsts:  # an occurrence [s, e) with s < hi starts at s in [start, hi)
                if text.find(c, start, hi) >= 0:
                    break
            else:
                return False
        end = min(len(text), hi + self.max_len - 1)
        for m in self._rx.finditer(text, start, end):
            s = m.start()
            if s >= hi:
                break
            if s + len(m.group(1)) > lo:
                return True
        return False
