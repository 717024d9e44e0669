"""Where a BPE model alone cannot move a boundary: the vocabulary's guard for SentencePiece-style BPE.

Without a pre-tokenizer split (Gemma, Llama 2, Baichuan, Mistral v0.x: a whole section of text is
one BPE word), a cut must come from the model. HF's BPE starts from one symbol per character (the
character's token when the vocabulary holds it; byte tokens or ``unk`` otherwise) and repeatedly
merges the adjacent pair of lowest rank into the token spelled by their concatenation. So if x and
y are characters the vocabulary holds as tokens, and **no token of the vocabulary contains x
immediately followed by y**, no merge ever joins the symbol ending in x to the one starting with y:
every merge output would contain ``xy``. The merges on each side then never see the other side,
and each side's merges happen in the same order as in the whole word (each step takes the pair of
lowest rank over both sides; restricted to one side, that is that side's lowest). So
``BPE(word) == BPE(word[:b]) + BPE(word[b:])`` (docs/proof.md §3, "The model's guard").

The cut is placed before the word separator ``▁`` (what a space becomes), where SentencePiece
vocabularies hardly ever hold a token with a character right before ``▁``: ``left`` is every
character the vocabulary holds with no token containing it followed by ``▁``, ``right`` is ``▁``.
``ignore_merges`` (a whole word found in the vocabulary is one token), a subword prefix or suffix,
and dropout are refused: they make a word's tokens depend on more than its merges.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..charclass import N_CODEPOINTS
from .regex_syntax import Unsupported

SEPARATOR = "\u2581"


@dataclass(frozen=True)
class ModelGuard:
    """Code points that may end the left side (``left``) and begin the right side (``right``) of a cut
    inside one BPE word, after normalization."""

    left: np.ndarray  # bool per code point
    right: np.ndarray  # bool per code point


def model_guard(model: dict[str, Any]) -> ModelGuard:
    """The vocabulary's guard of a BPE model config; raises :class:`Unsupported` when none is sound."""
    if model.get("type") != "BPE":
        raise Unsupported(f"model {model.get('type')!r} has no merge guard")
    if model.get("ignore_merges"):
        raise Unsupported("BPE ignore_merges: a word in the vocabulary is one token whatever its merges")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise Unsupported("BPE with a subword prefix or suffix")
    if model.get("dropout") not in (None, 0, 0.0):
        raise Unsupported("BPE dropout makes encodes random")
    vocab = model.get("vocab") or {}
    if SEPARATOR not in vocab:
        raise Unsupported(f"the vocabulary has no {SEPARATOR!r} token to cut before")
    before = set()
    for token in vocab:
        i = token.find(SEPARATOR, 1)
        while i > 0:
            before.add(token[i - 1])
            i = token.find(SEPARATOR, i + 1)
    left = np.zeros(N_CODEPOINTS, dtype=bool)
    singles = [ord(t) for t in vocab if len(t) == 1 and t not in before and not 0xD800 <= ord(t) <= 0xDFFF]
    left[np.asarray(singles, dtype=np.int64)] = True
    right = np.zeros(N_CODEPOINTS, dtype=bool)
    right[ord(SEPARATOR)] = True
    return ModelGuard(left, right)
