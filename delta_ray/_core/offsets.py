"""A session's character offsets: when they splice at a checkpoint, and the splice.

The reference gives each token the span of original characters its bytes came from: the added-token
split gives every section and added token its span, the normalizer's alignments map each normalized
character to the characters it came from, the pre-tokenizer's splits and the model's tokens carry
those, and a ``ByteLevel`` post-processor with ``trim_offsets`` then moves a token's ends past its
own leading and trailing spaces. At a safe cut ``b`` the tokens of ``S`` are those of ``S[:b]`` and
of ``S[b:]`` (docs/proof.md §1-§4); their offsets are those of the two encodes, the second shifted by
``b``, wherever every one of those steps maps each character on its own (docs/proof.md §17), which
:func:`offsets_refusal` checks on the configuration. Under an NFC normalizer, which composes
characters, a splice starts only at a checkpoint whose character is an NFC anchor in the new text and
in the one the kept offsets are of (:func:`splice_starts`): the reference's NFC starts afresh there,
alignments included. Refused, with the reason:

* a ``Prepend`` normalizer (``piece_skip``): the piece after a cut leaves out ``S[b]``, so the
  character the ``Prepend`` writes back is aligned to ``S[b + 1]``, where the whole text has ``S[b]``;
* a ``ByteLevel`` post-processor that trims offsets with ``add_prefix_space``: it leaves one leading
  space on the first token of an encode, and the piece's first token is not the text's.

A refused configuration's offsets come from the reference's whole encode (the caller's stock path),
and so do all offsets under tokenizers 1.x, whose encodings carry none.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .cut_predicate import CutPredicate
from .reference_api import OFFSETS_API
from .session_store import SessionState

EncodeOffsets = Callable[[str], "tuple[np.ndarray, np.ndarray]"]  # text -> (int32 IDs, (n, 2) offsets)
SpliceStarts = Callable[[int], bool]  # a checkpoint's position -> whether a splice may start there

# Checkpoints a splice passes over (their character no NFC anchor) before it asks the reference for
# the whole text instead: a turn's offsets never scan more of the checkpoint list than this.
MAX_PASSED_CHECKPOINTS = 64


def _processors(post_processor: Any) -> list[dict[str, Any]]:
    if not isinstance(post_processor, dict):
        return []
    if post_processor.get("type") == "Sequence":
        return [p for p in post_processor.get("processors") or [] if isinstance(p, dict)]
    return [post_processor]


def offsets_refusal(predicate: CutPredicate | None, post_processor: Any) -> str | None:
    """Why a session's offsets cannot be spliced at its checkpoints under this configuration (None:
    they can). ``post_processor``: the configuration's, as serialized."""
    if predicate is None:
        return "not admitted"
    if not OFFSETS_API:
        return "the reference gives no offsets (tokenizers 1.x)"
    if predicate.piece_skip:
        return "a Prepend normalizer (the piece after a cut leaves out the character it writes back)"
    for step in _processors(post_processor):
        # the reference's defaults for a field the JSON leaves out are both true
        if step.get("type") == "ByteLevel" and step.get("trim_offsets", True) is not False \
                and step.get("add_prefix_space", True) is not False:
            return "a ByteLevel post-processor that trims offsets with add_prefix_space (the first token apart)"
    return None


def _char_at(parts: tuple[str, ...], i: int) -> str:
    """Character ``i`` of a text kept as a rope of parts."""
    for part in parts:
        if i < len(part):
            return part[i]
        i -= len(part)
    raise IndexError("position past the text's end")


def splice_starts(predicate: CutPredicate, text: str, previous: SessionState | None) -> SpliceStarts | None:
    """Where a splice of ``text``'s offsets may start under this configuration: None, at any
    checkpoint; under NFC, at a checkpoint whose character is an anchor both in ``text`` and in the
    ``previous`` state's text, whose kept offsets the splice reuses (or the end of either). There
    the reference's NFC starts afresh, and so do the alignments it gives each character
    (docs/proof.md §17); a checkpoint is a safe cut, which the NFC guard places between anchors but
    not necessarily at one."""
    anchors = predicate.anchors
    if anchors is None:
        return None
    old_parts, old_n = (previous.text_parts, previous.n_chars) if previous is not None else ((), 0)

    def starts(pos: int) -> bool:
        if pos < len(text) and not anchors[ord(text[pos])]:
            return False
        return pos >= old_n or bool(anchors[ord(_char_at(old_parts, pos))])
    return starts


def splice_offsets(text: str, state: SessionState, kept: int, old: np.ndarray | None,
                   encode_offsets: EncodeOffsets, starts: SpliceStarts | None = None) -> np.ndarray | None:
    """The offsets of ``state``'s IDs (``state`` the session's new state for ``text``), as an
    (n, 2) int32 array: ``old``'s (the offsets of the state the turn continued, None if none were
    kept) up to the last checkpoint at or before the ``kept`` IDs the turn kept of it where a
    splice may start (``starts``: :func:`splice_starts`), then the reference's offsets of the text
    after that checkpoint, shifted to it. None where the reference's IDs of that tail are not the
    state's (the caller then serves the reference's whole encode): the offsets are only ever the
    reference's own, for the IDs the caller returns."""
    pos = tok = 0
    if old is not None and kept:
        cp_tok, cp_pos = state.cp_tok, state.cp_pos
        i = int(np.searchsorted(cp_tok, kept, side="right")) - 1
        last = i - MAX_PASSED_CHECKPOINTS
        while starts is not None and i >= 0 and i > last and not starts(int(cp_pos[i])):
            i -= 1
        if i >= 0 and i > last:
            pos, tok = int(cp_pos[i]), int(cp_tok[i])
    ids, offsets = encode_offsets(text[pos:] if pos else text)
    if len(ids) != state.n_ids - tok or not np.array_equal(ids, state.ids_from(tok)):
        return None
    if old is None or not tok:  # (tok is 0 wherever old is None)
        return offsets
    out = np.empty((state.n_ids, 2), dtype=np.int32)
    out[:tok] = old[:tok]
    np.add(offsets, pos, out=out[tok:])
    return out
