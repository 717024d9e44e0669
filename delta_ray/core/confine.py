"""Confinement: a guarded code point sends only a small window around it to the reference.

The fast tier's guard refuses whole pieces: without this, one U+017F in a 1.5M-character chunk
sent the whole chunk to the reference (about a second instead of 8 ms). :class:`ConfiningEncoder`
sits in front of the switchable encoder: a piece the guard refuses is cut at safe cuts of that
piece about ``window`` characters before and after each guarded code point, so the fast engine
encodes everything but those windows. Cuts of a piece are decided on the piece alone and chained
like the planner's (each one's evidence starts at or after the previous cut, and the previous cut's
evidence ends at or before it), so the sub-pieces' IDs concatenate to the piece's (docs/proof.md §4); the
piece lies between safe cuts of its text, so nothing outside it changes.
"""
from __future__ import annotations

import bisect
from typing import Protocol, Sequence

import numpy as np

from .assembly import concat_ids, flat_from_pieces
from .cut_predicate import CutPredicate
from .encoder import ArraysByIndex, Encoder, FlatEncoder, Guard, GuardedTier, encode_flat
from .plan import split_at

WINDOW = 2048  # characters kept on each side of a guarded code point
MIN_PIECE = 4 * WINDOW  # shorter pieces go to the reference whole


class ShadowedEncoder(FlatEncoder, Protocol):
    """The engine in use behind its shadow verifier (``engine.shadow.ShadowVerifier``): an encoder,
    and the sampling step of a caller that ran the engine itself."""

    def check_later(self, texts: Sequence[str], out: ArraysByIndex, enc: Encoder) -> None: ...

    def check_flat_later(self, texts: Sequence[str], values: np.ndarray, offsets: np.ndarray,
                         enc: Encoder) -> None: ...


class EngineReading(Protocol):
    """One read of the engine in use (``engine.switch.EngineNow``)."""

    @property
    def guarded(self) -> GuardedTier | None: ...


class ConfinedEngine(Protocol):
    """The engine as the confining encoder reads it (``engine.switch.EngineSwitch``)."""

    @property
    def shadow(self) -> ShadowedEncoder: ...

    def now(self) -> EngineReading: ...


class ConfiningEncoder:
    """Encoder: like ``inner``, with guarded pieces split so only windows reach the reference."""

    def __init__(self, engine: ConfinedEngine, predicate: CutPredicate | None, window: int = WINDOW):
        self.engine = engine  # the engine object (engine.switch.EngineSwitch): the encoder in use, its shadow
        self.inner = engine.shadow  # the engine in use, its answers sampled by the shadow verifier
        self.predicate = predicate
        self.window = window
        self.confined = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def _guard(self) -> Guard | None:
        tier = self.engine.now().guarded
        return tier.guard if tier is not None else None

    def split(self, piece: str) -> list[str]:
        """Safe sub-pieces of ``piece`` isolating its guarded code points (``[piece]`` if none).

        Guarded code points less than two windows apart form one cluster (their windows would
        overlap). A cluster gets the last safe cut at most ``window`` characters before its first
        code point, and the first window-long block after its last one that holds a safe cut gives
        its right cut (block after block, up to the next cluster). The cost is linear in the piece:
        numpy finds the clusters, and each position is tested at most once (:class:`_Scanned`), so
        a run with no safe cut costs one pass and then goes to the reference whole."""
        guard = self._guard()
        if guard is None or self.predicate is None or len(piece) < MIN_PIECE or guard.allows(piece):
            return [piece]
        w, n = self.window, len(piece)
        pos = guard.positions(piece)
        gaps = np.flatnonzero(np.diff(pos) > 2 * w)
        firsts = pos[np.r_[0, gaps + 1]].tolist()
        lasts = pos[np.r_[gaps, len(pos) - 1]].tolist()
        scans = _Scanned(self.predicate, piece)
        cuts: list[int] = []
        prev, prev_ext = 0, 0
        for i, (first, last) in enumerate(zip(firsts, lasts)):
            if cuts and last < cuts[-1]:
                continue  # inside the window already cut out
            if not cuts or first >= cuts[-1]:
                stop = max(prev_ext, first - w, 1)
                found = scans.back(first, stop, prev) if first >= stop else None
                if found is not None:
                    cuts.append(found[0])
                    prev, prev_ext = found[0], found[2]
            end = firsts[i + 1] if i + 1 < len(firsts) else n  # the next cluster's first code point
            lo = max(prev_ext, last + 1)
            while lo < end:
                found = scans.back(min(end - 1, lo + w - 1), lo, prev)
                if found is not None:
                    cuts.append(found[0])
                    prev, prev_ext = found[0], found[2]
                    break
                lo += w
        if not cuts:
            return [piece]
        self.confined += 1
        return split_at(piece, cuts, self.predicate.piece_skip)

    def encode_pieces(self, texts: Sequence[str]) -> list[np.ndarray]:
        # The direct path (a session turn's few pieces): when the engine in use now is a guarded
        # fast engine and its guard allows every piece, the layers below would each pass the
        # pieces on unchanged (no window to confine, the shadow only samples, the switch
        # delegates, the guard sends all to the engine), so call the engine once and sample here.
        # Same engine read once, same guard check, same sampling: the same answer and checks,
        # without three Python layers between the call and the native encode.
        enc = self._direct_engine(texts)
        if enc is not None:
            out = enc.fast_pieces(list(texts))
            enc.fast_texts += len(texts)
            self.engine.shadow.check_later(texts, out, enc)
            return out
        texts = list(texts)
        splits = [self.split(t) for t in texts]
        if all(len(s) == 1 for s in splits):
            return self.inner.encode_pieces(texts)
        return self._encode_splits(splits)

    def _direct_engine(self, texts: Sequence[str]) -> GuardedTier | None:
        """The guarded fast engine in use now when its guard allows every text (None otherwise)."""
        tier = self.engine.now().guarded
        if tier is None:
            return None
        return tier if all(map(tier.guard.allows, texts)) else None

    def _encode_splits(self, splits: list[list[str]]) -> list[np.ndarray]:
        flat = [sub for s in splits for sub in s]
        arrays = self.inner.encode_pieces(flat)
        out: list[np.ndarray] = []
        i = 0
        for s in splits:
            out.append(concat_ids(arrays[i:i + len(s)]))
            i += len(s)
        return out

    def encode_lists(self, texts: Sequence[str]) -> list[list[int]] | None:
        """The direct path with the engine's own Python lists (the drop-in's container), or None
        where it does not apply (a guarded code point, no shadow verifier, an engine without a
        trusted list entry point): the caller then uses :meth:`encode_flat`. Same engine, guard and
        sampling as the direct path; a sampled call's lists become arrays in the verifier only."""
        enc = self._direct_engine(texts)
        if enc is None:
            return None
        lists = enc.fast_lists(list(texts))
        if lists is None:
            return None
        enc.fast_texts += len(texts)
        self.engine.shadow.check_later(texts, _AsArrays(lists), enc)
        return lists

    def prepare_lists(self) -> None:
        """Start the engine's list entry point check in the background now (the drop-in calls this
        when it attaches), so that the first requests already find it done."""
        tier = self.engine.now().guarded
        if tier is not None:
            tier.check_lists(background=True)

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        enc = self._direct_engine(texts)  # the direct path, as in encode_pieces
        if enc is not None:
            values, offsets = enc.fast_flat(list(texts))
            enc.fast_texts += len(texts)
            self.engine.shadow.check_flat_later(texts, values, offsets, enc)
            return values, offsets
        texts = list(texts)
        splits = [self.split(t) for t in texts]
        if all(len(s) == 1 for s in splits):
            return encode_flat(self.inner, texts)
        return flat_from_pieces(self._encode_splits(splits))


class _Scanned:
    """Backward scans for safe cuts over one text that never test a position twice.

    A position a scan tested without finding a cut (not safe, or its evidence starting before the
    scan's ``min_lo``) stays without one for every later scan of the same split: ``min_lo`` (the
    last cut made) only grows. The tested ranges are kept as sorted disjoint intervals, merged as
    they touch, and a scan jumps over them."""

    def __init__(self, predicate: CutPredicate, text: str):
        self._pred = predicate
        self._text = text
        self._lo: list[int] = []  # interval starts, ascending
        self._hi: list[int] = []  # interval ends (inclusive)

    def back(self, start: int, stop: int, min_lo: int) -> tuple[int, int, int] | None:
        """:meth:`CutPredicate.scan_back` over [stop, start], skipping tested positions."""
        b = start
        while b >= stop:
            i = bisect.bisect_right(self._lo, b) - 1
            if i >= 0 and self._hi[i] >= b:  # b was tested: jump below its interval
                b = self._lo[i] - 1
                continue
            floor = stop if i < 0 else max(stop, self._hi[i] + 1)  # untested down to here
            found = self._pred.scan_back(self._text, b, floor, min_lo=min_lo)
            if found is not None:
                self._add(found[0] + 1, b)
                return found
            self._add(floor, b)
            b = floor - 1
        return None

    def _add(self, lo: int, hi: int) -> None:
        if hi < lo:
            return
        los, his = self._lo, self._hi
        i = bisect.bisect_left(his, lo - 1)  # first interval that ends at or after lo - 1
        j = bisect.bisect_right(los, hi + 1)  # intervals before j start at or before hi + 1
        if i < j:  # touching or overlapping: merge them all with [lo, hi]
            lo, hi = min(lo, los[i]), max(hi, his[j - 1])
        los[i:j] = [lo]
        his[i:j] = [hi]


class _AsArrays:
    """Lists read as int32 arrays one index at a time (the shadow verifier reads only those it samples)."""

    def __init__(self, lists: list[list[int]]):
        self._lists = lists

    def __len__(self) -> int:
        return len(self._lists)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self._lists[i], dtype=np.int32)
