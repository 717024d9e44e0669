"""Session repair: re-encode only what follows the last checkpoint a new text still shares.

Given a stored state (text S, IDs, checkpoints) and a new text T sharing ``lcp`` leading characters
with S, the last checkpoint (pos, tok, ext) with ext <= lcp is a safe cut of T whose left IDs are
S's ``ids[:tok]`` (see :class:`SessionState`). Only ``T[pos:]`` is encoded, cut again by the
planner when long and once more near its end so the next turn finds a checkpoint close to the
end. A continuation (T extends S) is the common case; a text that diverges earlier (a chat template
that drops old reasoning blocks) still reuses everything before the divergence.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import constants as C
from .assembly import concat_ids
from .cut_predicate import CutPredicate
from .encoder import Encoder
from .planner import Cut, PlannerConfig, plan_cuts, tail_cut
from .session_store import SessionState

_BLOCK = 1 << 16


def common_prefix_len(a: str, b: str) -> int:
    """Length of the longest common prefix, comparing 64K-character blocks before narrowing down."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while i + _BLOCK <= n and a[i:i + _BLOCK] == b[i:i + _BLOCK]:
        i += _BLOCK
    lo, hi = i, min(n, i + _BLOCK)  # a[:lo] == b[:lo]; they differ before hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo if a[lo] != b[lo] else hi


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

    text: str
    start: int  # the reused checkpoint's position (0: nothing reused)
    kept_tokens: int
    kept_ids: np.ndarray | None
    cuts: list[Cut]
    pieces: list[str]
    keep_pos: np.ndarray
    keep_tok: np.ndarray
    keep_ext: np.ndarray


def plan_repair(text: str, base: SessionState | None, lcp: int, predicate: CutPredicate,
                cfg: PlannerConfig, workers: int, margin: int) -> RepairPlan:
    """Choose the last checkpoint of ``base`` valid for ``text`` and cut what follows it."""
    n = len(text)
    if base is not None and lcp > 0:
        valid = base.cp_ext <= lcp
        keep_pos, keep_tok, keep_ext = base.cp_pos[valid], base.cp_tok[valid], base.cp_ext[valid]
        if len(keep_pos):
            i = int(np.argmax(keep_pos))
            b, k, b_ext = int(keep_pos[i]), int(keep_tok[i]), int(keep_ext[i])
        else:
            b, k, b_ext = 0, 0, 0
        kept_ids = base.ids[:k]
    else:
        keep_pos = keep_tok = keep_ext = np.zeros(0, dtype=np.int64)
        b, k, b_ext, kept_ids = 0, 0, 0, None
    cuts: list[Cut] = plan_cuts(text, predicate, cfg, workers, start=b, start_ext=b_ext)
    span = n - b
    if not cuts and span >= 2 * C.CHECKPOINT_EVERY:
        # Checkpoints every CHECKPOINT_EVERY characters let a later text that diverges inside this
        # span (a chat template dropping an old block) reuse everything before the divergence.
        n_pieces = min(span // C.CHECKPOINT_EVERY, C.MAX_CHECKPOINT_PIECES)
        cuts = plan_cuts(text, predicate, cfg, workers, start=b, start_ext=b_ext, k=n_pieces)
    last_pos, last_ext = (cuts[-1].pos, cuts[-1].ext) if cuts else (b, b_ext)
    tc = tail_cut(text, predicate, margin, after=last_pos, after_ext=last_ext)
    if tc is not None:
        cuts.append(tc)
    bounds = [b] + [c.pos for c in cuts] + [n]
    pieces = [text[s:e] for s, e in zip(bounds, bounds[1:]) if e > s]
    return RepairPlan(text, b, k, kept_ids, cuts, pieces, keep_pos, keep_tok, keep_ext)


def finish_repair(plan: RepairPlan, arrays: list[np.ndarray]) -> RepairResult:
    """Splice the pieces' IDs onto the kept prefix and record the new checkpoints."""
    if len(arrays) != len(plan.pieces):
        raise ValueError("one ID array per piece is required")
    k, cuts = plan.kept_tokens, plan.cuts
    parts = ([plan.kept_ids] if plan.kept_ids is not None and len(plan.kept_ids) else []) + list(arrays)
    ids = concat_ids(parts)
    # Each cut's token index is the kept prefix plus the pieces before it.
    counts = np.cumsum([len(a) for a in arrays[:len(cuts)]], dtype=np.int64) + k
    cp_pos = np.concatenate([plan.keep_pos, np.array([c.pos for c in cuts], dtype=np.int64)])
    cp_tok = np.concatenate([plan.keep_tok, counts])
    cp_ext = np.concatenate([plan.keep_ext, np.array([c.ext for c in cuts], dtype=np.int64)])
    if len(cp_pos) > C.MAX_CHECKPOINTS:  # keep the newest: the next turn wants those near the end
        cp_pos, cp_tok, cp_ext = cp_pos[-C.MAX_CHECKPOINTS:], cp_tok[-C.MAX_CHECKPOINTS:], cp_ext[-C.MAX_CHECKPOINTS:]
    state = SessionState(plan.text, ids, cp_pos.astype(np.int64), cp_tok.astype(np.int64), cp_ext.astype(np.int64))
    return RepairResult(state, k, len(plan.text) - plan.start, len(plan.pieces))


def encode_with_base(text: str, base: SessionState | None, lcp: int, predicate: CutPredicate,
                     encoder: Encoder, cfg: PlannerConfig, workers: int, margin: int) -> RepairResult:
    """Encode ``text`` reusing ``base``'s IDs up to its last valid checkpoint; return the new state."""
    plan = plan_repair(text, base, lcp, predicate, cfg, workers, margin)
    arrays = encoder.encode_pieces(plan.pieces) if plan.pieces else []
    return finish_repair(plan, arrays)
