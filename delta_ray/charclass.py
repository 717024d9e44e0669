"""Character classes as the reference's own regex engine sees them.

The pre-tokenizer regexes run on the Oniguruma build inside ``tokenizers`` (Unicode 16 in current
releases) while Python's ``unicodedata`` is Unicode 14 on 3.11: the two disagree on hundreds of code
points. So the table is derived from the installed reference itself, by running its own ``Split``
pre-tokenizer with one property pattern at a time over every code point, and cached on disk keyed
by the ``tokenizers`` version.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import Regex, pre_tokenizers

# One bit per property the families' patterns use. \s is Oniguruma's Unicode White_Space.
L, LU, LL, LT, LM, LO, M, N, P, S, W = (1 << i for i in range(11))
_PROPS = [
    (L, r"\p{L}"), (LU, r"\p{Lu}"), (LL, r"\p{Ll}"), (LT, r"\p{Lt}"), (LM, r"\p{Lm}"),
    (LO, r"\p{Lo}"), (M, r"\p{M}"), (N, r"\p{N}"), (P, r"\p{P}"), (S, r"\p{S}"), (W, r"\s"),
]
N_CODEPOINTS = 0x110000
TABLE_VERSION = 1


def _cache_path() -> Path:
    base = os.environ.get("DELTA_RAY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "delta_ray")
    return Path(base) / f"charclass-v{TABLE_VERSION}-tokenizers-{tokenizers.__version__}.npy"


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
    path = _cache_path()
    if path.exists():
        try:
            table = np.load(path)
            if table.shape == (N_CODEPOINTS,) and table.dtype == np.uint16:
                return table
        except Exception:
            pass
    table = derive_class_table()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
    np.save(tmp, table)
    os.replace(tmp, path)
    return table
