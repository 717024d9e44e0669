"""The compact session turn: a continuation in as few distinct native calls as it can.

After an idle every code path a call touches is cold (a server's neighbours soon evict the
caches), so a turn costs roughly a fixed price per distinct native entry point it
enters. The general turn (:func:`delta_ray._core.repair.encode_turn`) enters numpy, pyarrow, the
engine's general paths and the planner's general form; this one, for the common continuation,
enters the engine once and pyarrow three times (one buffer, two arrays over it) and otherwise runs
plain Python over ints, strs and tuples.

It is the general turn restricted to the case where the general turn would do exactly this (docs/proof.md
§15): the stored state's last checkpoint is valid for the new text (its evidence lies in the stored
text), the span after it is too short for chunk cuts or intermediate checkpoints, the repair is
the router's choice (not a whole re-encode: its caller asks the router once), a tail cut exists, and the engine in use
now (one read of :meth:`~delta_ray._engine.engine.Engine.now`) is a fast tier with a native flat call, behind a guard
that allows both pieces; anything else returns None and the caller runs the general turn. Every step is
the general turn's own, called, not copied: the tail cut (:func:`~delta_ray._core.planner.tail_cut`),
the guard's test, the shadow verifier's sampling step, the checkpoint log's append
(:meth:`~delta_ray._core.rope.CheckpointLog.append_in_place`) and the store's install, which stores
the state only if the engine's generation is still the one the turn read.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import pyarrow as pa

from delta_ray._core import constants as C

from .._runtime.exit_guard import checkpoint
from .assembly import COPY_POOL
from .cut_predicate import CutPredicate
from .plan import pieces_between
from .planner import PlannerConfig, tail_cut
from .repair import WINDOW_BACK
from .rope import MERGE_IDS_BELOW, MERGE_TEXT_BELOW, CheckpointLog, merge_start
from .session_store import KeepList, SessionState, SessionStore

_INT32 = pa.int32()
_py_buffer = pa.py_buffer
_from_buffers = pa.Array.from_buffers


class TurnShadow(Protocol):
    """The shadow verifier's sampling step, as the turn runs it (``engine.shadow.ShadowVerifier``)."""

    def sampled(self) -> bool: ...

    def queue_flat(self, texts: Sequence[str], values: np.ndarray, offsets: np.ndarray, enc: Any) -> None: ...


class TurnTier(Protocol):
    """The fast tier in use, as the turn counts its work (``engine.engine.FastTier``)."""

    fast_texts: int

    @property
    def description(self) -> str: ...


class TurnNow(Protocol):
    """One read of the engine in use (``engine.engine.EngineNow``)."""

    @property
    def generation(self) -> int: ...

    @property
    def tier(self) -> TurnTier | None: ...

    @property
    def raw_flat(self) -> Callable[[list[str]], tuple[bytes, bytes]] | None: ...

    @property
    def allows(self) -> Callable[[str], bool] | None: ...


class TurnEngine(Protocol):
    """The engine as the turn reads it (``engine.engine.Engine``)."""

    @property
    def generation(self) -> int: ...

    @property
    def shadow(self) -> TurnShadow: ...

    def now(self) -> TurnNow: ...


def merge_chunks(chunks: tuple[Any, ...], lens: tuple[int, ...]) -> tuple[tuple[Any, ...], tuple[int, ...], bool]:
    """The rope's merge policy (:func:`~delta_ray._core.rope.merge_start`, as for ID parts) on Arrow
    chunks of known lengths, with no pyarrow call unless a join is due: (chunks, lengths, joined)."""
    j = merge_start(lens, MERGE_IDS_BELOW)
    if j >= len(lens) - 1:
        return chunks, lens, False
    return chunks[:j] + (pa.concat_arrays(chunks[j:], memory_pool=COPY_POOL),), lens[:j] + (sum(lens[j:]),), True


class TurnPath:
    """The compact continuation of one :class:`~delta_ray._tokenizer_core.TokenizerCore`."""

    def __init__(self, engine: TurnEngine, store: SessionStore, predicate: CutPredicate, margin: int,
                 planner: PlannerConfig, stats: dict[str, int]):
        self._engine = engine  # engine.engine.Engine: the engine in use (read once a turn), its shadow
        self._store = store
        self._pred = predicate
        self._margin = margin
        self._back = WINDOW_BACK + predicate.specials.max_len
        # the general turn cuts a span this long into chunks or intermediate checkpoints
        self._max_span = min(2 * C.CHECKPOINT_EVERY,
                             max(planner.cut_threshold, planner.min_cut_text))
        self._stats = stats

    def step(self, key: str, state: SessionState, delta: str,
             keep: KeepList | None = None) -> tuple[SessionState, int, bytes] | None:
        """A repair (the router's choice) of ``state``'s text plus ``delta`` (not empty): the new
        state, installed as ``key``'s; the number of leading IDs it kept from ``state``; the
        engine's buffer of the IDs after them (native int32, read-only). None where the general
        repair must run (see the module docstring). Called under the session's lock; ``keep``: the
        caller's kept list, stored with the state (:meth:`SessionStore.install`)."""
        now = self._engine.now()
        encode, tier = now.raw_flat, now.tier
        last = state.last_checkpoint
        if encode is None or tier is None or last is None or not delta:
            return None
        pos, k, ext = last
        n0 = state.n_chars
        n = n0 + len(delta)
        if ext > n0 or n - pos >= self._max_span:
            return None  # not this plan: the general repair cuts a long span into chunks or checkpoints
        kept, lens, exact, w0, tail = state.turn_head(self._back)
        window = tail + delta  # the stored text from w0 on, plus the append
        wb = pos - w0
        # the general turn's tail cut: the last cut at least ``margin`` before the end whose
        # evidence lies inside the text and after the checkpoint
        cut = tail_cut(window, self._pred, self._margin, after=wb, after_ext=ext - w0 if ext > w0 else 0)
        if cut is None:
            return None
        skip = self._pred.piece_skip  # the turn's hot path: two plain slices where nothing is skipped
        pieces = (pieces_between(window, (wb, cut.pos, len(window)), skip, w0) if skip
                  else [window[wb:cut.pos], window[cut.pos:]])
        allows = now.allows
        if allows is not None and not (allows(pieces[0]) and allows(pieces[1])):
            return None  # the general path confines the guarded code points
        checkpoint()
        try:
            buf, offs = encode(pieces)
        except (TypeError, UnicodeEncodeError) as exc:  # as FastEncoder: the reference refuses these too
            raise ValueError(f"the fast engine rejected the text: {exc}") from exc
        tier.fast_texts += 2
        shadow = self._engine.shadow
        if shadow.sampled():
            shadow.queue_flat(pieces, np.frombuffer(buf, dtype=np.int32), np.frombuffer(offs, dtype=np.int64), tier)
        t = int.from_bytes(offs[8:16], "little")  # the cut's index in the new IDs
        m = len(buf) >> 2
        pybuf = _py_buffer(buf)
        full = _from_buffers(_INT32, m, [None, pybuf])
        cut_ids = _from_buffers(_INT32, t, [None, pybuf])
        kept, lens, joined = merge_chunks(kept, lens)  # most turns join nothing
        chunks = kept + (full,)
        text_parts = state.text_parts + (delta,)
        tb, ib = state.known_bytes
        j = merge_start(tuple(map(len, text_parts)), MERGE_TEXT_BELOW)
        if j < len(text_parts) - 1:  # the text rope, by the same rule
            text_parts, tb = text_parts[:j] + ("".join(text_parts[j:]),), None
        elif tb is not None:
            tb += sys.getsizeof(delta)
        cp = (w0 + cut.pos, k + t, w0 + cut.ext)
        log, a, b = state.checkpoint_log
        if log is not None and CheckpointLog.append_in_place(log, a, b, cp):
            b += 1
        else:
            log, a, b = CheckpointLog.extend(state, state.n_checkpoints, list(cp))
        if b - a > C.MAX_CHECKPOINTS:  # keep the newest, as the general turn does
            a = b - C.MAX_CHECKPOINTS
        # an exact head shows every buffer of the state; kept unjoined, only this turn's buffer is new
        ib = ib + m * 4 if ib is not None and exact and not joined else None
        w1 = cp[0] - self._back
        if w1 < w0:
            w1 = w0
        tail = window[w1 - w0:]
        new = SessionState.compact(text_parts, n, k + m, (log, a, b), cp, chunks,
                                   (kept + (cut_ids,), lens + (t,), True, w1, tail), (tb, ib))
        self._store.install(key, new, self._engine.generation == now.generation,
                            None if tb is None or ib is None else  # entry_bytes, from known parts
                            sys.getsizeof(key) + tb + ib + 24 * (b - a) + sys.getsizeof(tail), keep, k, buf)
        self._stats["repair"] += 1
        return new, k, buf
