"""Character classes as the reference's own regex engine sees them.

The pre-tokenizer regexes run on the regex engine inside ``tokenizers`` while Python's
``unicodedata`` is Unicode 14 on 3.11: the two disagree on hundreds of code points. So the table is
derived from the installed reference itself and cached on disk keyed by the ``tokenizers`` version:

* **tokenizers 0.x** exposes its engine (Oniguruma, Unicode 16 in current wheels): its own
  ``Split`` pre-tokenizer runs with one property pattern at a time over every code point.
* **tokenizers 1.x** exposes no regex and runs only the Split patterns it knows. The table is then
  a *candidate*, computed with the ``regex`` package (the same property syntax), and every use of it
  is checked against the reference: :mod:`delta_ray._core.class_verify` probes every code point through
  the reference's own pre-tokenizer (the tokenizer's patterns, in contexts) and any code point whose
  pieces differ from what the candidate classes predict is *unverified*, a class next to which no
  cut is ever accepted (docs/proof.md §10).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import regex

from .reference_api import FULL_API
from .table_cache import cached_table

# One bit per property the families' patterns use. \s is the regex engine's whitespace.
L, LU, LL, LT, LM, LO, M, N, P, S, W = (1 << i for i in range(11))
_PROPS = [
    (L, r"\p{L}"), (LU, r"\p{Lu}"), (LL, r"\p{Ll}"), (LT, r"\p{Lt}"), (LM, r"\p{Lm}"),
    (LO, r"\p{Lo}"), (M, r"\p{M}"), (N, r"\p{N}"), (P, r"\p{P}"), (S, r"\p{S}"), (W, r"\s"),
]
N_CODEPOINTS = 0x110000
TABLE_VERSION = 1


def all_codepoints_text() -> tuple[str, np.ndarray]:
    """Every code point except surrogates (the reference cannot take them), and their values."""
    cps = np.concatenate([np.arange(0, 0xD800), np.arange(0xE000, N_CODEPOINTS)]).astype(np.uint32)
    return cps.tobytes().decode("utf-32-le"), cps


def derive_class_table() -> np.ndarray:
    """Run the reference's regex engine over all code points once per property; return uint16 bits."""
    from tokenizers import Regex, pre_tokenizers  # lazy: tokenizers 0.x only (1.x has no Regex)

    text, cps = all_codepoints_text()
    table = np.zeros(N_CODEPOINTS, dtype=np.uint16)
    for bit, prop in _PROPS:
        split = pre_tokenizers.Split(Regex(prop + "+"), behavior="removed", invert=True)
        for _piece, (start, end) in split.pre_tokenize_str(text):
            table[cps[start:end]] |= bit
    return table


def derive_candidate_table() -> np.ndarray:
    """The same bits from the ``regex`` package (tokenizers 1.x): a candidate, verified before use."""
    text, cps = all_codepoints_text()
    table = np.zeros(N_CODEPOINTS, dtype=np.uint16)
    for bit, prop in _PROPS:
        for m in regex.finditer(prop + "+", text):
            table[cps[m.start():m.end()]] |= bit
    return table


def candidate_source() -> str:
    """What the table was derived with (part of every cache key built on it)."""
    if FULL_API:
        return "reference"
    return f"regex-{regex.__version__}"


@lru_cache(maxsize=1)
def class_table() -> np.ndarray:
    """The cached per-code-point class bits of the installed reference (derived on first use).

    Under tokenizers 1.x these are the ``regex`` package's candidate bits: use them only through
    :func:`delta_ray._core.families.Family.class_table`, which sets every code point the reference does
    not confirm to the unverified class.
    """
    if FULL_API:
        return cached_table("charclass", TABLE_VERSION, derive_class_table, (N_CODEPOINTS,), np.uint16)
    return cached_table(f"charclass-candidate-{candidate_source()}", TABLE_VERSION, derive_candidate_table,
                        (N_CODEPOINTS,), np.uint16)
