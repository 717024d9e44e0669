"""The engine: the one object that encodes pieces for a tokenizer, whichever engine runs them.

:class:`Engine` owns the reference, the admitted fast tier (its native engine and guard), the
shadow verifier that re-checks a share of the fast tier's answers, the confinement of guarded code
points and the generation every switch bumps. Every caller reads the engine in use once per call
(:meth:`Engine.now`, an immutable record replaced at every switch) and runs one of the three
output shapes of the core's ``Encoder`` Protocol: arrays, a flat buffer with offsets, or lists.
The compact session turn reads the same record and runs its native flat call itself.

Leaving the fast tier (a shadow mismatch, a rejection seen in its record) persists the rejection
and calls the owners' purge listeners; the cuts, repairs, store and pool never care which engine ran.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .._core.assembly import concat_ids, flat_from_pieces
from .._core.confine import WINDOW, confine
from .._core.cut_predicate import CutPredicate
from .._core.encoder import ReferenceEncoder
from .guard import GuardSet
from .native import NativeEngine, RawFlatCall
from .shadow import ShadowVerifier
from .verdicts import reject_verdict, watch_verdict

log = logging.getLogger("delta_ray.engine")


class FastTier:
    """An admitted fast engine and its guard (what :func:`delta_ray._verify.admit.admit_fast`
    makes): the engine encodes a text only where the guard allows every code point of it. Its
    counters say how many texts went to each side."""

    name = "fast"

    def __init__(self, fast: NativeEngine, guard: GuardSet | None = None, *,
                 verdict_key: dict[str, Any] | None = None, description: str | None = None):
        self.fast = fast
        self.guard = guard if guard is not None else GuardSet(frozenset())
        self.verdict_key = verdict_key  # where a caught mismatch persists the rejection
        self.description = description or f"fast ({fast.name}, {len(self.guard)} guarded code points)"
        self.fast_texts = 0
        self.fallback_texts = 0
        self.fallback_chars = 0  # characters the reference encoded in the guarded texts' windows

    def __repr__(self) -> str:
        return f"FastTier({self.description})"


class EngineNow(NamedTuple):
    """One read of the engine in use: a caller takes it once per call and uses only it."""

    generation: int
    tier: FastTier | None  # the fast tier in use; None on the reference
    raw_flat: RawFlatCall | None  # its native flat call (LE int32 IDs, LE int64 offsets), if it has one
    allows: Callable[[str], bool] | None  # its guard's test of a text; None when nothing is guarded


def _now_of(generation: int, tier: FastTier | None) -> EngineNow:
    if tier is None:
        return EngineNow(generation, None, None, None)
    return EngineNow(generation, tier, tier.fast.raw_flat, tier.guard.allows if len(tier.guard) else None)


class Engine:
    """Encodes pieces (no post-processing) exactly as the reference: by the admitted fast tier
    where its guard allows them, with guarded code points confined to small windows that the
    reference encodes, and by the reference alone before admission or after the tier is disabled.

    Implements the core's ``Encoder`` Protocol. ``predicate`` (the tokenizer's cut predicate, None
    for an unadmitted configuration) lets a guarded piece be cut around its guarded code points;
    without it such a piece goes to the reference whole. ``on_disable`` listeners run once when the
    fast tier is disabled: the owners discard every state the engine produced.
    """

    def __init__(self, reference: ReferenceEncoder, predicate: CutPredicate | None = None,
                 shadow_rate: float = 0.0, *, window: int = WINDOW):
        self.reference = reference
        self.reason = "reference"
        self.disabled_reason: str | None = None
        self._predicate = predicate
        self._window = window
        self._lock = threading.Lock()
        self._on_disable: list[Callable[[str], None]] = []
        self.shadow = ShadowVerifier(self, shadow_rate)  # re-checks a share of the fast tier's answers
        self._now = _now_of(0, None)

    # -- the state, read once --------------------------------------------------------------
    def now(self) -> EngineNow:
        """The engine in use, read once (an immutable record replaced at every switch)."""
        return self._now

    @property
    def generation(self) -> int:
        """Bumped on every switch: a state tagged with an older one is stale."""
        return self._now.generation

    @property
    def name(self) -> str:
        return "fast" if self._now.tier is not None else self.reference.name

    # -- switching -------------------------------------------------------------------------
    def use(self, tier: FastTier, reason: str) -> None:
        """Encode with ``tier`` from the next call on (unless the fast tier was disabled for good)."""
        with self._lock:
            if self.disabled_reason is None:
                self.reason = reason
                self._now = _now_of(self._now.generation + 1, tier)
        if tier.verdict_key is not None:
            watch_verdict(self, tier.verdict_key)

    def add_disable_listener(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(reason)`` when the fast tier is disabled (at once if it already was)."""
        with self._lock:
            self._on_disable.append(fn)
            disabled = self.disabled_reason
        if disabled is not None:
            fn(disabled)

    def back_to_reference(self, reason: str) -> None:
        """Permanently return to the reference, persist the rejection, and purge what the engine made."""
        with self._lock:
            if self.disabled_reason is not None:
                return
            wrong = self._now.tier
            self.disabled_reason = reason
            self.reason = f"reference (fast tier disabled: {reason})"
            self._now = _now_of(self._now.generation + 1, None)
            listeners = list(self._on_disable)
        reject_verdict(wrong.verdict_key if wrong is not None else None, reason)
        for fn in listeners:
            try:
                fn(reason)
            except Exception:  # noqa: BLE001 - one failing listener must not keep the others' states
                log.warning("a purge listener failed", exc_info=True)

    # -- the three output shapes -----------------------------------------------------------
    def encode_pieces(self, texts: Sequence[str]) -> list[np.ndarray]:
        """One int32 array per text."""
        now = self._now
        tier = now.tier
        if tier is None:
            return self.reference.encode_pieces(texts)
        texts = texts if type(texts) is list else list(texts)
        allows = now.allows
        if allows is None or all(map(allows, texts)):
            out = tier.fast.encode_pieces(texts)
            tier.fast_texts += len(texts)
            self.shadow.check_later(texts, out, tier)
            return out
        return self._guarded(tier, texts)

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The IDs of ``texts`` as one int32 buffer and int64 offsets (len(texts) + 1)."""
        now = self._now
        tier = now.tier
        if tier is None:
            return self.reference.encode_flat(texts)
        texts = texts if type(texts) is list else list(texts)
        allows = now.allows
        if allows is None or all(map(allows, texts)):
            values, offsets = tier.fast.encode_flat(texts)
            tier.fast_texts += len(texts)
            self.shadow.check_flat_later(texts, values, offsets, tier)
            return values, offsets
        return flat_from_pieces(self._guarded(tier, texts))

    def encode_lists(self, texts: Sequence[str]) -> list[list[int]] | None:
        """The fast engine's own Python lists (the drop-in's container), or None where it has none
        to give (the reference, a guarded code point, an engine whose list entry point is not
        checked yet): the caller then converts :meth:`encode_flat`'s values. A sampled call's
        lists become arrays in the verifier's thread only."""
        now = self._now
        tier = now.tier
        if tier is None:
            return None
        texts = texts if type(texts) is list else list(texts)
        allows = now.allows
        if allows is not None and not all(map(allows, texts)):
            return None
        lists = tier.fast.encode_lists(texts)
        if lists is None:
            return None
        tier.fast_texts += len(texts)
        self.shadow.check_later(texts, _AsArrays(lists), tier)
        return lists

    def prepare_lists(self) -> None:
        """Start the fast engine's list entry point check in the background now (the drop-in calls
        this when it attaches, so that the first requests find it done); nothing on the reference."""
        tier = self._now.tier
        if tier is not None:
            tier.fast.check_lists(background=True)

    # -- guarded texts ---------------------------------------------------------------------
    def _split(self, piece: str, tier: FastTier) -> list[str]:
        """``piece`` cut at safe cuts around its guarded code points (``[piece]`` where nothing is
        guarded in it, or the configuration has no cut predicate)."""
        if self._predicate is None:
            return [piece]
        return confine(piece, tier.guard, self._predicate, self._window)

    def _guarded(self, tier: FastTier, texts: list[str]) -> list[np.ndarray]:
        """Texts some of which the guard refuses: each is cut around its guarded code points, the
        windows go to the reference and everything else to the fast engine, in one call each."""
        splits = [self._split(t, tier) for t in texts]
        flat = [sub for s in splits for sub in s]
        allows = tier.guard.allows
        ok = [allows(sub) for sub in flat]
        arrays: list[np.ndarray] = [np.zeros(0, np.int32)] * len(flat)
        fast_idx = [i for i, k in enumerate(ok) if k]
        slow_idx = [i for i, k in enumerate(ok) if not k]
        if fast_idx:
            fast_texts = [flat[i] for i in fast_idx]
            got = tier.fast.encode_pieces(fast_texts)
            self.shadow.check_later(fast_texts, got, tier)
            for i, ids in zip(fast_idx, got):
                arrays[i] = ids
            tier.fast_texts += len(fast_idx)
        if slow_idx:
            slow = [flat[i] for i in slow_idx]
            for i, ids in zip(slow_idx, self.reference.encode_pieces(slow)):
                arrays[i] = ids
            tier.fallback_texts += len(slow_idx)
            tier.fallback_chars += sum(map(len, slow))
        out: list[np.ndarray] = []
        i = 0
        for s in splits:
            out.append(concat_ids(arrays[i:i + len(s)]) if len(s) > 1 else arrays[i])
            i += len(s)
        return out


class _AsArrays:
    """Lists read as int32 arrays one index at a time (the shadow verifier reads only those it samples)."""

    def __init__(self, lists: list[list[int]]):
        self._lists = lists

    def __len__(self) -> int:
        return len(self._lists)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self._lists[i], dtype=np.int32)
