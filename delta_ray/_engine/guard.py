"""What runs on every request of the fast tier: the guard set.

A :class:`GuardSet` holds the code points on which a fast engine may disagree with the reference
for one tokenizer (derived by :mod:`delta_ray._verify.guard_probe`, cached as part of an admission record);
``allows(text)`` says whether the engine may encode a text (:class:`delta_ray._engine.engine.Engine`
sends the rest to the reference). Also here: the range
form a guard set is stored in, with its digest and validation (every record that carries one).
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence, cast

import numpy as np


def _ranges(cps: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for cp in sorted(set(cps)):
        if out and cp == out[-1][1] + 1:
            out[-1] = (out[-1][0], cp)
        else:
            out.append((cp, cp))
    return out


def _class_pattern(cps: Iterable[int]) -> re.Pattern[str] | None:
    parts: list[str] = []
    for lo, hi in _ranges(cps):
        if lo == hi:
            parts.append(re.escape(chr(lo)) if lo > 0x20 else f"\\x{lo:02x}")
        else:
            a = re.escape(chr(lo)) if lo > 0x20 else f"\\x{lo:02x}"
            b = re.escape(chr(hi)) if hi > 0x20 else f"\\x{hi:02x}"
            parts.append(f"{a}-{b}")
    if not parts:
        return None
    return re.compile("[" + "".join(parts) + "]")


def _str_header() -> int | None:
    """Bytes of a compact non-ASCII str object besides its characters (CPython), or None."""
    try:
        h = sys.getsizeof("\u00e9") - 2
        if (sys.getsizeof("\u0101\u0101") == h + 3 * 2 and sys.getsizeof("\U0001f600") == h + 2 * 4
                and sys.getsizeof("\u00e9" * 9) == h + 10):
            return h
    except TypeError:  # pragma: no cover - no getsizeof (PyPy)
        pass
    return None  # pragma: no cover


_STR_HEADER = _str_header()


def _str_kind(text: str) -> int:
    """1, 2 or 4: bytes per character of a non-ASCII str (its widest character fits), 0 if unknown."""
    if _STR_HEADER is None:  # pragma: no cover
        return 0
    k, r = divmod(sys.getsizeof(text) - _STR_HEADER, len(text) + 1)
    return k if r == 0 and k in (1, 2, 4) else 0


@dataclass(frozen=True)
class GuardSet:
    """The code points on which a fast engine may disagree with the reference, for one tokenizer.

    ``allows(text)`` is True when the text holds none of them. It costs nothing when the set is empty
    or the text is ASCII (the str's own flag, O(1)), and nothing more than a width check when the text's
    widest character is below every guarded one (CPython stores a str with 1, 2 or 4 bytes per
    character, which ``sys.getsizeof`` reveals); otherwise one pass: a precompiled character class
    (``re``) over 1- and 2-byte strings, a numpy lookup table over the UTF-32 form of 4-byte ones.
    """

    code_points: frozenset[int]
    key: dict[str, Any] = field(default_factory=dict, compare=False)
    stats: dict[str, Any] = field(default_factory=dict, compare=False)
    # Derived in __post_init__ for allows() and positions(): no constructor argument, not compared.
    # A pattern is None where its set is empty, and then never searched (the flags answer first).
    _empty: bool = field(init=False, repr=False, compare=False)
    _ascii_ok: bool = field(init=False, repr=False, compare=False)
    _latin1_ok: bool = field(init=False, repr=False, compare=False)
    _ucs2_ok: bool = field(init=False, repr=False, compare=False)
    _bmp_pattern: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _pattern: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _lut: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cps = sorted(self.code_points)
        bmp = [c for c in cps if c < 0x10000]
        lut = np.zeros(0x110000, dtype=bool)
        if cps:
            lut[np.asarray(cps, dtype=np.int64)] = True
        setattr_ = object.__setattr__
        setattr_(self, "_empty", not cps)
        setattr_(self, "_ascii_ok", not cps or cps[0] >= 0x80)
        setattr_(self, "_latin1_ok", not cps or cps[0] >= 0x100)
        setattr_(self, "_ucs2_ok", not bmp)
        setattr_(self, "_bmp_pattern", _class_pattern(bmp))
        # re matches whole code points in any str kind, astral ones included: one C scan per text
        setattr_(self, "_pattern", _class_pattern(cps))
        setattr_(self, "_lut", lut)

    def allows(self, text: str) -> bool:
        """True when ``text`` contains no guarded code point (the fast engine may encode it)."""
        if self._empty:
            return True
        # a flag that is False means a guarded code point in its range: that pattern is not None
        if text.isascii():
            return self._ascii_ok or cast("re.Pattern[str]", self._bmp_pattern).search(text) is None
        kind = _str_kind(text)
        if kind == 1:
            return self._latin1_ok or cast("re.Pattern[str]", self._bmp_pattern).search(text) is None
        if kind == 2:
            return self._ucs2_ok or cast("re.Pattern[str]", self._bmp_pattern).search(text) is None
        return cast("re.Pattern[str]", self._pattern).search(text) is None

    def positions(self, text: str) -> np.ndarray:
        """Indices of every guarded code point in ``text``."""
        if self._empty or not text:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self._lut.take(np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)))

    def first_guarded(self, text: str) -> int | None:
        """Index of the first guarded code point in ``text``, or None."""
        if self._empty or not text:
            return None
        hits = np.flatnonzero(self._lut.take(np.frombuffer(text.encode("utf-32-le", "surrogatepass"),
                                                            dtype=np.uint32)))
        return int(hits[0]) if len(hits) else None

    def __contains__(self, cp: object) -> bool:
        if isinstance(cp, str):
            cp = ord(cp)
        return cp in self.code_points

    def __len__(self) -> int:
        return len(self.code_points)

    def ranges(self) -> list[tuple[int, int]]:
        return _ranges(self.code_points)

    def __repr__(self) -> str:
        return f"GuardSet({len(self.code_points)} code points, backend={self.key.get('backend')})"



def ranges_digest(ranges: Sequence[Sequence[int]]) -> str:
    """SHA-256 of a guard set's canonical range list (part of every record that carries one)."""
    return hashlib.sha256(json.dumps([[int(a), int(b)] for a, b in ranges]).encode()).hexdigest()


def valid_ranges(ranges: object) -> bool:
    """Sorted, disjoint, in-range ``[lo, hi]`` integer pairs (what a stored guard set must be)."""
    if not isinstance(ranges, list):
        return False
    prev = -2
    for r in ranges:
        if (not isinstance(r, list) or len(r) != 2 or not all(type(v) is int for v in r)
                or not prev + 1 < r[0] <= r[1] <= 0x10FFFF):
            return False
        prev = r[1]
    return True


def guard_from_ranges(ranges: Sequence[Sequence[int]], key: dict[str, Any], stats: dict[str, Any]) -> GuardSet:
    return GuardSet(frozenset(c for lo, hi in ranges for c in range(lo, hi + 1)), key=key, stats=stats)


def valid_guard_payload(p: dict[str, Any]) -> bool:
    """A stored guard set: valid ranges bound to their digest, and a stats dict."""
    return (valid_ranges(p.get("ranges")) and p.get("ranges_sha256") == ranges_digest(p["ranges"])
            and isinstance(p.get("stats"), dict))
