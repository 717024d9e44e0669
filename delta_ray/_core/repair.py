"""Session repair: re-encode only what follows the last checkpoint a new text still shares.

Given a stored state (text S, IDs, checkpoints) and a new text T sharing ``lcp`` leading characters
with S, the last checkpoint (pos, tok, ext) with ext <= lcp is a safe cut of T whose left IDs are
S's ``ids[:tok]`` (see :class:`SessionState`). Only ``T[pos:]`` is encoded, cut again by the
planner when long and once more near its end so the next turn finds a checkpoint close to the
end. A continuation (T extends S) is the common case; a text that diverges earlier (a chat template
that drops old reasoning blocks) still reuses everything before the divergence.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from delta_ray._core import constants as C

from .cut_predicate import NFC_WINDOW, CutPredicate
from .encoder import Encoder
from .plan import pieces_between
from .planner import Cut, PlannerConfig, plan_cuts, tail_cut
from .rope import CheckpointLog, merge_id_parts, merge_text_parts, suffix_parts
from .session_store import SessionState, buffer_owner, owners_bytes

WINDOW_BACK = 2 * NFC_WINDOW + 64  # characters before a reused checkpoint the predicate may read


@dataclass
class RepairResult:
    """A new state and what it cost."""

    state: SessionState
    reused_tokens: int
    encoded_chars: int
    pieces: int


@dataclass
class RepairPlan:
    """What to encode for a new text: the kept prefix and the pieces after it."""

    text_parts: tuple[str, ...]  # the new text, as a rope (its parts are kept, not copied)
    n: int  # its length
    start: int  # the reused checkpoint's position (0: nothing reused)
    kept_tokens: int
    kept_parts: tuple[np.ndarray, ...]  # ids[:kept_tokens] of the base, zero-copy
    cuts: list[Cut]
    pieces: list[str]
    base: SessionState | None = None  # the state reused (its checkpoints, Arrow chunks)
    n_keep: int = 0  # how many of base's checkpoints stay valid (a prefix: see plan_turn)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


def plan_turn(text_parts: tuple[str, ...], n: int, base: SessionState | None, lcp: int, predicate: CutPredicate,
              cfg: PlannerConfig, workers: int, margin: int) -> RepairPlan:
    """Choose the last checkpoint of ``base`` valid for the new text and cut what follows it.

    The predicate only ever reads characters from ``NFC_WINDOW`` plus the longest added token
    before a candidate, and candidates lie after the reused checkpoint ``b``, so the planning runs
    on the window ``text[b - WINDOW_BACK:]``: a turn reads O(append) characters, not the context.

    A state's checkpoints are chained (each one's evidence ends at or before the next position,
    and ``ext > pos``), so both ``cp_pos`` and ``cp_ext`` increase strictly and the checkpoints
    still valid for a text sharing ``lcp`` characters (``ext <= lcp``) are a prefix of them: one
    binary search finds the last one, without reading the others.
    """
    if base is not None and lcp > 0:
        last = base.last_checkpoint
        if last is not None and last[2] <= lcp:  # a continuation: every checkpoint stays valid
            n_keep, (b, k, b_ext) = base.n_checkpoints, last
        else:
            n_keep = int(base.cp_ext.searchsorted(lcp, side="right"))
            if n_keep:
                i = n_keep - 1
                b, k, b_ext = int(base.cp_pos[i]), int(base.cp_tok[i]), int(base.cp_ext[i])
            else:
                b, k, b_ext = 0, 0, 0
        kept_parts = base.id_prefix_parts(k)
    else:
        n_keep, b, k, b_ext, kept_parts = 0, 0, 0, 0, ()
    w0 = max(0, b - (WINDOW_BACK + predicate.specials.max_len))
    window = "".join(suffix_parts(text_parts, w0, n))
    wb, wb_ext = b - w0, max(0, b_ext - w0)
    span = n - b
    # plan_cuts makes no chunk cut below the threshold (one chunk): a turn's short span skips it
    cuts: list[Cut] = (plan_cuts(window, predicate, cfg, workers, start=wb, start_ext=wb_ext)
                       if span >= cfg.cut_threshold and span >= cfg.min_cut_text else [])
    if not cuts and span >= 2 * C.CHECKPOINT_EVERY:
        # Checkpoints every CHECKPOINT_EVERY characters let a later text that diverges inside this
        # span (a chat template dropping an old block) reuse everything before the divergence.
        n_pieces = min(span // C.CHECKPOINT_EVERY, C.MAX_CHECKPOINT_PIECES)
        cuts = plan_cuts(window, predicate, cfg, workers, start=wb, start_ext=wb_ext, k=n_pieces)
    last_pos, last_ext = (cuts[-1].pos, cuts[-1].ext) if cuts else (wb, wb_ext)
    tc = tail_cut(window, predicate, margin, after=last_pos, after_ext=last_ext)
    if tc is not None:
        cuts.append(tc)
    bounds = [wb] + [c.pos for c in cuts] + [len(window)]
    pieces = pieces_between(window, bounds, predicate.piece_skip, w0)
    if w0:
        cuts = [Cut(c.pos + w0, c.lo + w0, c.ext + w0) for c in cuts]
    return RepairPlan(tuple(text_parts), n, b, k, kept_parts, cuts, pieces, base if n_keep else None, n_keep)


def plan_repair(text: str, base: SessionState | None, lcp: int, predicate: CutPredicate,
                cfg: PlannerConfig, workers: int, margin: int) -> RepairPlan:
    """:func:`plan_turn` for a text given whole."""
    return plan_turn((text,), len(text), base, lcp, predicate, cfg, workers, margin)


def finish_repair(plan: RepairPlan, arrays: list[np.ndarray]) -> RepairResult:
    """Append the pieces' IDs to the kept prefix (no copy of it) and record the new checkpoints."""
    if len(arrays) != len(plan.pieces):
        raise ValueError("one ID array per piece is required")
    new_ids = [a if a.dtype == np.int32 else np.asarray(a, dtype=np.int32) for a in arrays]
    counts = [len(a) for a in new_ids]
    return _finish(plan, new_ids, counts)


def finish_flat(plan: RepairPlan, values: np.ndarray, offsets: np.ndarray) -> RepairResult:
    """:func:`finish_repair` for the pieces' IDs as one flat buffer (the engine's own output):
    consecutive pieces of the text, so the buffer is one new ID part, split nowhere."""
    if len(offsets) != len(plan.pieces) + 1:
        raise ValueError("one offset per piece plus one is required")
    bounds = offsets.tolist()
    return _finish(plan, [values] if len(values) else [], [e - s for s, e in zip(bounds, bounds[1:])])


def _finish(plan: RepairPlan, new_ids: list[np.ndarray], counts: list[int]) -> RepairResult:
    k = plan.kept_tokens
    new_cp: list[int] = []
    tok = k
    for c, count in zip(plan.cuts, counts):  # each cut's token index: the kept prefix plus the pieces before it
        tok += count
        new_cp += (c.pos, tok, c.ext)
    t = tok - k  # the last cut's index in the new IDs: the next continuation keeps exactly ids[:tok]
    if len(new_ids) == 1 and 0 < t < len(new_ids[0]):
        # Stored as two parts split there (the head joins the rope, the tail stays its own last
        # part), so the next turn's kept prefix ends on a part boundary: no numpy slice of the last
        # part, and its Arrow array is reused as it is instead of sliced (each a native call that
        # is cold after an idle). The tail (a few IDs after the last cut) is never joined.
        new_ids = [new_ids[0][:t], new_ids[0][t:]]
        id_parts = merge_id_parts(list(plan.kept_parts) + new_ids[:1]) + (new_ids[1],)
    else:
        id_parts = merge_id_parts(list(plan.kept_parts) + new_ids)
    log, a, b = CheckpointLog.extend(plan.base, plan.n_keep, new_cp)
    if b - a > C.MAX_CHECKPOINTS:  # keep the newest: the next turn wants those near the end
        a = b - C.MAX_CHECKPOINTS
    base = plan.base
    text_parts = merge_text_parts(plan.text_parts)
    state = SessionState(None, None, None, None, None, checkpoints=(log, a, b),
                         text_parts=text_parts, id_parts=id_parts, n_chars=plan.n, n_ids=k + sum(counts),
                         arrow_from=base.arrow_source() if base is not None else None,
                         part_bytes=_part_bytes(base, plan, text_parts, id_parts, new_ids),
                         last=(new_cp[-3], new_cp[-2], new_cp[-1]) if new_cp else None)
    return RepairResult(state, k, plan.n - plan.start, len(plan.pieces))


def _part_bytes(base: SessionState | None, plan: RepairPlan, text_parts: tuple[str, ...],
                id_parts: tuple[np.ndarray, ...],
                new_ids: list[np.ndarray]) -> tuple[int | None, int | None]:
    """The new state's (text, IDs) bytes from its base's, when the turn only appended parts (most
    turns): counting them walked every part of the rope. None where a count is needed (a join
    happened, or the kept IDs dropped some of the base's buffers)."""
    if base is None:
        return None, None
    known = base.known_bytes
    if known[0] is None or known[1] is None:
        return None, None
    bt, bi = base.text_parts, base.id_parts
    tb = ib = None
    if len(text_parts) == len(bt) + 1 and text_parts[:-1] == bt:  # tuple ==: identity per part first
        tb = known[0] + sys.getsizeof(text_parts[-1])
    kept = plan.kept_parts
    if len(id_parts) == len(kept) + len(new_ids) and (
            (len(kept) == len(bi) and all(buffer_owner(a) is buffer_owner(b) for a, b in zip(kept[-1:], bi[-1:])))
            or (len(kept) == len(bi) - 1 and kept and buffer_owner(kept[-1]) is buffer_owner(bi[-1]))):
        # the kept prefix shows every buffer of the base (the last one sliced, or the base's tail
        # part dropped while its head, the same buffer, is kept), nothing was joined
        ib = known[1] + owners_bytes(new_ids)
    return tb, ib


def encode_turn(text_parts: tuple[str, ...], n: int, base: SessionState | None, lcp: int,
                predicate: CutPredicate, encoder: Encoder, cfg: PlannerConfig, workers: int,
                margin: int) -> RepairResult:
    """Encode a new text (a rope) reusing ``base``'s IDs up to its last valid checkpoint.

    The pieces go to the encoder in one call and come back as one flat buffer (the fast engine's
    own output, zero-copy), which becomes the state's new ID part as it is."""
    plan = plan_turn(text_parts, n, base, lcp, predicate, cfg, workers, margin)
    if not plan.pieces:
        return _finish(plan, [], [])
    values, offsets = encoder.encode_flat(plan.pieces)
    return finish_flat(plan, values, offsets)
