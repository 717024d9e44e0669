"""Pre-tokenizer families and their accepted class transitions.

A cut at b between x = text[b-1] and y = text[b] is safe for a family's regex split when no match
of the pattern (and no gap between matches) can contain both x and y, and the left side's last
match closes at the end of input exactly as it does at the class change. The second condition holds
whenever x is not whitespace: the only end-of-input-sensitive construct in these patterns is the
lookahead of ``\\s+(?!\\S)``, which is evaluated right after whitespace; everything else is a
character test, and a path that fails on the whole text fails on the prefix too. Matches being
contiguous, the first condition depends only on the classes of x and y, so each family is a small
table over character classes. The reason for each accepted transition is in docs/proof.md §3; the
tables are deliberately conservative (a missed cut costs time, never IDs).

Classes are derived from the reference's own regex engine (:mod:`delta_ray._core.charclass`); under
tokenizers 1.x they are a candidate checked code point by code point against the reference's own
pre-tokenizer (:mod:`delta_ray._core.class_verify`), and a code point it does not confirm is ``UNV``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from delta_ray._core import charclass as cc

from .class_verify import verified_mask
from .reference_api import FULL_API

# Family class ids (small ints indexing the accept matrix).
LET, NUM, CRLF, WS, APOS, OTH, CJK, PS, GAP, MARK, UNV = range(11)
# UNV: a code point whose class the reference did not confirm (tokenizers 1.x, delta_ray._core.class_verify);
# no transition into or out of it is ever accepted.
CLASS_NAMES = ["L", "N", "CRLF", "W", "APOS", "O", "K", "PS", "G", "M", "UNV"]
N_CLASSES = len(CLASS_NAMES)

_QWEN3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
          "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_QWEN35 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
           "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_LLAMA3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
           "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_O200K = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
          "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
          "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
          "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_DSV3 = ("\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
         "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
         "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")


@dataclass(frozen=True)
class Family:
    """A known pre-tokenizer pattern family: its split patterns, classes and accepted transitions."""

    name: str
    patterns: tuple[str, ...]
    marks_are_letters: bool  # \p{M} joins letter runs (Qwen3.5, o200k, DeepSeek-V3)
    accepted: tuple[tuple[int, int], ...]
    split_behaviors: tuple[tuple[str, bool], ...] = (("isolated", False),)
    piece_skip: int = 0  # no family's normalizer prepends anything

    @property
    def accept_matrix(self) -> np.ndarray:
        return _accept_matrix(self.accepted)

    def class_table(self) -> np.ndarray:
        """Family class id (uint8) of every code point, from the reference's regex classes."""
        return _family_class_table(self.name)

    def candidate_table(self) -> np.ndarray:
        """The class table before verification: exact under tokenizers 0.x (the reference's own
        regex classes), a candidate that :mod:`delta_ray._core.class_verify` checks under 1.x."""
        return candidate_family_table(self.name)


@lru_cache(maxsize=None)
def _accept_matrix(accepted: tuple[tuple[int, int], ...]) -> np.ndarray:
    m = np.zeros((N_CLASSES, N_CLASSES), dtype=bool)
    for x, y in accepted:
        m[x, y] = True
    return m


def _pairs(left: int, rights: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((left, r) for r in rights)


# Qwen2/Qwen3 style: \p{N} alone, so a digit is always its own piece.
_QWEN3_ACCEPT = (_pairs(LET, (NUM, CRLF, WS, OTH)) + _pairs(NUM, (LET, NUM, CRLF, WS, OTH))
                 + _pairs(OTH, (NUM, WS)) + _pairs(APOS, (NUM, WS)))
# Llama-3 / GLM-4: digits in groups of 1-3 from the left of a run: never cut inside a run.
_LLAMA3_ACCEPT = (_pairs(LET, (NUM, CRLF, WS, OTH)) + _pairs(NUM, (LET, CRLF, WS, OTH))
                  + _pairs(OTH, (NUM, WS)) + _pairs(APOS, (NUM, WS)))
# o200k (MiniMax, gpt-oss): case-aware letter runs with an attached contraction, \p{N}{1,3}.
# Marks belong to both the letter runs and the punctuation run ([^\s\p{L}\p{N}]+), so a mark
# only borders digits and non-CR/LF whitespace safely.
_O200K_ACCEPT = (_pairs(LET, (NUM, CRLF, WS, OTH)) + _pairs(NUM, (LET, CRLF, WS, OTH, MARK))
                 + _pairs(OTH, (NUM, WS)) + _pairs(APOS, (NUM, WS)) + _pairs(MARK, (NUM, WS)))
# DeepSeek-V3: three splits; a boundary made at level 1 (digits) or 2 (CJK/kana) is final.
_DSV3_ACCEPT = tuple(
    (x, y) for x in range(N_CLASSES) for y in range(N_CLASSES)
    if x not in (WS, CRLF, UNV) and y != UNV and (
        ((x == NUM) != (y == NUM))
        or (x != NUM and y != NUM and (x == CJK) != (y == CJK))
        or (x == LET and y in (PS, CRLF, WS, GAP))
        or (x == PS and y in (WS, GAP))))

FAMILIES: dict[str, Family] = {
    "qwen3": Family("qwen3", (_QWEN3,), False, _QWEN3_ACCEPT),
    "qwen3.5": Family("qwen3.5", (_QWEN35,), True, _QWEN3_ACCEPT),
    "llama3": Family("llama3", (_LLAMA3,), False, _LLAMA3_ACCEPT),
    "o200k": Family("o200k", (_O200K,), True, _O200K_ACCEPT,
                    split_behaviors=(("isolated", False), ("removed", True))),
    "deepseek-v3": Family("deepseek-v3", _DSV3, True, _DSV3_ACCEPT),
}


def family_for_patterns(patterns: tuple[str, ...]) -> Family | None:
    """The family whose split patterns are exactly these, or None."""
    for fam in FAMILIES.values():
        if fam.patterns == patterns:
            return fam
    return None


@lru_cache(maxsize=None)
def _family_class_table(name: str) -> np.ndarray:
    """The candidate table, with every code point the reference does not confirm set to UNV (1.x)."""
    table = candidate_family_table(name)
    if FULL_API:  # the bits come from the reference's own regex engine
        return table
    out: np.ndarray = table.copy()
    out[~verified_mask(FAMILIES[name])] = UNV
    return out


@lru_cache(maxsize=None)
def candidate_family_table(name: str) -> np.ndarray:
    """The family classes of every code point as the candidate character classes give them."""
    fam = FAMILIES[name]
    bits = cc.class_table()
    out = np.full(cc.N_CODEPOINTS, OTH, dtype=np.uint8)
    letter = (bits & cc.L) > 0
    if fam.marks_are_letters and name != "o200k":
        letter |= (bits & cc.M) > 0
    if name == "deepseek-v3":
        out[:] = GAP
        out[((bits & (cc.P | cc.S)) > 0)] = PS
        out[letter] = LET
        out[(bits & cc.W) > 0] = WS
        out[(bits & cc.N) > 0] = NUM
        for lo, hi in ((0x4E00, 0x9FA5), (0x3040, 0x309F), (0x30A0, 0x30FF)):
            out[lo:hi + 1] = CJK
    else:
        out[letter] = LET
        if name == "o200k":
            out[(bits & cc.M) > 0] = MARK
        out[(bits & cc.W) > 0] = WS
        out[(bits & cc.N) > 0] = NUM
        out[ord("'")] = APOS
    out[ord("\r")] = CRLF
    out[ord("\n")] = CRLF
    return out
