"""Which code points an atom matches, asked of the reference's own engine, one table per atom.

An atom is a one-character test of a pre-tokenizer step: a regex atom (its standalone pattern, run
by the reference's ``Split`` over every code point), or the character predicate of a step that has
no pattern (``Digits``, ``Punctuation``, ``WhitespaceSplit``: their Rust predicates, run by the
reference's own pre-tokenizer over every code point, each between two sentinel letters so that a
piece of one character is that code point alone). Nothing is computed from Python's ``unicodedata``,
whose Unicode version differs from the engine's.

``folded_into`` lists the code points that alone match a multi-character ``(?i)`` word (``ß`` for
``ss``): a path of the pattern may then consume one character where the position automaton shows
two, so such code points are never trusted next to a cut.

Tables are cached on disk by the atom and the reference's version (:mod:`delta_ray._core.table_cache`).
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Callable

import numpy as np

from ..charclass import N_CODEPOINTS, all_codepoints_text
from ..reference_api import FULL_API
from ..table_cache import cached_table
from .regex_syntax import Unsupported, literal_char, literal_source

TABLE_VERSION = 1
#: Character-predicate atoms (steps without a pattern), by the name a step's atom carries.
PREDICATES = ("digits", "punctuation", "whitespace")
_SENTINEL = "a"  # a letter: not numeric, not punctuation, not whitespace


def require_engine() -> None:
    """Raise :class:`Unsupported` unless the reference exposes its regex engine (tokenizers 0.x)."""
    if not FULL_API:
        raise Unsupported("this reference (tokenizers 1.x) exposes no regex engine to derive a pattern's classes from")


def _packed(key: str, derive: Callable[[], np.ndarray]) -> np.ndarray:
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]
    packed = cached_table(f"atom-{digest}", TABLE_VERSION, lambda: np.packbits(derive()),
                          ((N_CODEPOINTS + 7) // 8,), np.uint8)
    return np.unpackbits(packed)[:N_CODEPOINTS].astype(bool)


def _runs(pattern: str, text: str, cps: np.ndarray) -> np.ndarray:
    """Bool per code point inside a match of ``pattern`` over ``text`` (runs: one piece per run)."""
    from tokenizers import Regex, pre_tokenizers  # lazy: tokenizers 0.x only (1.x has no Regex)

    out = np.zeros(N_CODEPOINTS, dtype=bool)
    split = pre_tokenizers.Split(Regex(pattern), behavior="removed", invert=True)
    for _piece, (start, end) in split.pre_tokenize_str(text):
        out[cps[start:end]] = True
    return out


@lru_cache(maxsize=512)
def regex_members(pattern: str) -> np.ndarray:
    """Bool per code point: the reference's engine matches ``pattern`` (one character) on it."""
    require_engine()
    literal = literal_char(pattern)
    if literal is not None:  # a case-sensitive literal matches its own code point and no other
        out = np.zeros(N_CODEPOINTS, dtype=bool)
        out[ord(literal)] = True
        return out

    def derive() -> np.ndarray:
        # Runs of members come back as one piece each: one scan, few Python objects.
        text, cps = all_codepoints_text()
        return _runs(f"(?:{pattern})+", text, cps)

    return _packed("re:" + pattern, derive)


@lru_cache(maxsize=None)
def predicate_members(name: str) -> np.ndarray:
    """Bool per code point: the character predicate of the ``name`` step holds (see ``PREDICATES``)."""
    require_engine()
    if name not in PREDICATES:
        raise ValueError(f"unknown predicate {name!r}")

    def derive() -> np.ndarray:
        from tokenizers import pre_tokenizers  # lazy: tokenizers 0.x only

        text, cps = all_codepoints_text()
        spaced = _SENTINEL + _SENTINEL.join(text) + _SENTINEL  # code point k sits at 2k + 1
        out = np.zeros(N_CODEPOINTS, dtype=bool)
        if name == "whitespace":  # removed: a code point no piece covers
            covered = np.zeros(len(spaced), dtype=bool)
            for _piece, (start, end) in pre_tokenizers.WhitespaceSplit().pre_tokenize_str(spaced):
                covered[start:end] = True
            out[cps] = ~covered[1::2]
            return out
        step = (pre_tokenizers.Digits(individual_digits=True) if name == "digits"
                else pre_tokenizers.Punctuation("isolated"))
        for _piece, (start, end) in step.pre_tokenize_str(spaced):
            if end - start == 1 and start % 2 == 1:
                out[cps[start // 2]] = True
        return out

    return _packed("pred:" + name, derive)


@lru_cache(maxsize=64)
def folded_into(words: tuple[str, ...]) -> np.ndarray:
    """Bool per code point that alone matches ``(?i:w)`` for one of ``words`` (two or three characters)."""
    require_engine()
    pattern = "(?i:" + "|".join("".join(literal_source(c) for c in w) for w in sorted(words)) + ")"

    def derive() -> np.ndarray:
        text, cps = all_codepoints_text()
        # Each code point alone between two separators (in no word): a match inside one code point's
        # slot is a match of that code point alone.
        sep = next(c for c in "\n\x00\x01" if not any(c in w for w in words))
        spaced = sep + sep.join(text) + sep
        from tokenizers import Regex, pre_tokenizers  # lazy: tokenizers 0.x only

        out = np.zeros(N_CODEPOINTS, dtype=bool)
        split = pre_tokenizers.Split(Regex(pattern), behavior="removed", invert=True)
        for _piece, (start, end) in split.pre_tokenize_str(spaced):
            if end - start == 1 and start % 2 == 1:
                out[cps[start // 2]] = True
        return out

    return _packed("fold:" + pattern, derive)
