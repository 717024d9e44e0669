r"""What the fast-tier probe must look at, derived from the tokenizer's own pipeline.

A native engine reimplements the reference's pattern with its own Unicode tables. The guard probe
(:mod:`delta_ray._verify.guard_probe`) finds the code points whose *class membership* differs, by encoding every
code point in contexts where each membership decision the pattern makes changes the IDs of the
neighbours. This module derives those contexts from the tokenizer instead of a fixed list, and the
one decision a per-code-point probe cannot see is guarded wholesale:

* **Case-insensitive groups.** ``(?i:'s|'t|'re|'ve|'m|'ll|'d)`` matches a letter by *case folding*,
  and engines fold differently (the reference's Oniguruma folds U+017F LONG S to ``s``; another
  engine may not, or may also apply full foldings such as U+00DF to ``ss``). Whether folding
  changes the IDs depends on the BPE merges around the apostrophe (``" I'"`` is a token in o200k,
  so ``" I'ſ"`` shows the difference while ``"a'ſ"`` does not), so no fixed context proves
  agreement. :func:`fold_sensitive_code_points` therefore returns every non-ASCII code point that
  folds to a letter of such a group under the reference's own regex engine **or** that Unicode's
  case mappings (Python's ``casefold``/``lower``/``upper``/``title``) map onto a group letter (one
  character) or onto a run of letters the group spells (several characters); regex engines match
  whole code points, so nothing else can fold into the group. The guard sends every text holding
  one of them to the reference. The ASCII letters themselves are the pattern's own and
  are checked by the battery and the fuzzer in every case variant.
* **Class contexts.** :func:`derived_contexts` builds a chain in which the probed code point ``c``
  meets one representative of every class the pattern distinguishes (Lu, Ll, Lt, Lm, Lo, M, N, the
  apostrophe, space, tab, CR, LF, punctuation, the ``/`` of o200k's punctuation run, a CJK
  ideograph), on each side, with the optional leading characters the alternatives admit (a space
  before punctuation, a letter run plus apostrophe before a contraction, taken from the vocabulary
  so that the merge across the apostrophe exists).

``docs/proof.md`` §8 gives the argument and its limits.
"""
from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from .._core.case_groups import (
    alternatives,
    case_insensitive_groups,
    fold_letters,
    letter_runs,
    split_patterns,
    unicode_folds,
)
from .._core.class_verify import fold_sensitive_regex, verified_mask
from .._core.families import FAMILIES
from .._core.reference_api import FULL_API

# The fixed chain the probe used before (format 3); kept as the first derived context.
BASE_CONTEXTS: tuple[str, ...] = (
    "{c}",
    "{c}'s{c} {c}123{c}  {c}\r\n{c}\u0301{c}'{c}{c}a!{c}",
)

# One representative per class the families' patterns distinguish, chosen to be common enough that
# BPE merges exist around them (so a moved boundary shows in the IDs).
CLASS_NEIGHBOURS: tuple[str, ...] = (
    "A",        # Lu (o200k: an upper run before a lower run)
    "\u01c5",   # Lt
    "\u02b0",   # Lm
    "\u4e2d",   # Lo, and DeepSeek's CJK range
    "\t",       # whitespace other than space
    "\r",       # CR alone
    "\n",       # LF alone
    "/",        # o200k's punctuation run takes [\r\n/]*
    " !",       # ` ?[^\s\p{L}\p{N}]+`: an optional space before punctuation
    "ab",       # Ll run
    "1",        # a single digit (groups of 1-3 in llama3/o200k/DeepSeek)
)

def _reference_folds(letters: frozenset[str], groups: list[str], patterns: tuple[str, ...] = ()) -> set[int] | None:
    """Non-ASCII code points the reference's regex engine matches to a group's letters (0.x API)."""
    if not FULL_API:
        return _reference_folds_1x(tuple(patterns))
    from tokenizers import Regex, pre_tokenizers  # lazy: tokenizers 0.x only (1.x has no Regex)
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    text = "\x00".join(map(chr, cps))  # one code point per slot: no match can span two of them
    runs = {a.lstrip("'") for g in groups for a in alternatives(g)}
    alts = sorted(letters | {r for r in runs if r.isascii() and r.isalpha()})
    pattern = "(?i:" + "|".join(re.escape(a) for a in sorted(alts, key=len, reverse=True)) + ")"
    split = pre_tokenizers.Split(Regex(pattern), behavior="removed", invert=True)
    out = set()
    for _piece, (start, end) in split.pre_tokenize_str(text):
        for pos in range(start, end):
            if pos % 2 == 0 and cps[pos // 2] >= 0x80:
                out.add(cps[pos // 2])
    return out


def _reference_folds_1x(patterns: tuple[str, ...]) -> set[int]:
    """tokenizers 1.x exposes no regex: the ``regex`` package's folds onto the group letters, plus
    every non-ASCII code point the reference did not confirm for the family whose patterns these
    are (its fold contexts are part of that check, :mod:`delta_ray._core.class_verify`)."""
    out = fold_sensitive_regex(patterns)
    for fam in FAMILIES.values():
        if fam.patterns == patterns:
            out |= {int(c) for c in np.flatnonzero(~verified_mask(fam)) if c >= 0x80}
    return out


@lru_cache(maxsize=16)
def fold_sensitive_for_patterns(patterns: tuple[str, ...]) -> frozenset[int]:
    """Non-ASCII code points some engine may match to a letter of the patterns' case-insensitive groups."""
    groups = case_insensitive_groups(patterns)
    letters = fold_letters(patterns)
    if not letters:
        return frozenset()
    found = unicode_folds(letters, letter_runs(groups))
    ref = _reference_folds(letters, groups, patterns)
    if ref:
        found |= ref
    return frozenset(found)


def fold_sensitive_code_points(tokenizer_json: dict) -> frozenset[int]:
    """Non-ASCII code points that some engine may match to a letter of a case-insensitive group.

    Derived from the reference's regex engine (where the installed ``tokenizers`` exposes it) and
    from Unicode's simple and full case mappings; texts holding one go to the reference.
    """
    return fold_sensitive_for_patterns(tuple(split_patterns(tokenizer_json)))


def contraction_witness(tokenizer_json: dict) -> str:
    """A letter run ``W`` such that ``W'`` is one vocabulary token (byte-level), preferring a leading space.

    After ``W'`` a letter that the engine does or does not take as a contraction moves the boundary
    across that token, so the IDs show it. Falls back to ``" I"`` when the vocabulary has none.
    """
    vocab = ((tokenizer_json.get("model") or {}).get("vocab")) or {}
    best: tuple[tuple[int, int, str], str] | None = None
    for tok in vocab:
        if not isinstance(tok, str) or not tok.endswith("'") or len(tok) < 2:
            continue
        body = tok[:-1]
        spaced = body.startswith("\u0120")  # byte-level space
        core = body[1:] if spaced else body
        if core and core.isascii() and core.isalpha():
            rank = (0 if spaced else 1, len(core), core)
            if best is None or rank < best[0]:
                best = (rank, (" " if spaced else "") + core)
    return best[1] if best else " I"


def derived_contexts(tokenizer_json: dict) -> tuple[str, ...]:
    """The probe's context templates (``{c}`` is the probed code point) for this tokenizer.

    The fixed chain of format 3, then a chain that puts ``c`` next to every class representative
    and after the contraction witness for every case-insensitive alternative's apostrophe.
    """
    neighbours = list(CLASS_NEIGHBOURS)
    groups = case_insensitive_groups(split_patterns(tokenizer_json))
    if groups:
        neighbours.insert(0, contraction_witness(tokenizer_json) + "'")
    chain = "{c}" + "{c}".join(neighbours) + "{c}"
    return BASE_CONTEXTS + (chain,)
