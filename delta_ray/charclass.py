"""Character classes as the reference's own regex engine sees them.

The pre-tokenizer regexes run on the Oniguruma build inside ``tokenizers`` (Unicode 16 in current
releases) while Python's ``unicodedata`` is Unicode 14 on 3.11: the two disagree on hundreds of code
points. So the table is derived from the installed reference itself, by running its own ``Split``
pre-tokenizer with one property pattern at a time over every code point, and cached on disk keyed
by the ``tokenizers`` version.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from tokenizers import Regex, pre_tokenizers

from .table_cache import cached_table

# One bit per property the families' patterns use. \s is Oniguruma's Unicode White_Space.
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
    text, cps = all_codepoints_text()
    table = np.zeros(N_CODEPOINTS, dtype=np.uint16)
    for bit, prop in _PROPS:
        split = pre_tokenizers.Split(Regex(prop + "+"), behavior="removed", invert=True)
        for _piece, (start, end) in split.pre_tokenize_str(text):
            table[cps[start:end]] |= bit
    return table


@lru_cache(maxsize=1)
def class_table() -> np.ndarray:
    """The cached per-code-point class bits of the installed reference (derived on first use)."""
    return cached_table("charclass", TABLE_VERSION, derive_class_table, (N_CODEPOINTS,), np.uint16)
