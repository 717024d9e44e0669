"""The engine a tokenizer uses now, switchable at run time, and its fast path.

The switch holds the reference or the admitted fast tier (chosen by
:func:`delta_ray.verify.admit.select_engine`), the generation every switch bumps, the shadow
verifier that samples the fast tier's answers, and the guard of the engine in use. Leaving an
engine (a shadow mismatch, a rejection seen in its record) persists the rejection and purges what
it produced; the cuts, repairs, store and pool never care which encoder ran.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from ..core.encoder import Encoder, ReferenceEncoder, encode_flat
from .guard import GuardedEncoder
from .shadow import ShadowVerifier
from .verdicts import reject_verdict, watch_verdict

log = logging.getLogger("delta_ray.engine")


class FastPath(NamedTuple):
    """What the engine in use offers a caller that runs it directly (a session turn), bound to one
    generation of :class:`EngineSwitch`: the caller re-reads the generation before it stores what
    it computed, as every path does."""

    generation: int
    engine: Any  # the guarded encoder in use: its counters, and what the shadow checks answers against
    encode: Callable[[list[str]], tuple[bytes, bytes]]  # native flat call: LE int32 IDs, LE int64 offsets
    allows: Callable[[str], bool] | None  # the guard's test of a piece; None when nothing is guarded
    shadow: ShadowVerifier  # its sampling step runs once per call


class EngineNow(NamedTuple):
    """One read of the engine in use: the caller takes it once per call and uses only it."""

    generation: int
    encoder: Encoder  # the encoder in use (the reference or the guarded fast tier)
    guarded: GuardedEncoder | None  # the fast tier in use; None on the reference


class EngineSwitch:
    """The engine a tokenizer uses now: the reference or the admitted fast tier, switchable at run
    time (admission, a shadow mismatch), with the generation every switch bumps, the shadow
    verifier that samples the fast tier's answers and the guard of the engine in use.

    Implements the Encoder protocol by delegating, so every path picks up a switch at its next call;
    :meth:`fast_path` is the same engine for a caller that runs it directly. ``on_disable``
    callbacks run once when the fast tier is disabled: the owners discard every state the engine
    produced (sessions, content entries, mirrors).
    """

    def __init__(self, reference: ReferenceEncoder, shadow_rate: float = 0.0):
        self.reference = reference
        self.current: Encoder = reference
        self.reason = "reference"
        self.disabled_reason: str | None = None
        self.generation = 0  # bumped on every switch: states tagged with an older one are stale
        self._lock = threading.Lock()
        self._on_disable: list[Callable[[str], None]] = []
        self.shadow = ShadowVerifier(self, shadow_rate)  # re-checks a share of the fast tier's answers
        self._fast_path: tuple[int, FastPath | None] = (-1, None)  # (generation, its fast path)
        self._now = EngineNow(0, reference, None)

    def now(self) -> EngineNow:
        """The engine in use, read once (an immutable record replaced at every switch)."""
        return self._now

    def _set(self, enc: Encoder) -> None:
        """Install ``enc`` (under the lock): a new generation and its record."""
        self.current = enc
        self.generation += 1
        self._now = EngineNow(self.generation, enc, enc if isinstance(enc, GuardedEncoder) else None)

    def fast_path(self) -> FastPath | None:
        """The engine in use now for a caller that runs it itself: its native flat call, its guard's
        test and the shadow's sampling step, or None where only the layered path serves (the
        reference, a disabled tier, an engine without a native flat call). Made once per generation."""
        generation, fp = self._fast_path
        if generation == self.generation:
            return fp
        with self._lock:
            enc = self.current
            fast, guard = getattr(enc, "fast", None), getattr(enc, "guard", None)
            raw = getattr(fast, "raw_flat", None)
            fp = None
            if self.disabled_reason is None and enc is not self.reference and guard is not None and raw is not None:
                fp = FastPath(self.generation, enc, raw, guard.allows if len(guard) else None, self.shadow)
            self._fast_path = (self.generation, fp)
            return fp

    @property
    def name(self) -> str:
        return self.current.name

    def encode_pieces(self, texts: Sequence[str]) -> list[np.ndarray]:
        return self.current.encode_pieces(texts)

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        return encode_flat(self.current, texts)

    def add_disable_listener(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(reason)`` when the fast tier is disabled (at once if it already was)."""
        with self._lock:
            self._on_disable.append(fn)
            disabled = self.disabled_reason
        if disabled is not None:
            fn(disabled)

    def use(self, enc: Encoder, reason: str) -> None:
        with self._lock:
            if self.disabled_reason is None:
                self.reason = reason
                self._set(enc)
        verdict_key = getattr(enc, "verdict_key", None)
        if verdict_key is not None:
            watch_verdict(self, verdict_key)

    def back_to_reference(self, reason: str) -> None:
        """Permanently return to the reference, persist the rejection, and purge what the engine made."""
        with self._lock:
            if self.disabled_reason is not None:
                return
            wrong = self.current
            self.disabled_reason = reason
            self.reason = f"reference (fast tier disabled: {reason})"
            self._set(self.reference)
            listeners = list(self._on_disable)
        reject_verdict(getattr(wrong, "verdict_key", None), reason)
        for fn in listeners:
            try:
                fn(reason)
            except Exception:  # noqa: BLE001 - one failing listener must not keep the others' states
                log.warning("a purge listener failed", exc_info=True)
