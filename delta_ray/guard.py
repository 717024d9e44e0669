"""Guarding the fast encoder: where it may disagree with the reference, and the admission battery.

A native engine (:mod:`delta_ray.fast_engine`) reimplements the reference's normalizer, pre-tokenizer
regex and BPE. Its Unicode tables are not the reference's: the reference's regex classes come from its
Oniguruma build (Unicode 16) and its NFC from Unicode 9.0 tables, while an engine may use older or newer
ones. So, per tokenizer (SHA-256 of its tokenizer.json) and per installed pair of versions, this module

1. **probes every code point** (U+0000..U+10FFFF, surrogates excluded) in a set of contexts against the
   reference and collects the code points on which the engine's IDs differ -- the *guard set*;
2. caches that set on disk (``$DELTA_RAY_CACHE/guard`` or ``~/.cache/delta_ray/guard``), keyed by
   (tokenizer digest, tokenizers version, engine name + version, probe format);
3. answers ``GuardSet.allows(text)``: the fast engine may encode a text only when it holds none of the
   guarded code points (an ``isascii`` fast path, then one precompiled character class);
4. runs :func:`verify_fast_engine`, a battery of real and adversarial texts the engine must pass before
   it is admitted.

How the probe isolates probes
-----------------------------
Probes are joined into chunks with a *separator* that is one of the tokenizer's own special added tokens
(``special``, not ``normalized``, no ``lstrip``/``rstrip``/``single_word``). The reference extracts such
tokens from the raw text *before* normalization and pre-tokenization and runs the normalizer and the
pre-tokenizer on each piece between them on its own, so each probe is encoded exactly as it would be
alone, and the chunk's IDs are the probes' IDs joined by the separator's ID. Probes that could form or
break a separator match (code points that occur in any added token's content) are never joined: they
are encoded one by one. The split is checked, not assumed: a chunk whose reference IDs do not hold
exactly one separator ID between consecutive probes is re-encoded probe by probe, and
:func:`check_probe_isolation` compares joined and one-by-one IDs on a sample.

Each chunk is encoded by both engines; equal chunks clear all their probes at once; in a chunk that
differs, the IDs are cut at the separator and compared probe by probe.

Contexts per code point ``c`` (``|`` marks the separator, a special-token string):

* ``|c|`` -- alone, i.e. next to a special-token string on both sides;
* ``|c a c 1 c ␠ c ' c \\n c \\u0301 c|`` (no spaces meant except ␠): every code point instance has a
  different left and right neighbour, so ``c`` is seen after and before a letter, a digit, a space, an
  apostrophe, LF, a combining mark (U+0301) and a special token;
* ``|c c \\r\\n c \\r c <| c . c 9 c|`` -- doubled, before and after CR/LF and CR, after a truncated
  special-token string, next to punctuation and a digit;
* pair probes ``|x y|`` and ``|a x y \\u0301|`` for every canonical composition pair known to Python's
  ``unicodedata``, for Hangul L+V and LV+T jamo, and for every pair of code points inside the blocks
  whose compositions were added after Unicode 9.0 (Dives Akuru, Tulu-Tigalari, Gurung Khema, Kirat Rai,
  ...), since the reference's NFC tables predate them.

Guarded code points are the ones in a probe whose IDs differ (both code points of a pair probe).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from delta_ray.fast_engine import FastEncoder, FastEngineUnavailable, fast_engine_versions

GUARD_FORMAT = 1  # bump when the probe contexts change: old cache entries are then ignored

_SURROGATES = range(0xD800, 0xE000)
ALL_CODE_POINTS = np.concatenate([np.arange(0, 0xD800), np.arange(0xE000, 0x110000)]).astype(np.int64)

# Contexts; "{}" is the probed code point (kept as templates so the docs above stay true).
CONTEXTS: tuple[str, ...] = (
    "{c}",
    "{c}a{c}1{c} {c}'{c}\n{c}\u0301{c}",
    "{c}{c}\r\n{c}\r{c}<|{c}.{c}9{c}",
)

# Blocks (start, end) whose canonical compositions are newer than the reference's Unicode 9.0 NFC
# tables; every ordered pair inside each is probed. Python's unicodedata (14.0 on 3.11) knows the
# Dives Akuru pair; the Unicode 16 scripts are beyond it, hence whole-block pairs.
NEW_COMPOSITION_BLOCKS: tuple[tuple[int, int], ...] = (
    (0x11900, 0x1195F),  # Dives Akuru (13.0)
    (0x11380, 0x113FF),  # Tulu-Tigalari (16.0)
    (0x16100, 0x1613F),  # Gurung Khema (16.0)
    (0x16D40, 0x16D7F),  # Kirat Rai (16.0)
)


def _cache_root() -> Path:
    base = os.environ.get("DELTA_RAY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "delta_ray")
    return Path(base) / "guard"


# ----------------------------------------------------------------------------------------------
# GuardSet
# ----------------------------------------------------------------------------------------------

def _ranges(cps: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for cp in sorted(set(cps)):
        if out and cp == out[-1][1] + 1:
            out[-1] = (out[-1][0], cp)
        else:
            out.append((cp, cp))
    return out


def _class_pattern(cps: Iterable[int]) -> re.Pattern | None:
    parts = []
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


@dataclass(frozen=True)
class GuardSet:
    """The code points on which a fast engine may disagree with the reference, for one tokenizer.

    ``allows(text)`` is True when the text holds none of them: ASCII texts are decided from the
    string's own flag in O(1) when no ASCII code point is guarded, others by one precompiled
    character-class search.
    """

    code_points: frozenset[int]
    key: dict = field(default_factory=dict, compare=False)
    stats: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_pattern", _class_pattern(self.code_points))
        object.__setattr__(self, "_ascii_ok", not any(cp < 0x80 for cp in self.code_points))

    def allows(self, text: str) -> bool:
        """True when ``text`` contains no guarded code point (the fast engine may encode it)."""
        if self._ascii_ok and text.isascii():
            return True
        pat = self._pattern
        return pat is None or pat.search(text) is None

    def first_guarded(self, text: str) -> int | None:
        """Index of the first guarded code point in ``text``, or None."""
        pat = self._pattern
        if pat is None:
            return None
        m = pat.search(text)
        return None if m is None else m.start()

    def __contains__(self, cp: object) -> bool:
        if isinstance(cp, str):
            cp = ord(cp)
        return cp in self.code_points

    def __len__(self) -> int:
        return len(self.code_points)

    def ranges(self) -> list[tuple[int, int]]:
        return _ranges(self.code_points)

    def __repr__(self) -> str:
        return f"GuardSet({len(self.code_points)} code points, key={self.key.get('backend')})"


# ----------------------------------------------------------------------------------------------
# The probe
# ----------------------------------------------------------------------------------------------

def _pick_separator(tokenizer_json: dict) -> tuple[str, int]:
    """The shortest special added token that is matched verbatim with no stripping."""
    cands = []
    for t in tokenizer_json.get("added_tokens") or []:
        if (t.get("special") and not t.get("normalized") and not t.get("lstrip") and not t.get("rstrip")
                and not t.get("single_word") and len(t["content"]) >= 2):
            cands.append((len(t["content"].encode()), t["content"], int(t["id"])))
    if not cands:
        raise FastEngineUnavailable("the tokenizer has no special added token to isolate probes with")
    cands.sort()
    return cands[0][1], cands[0][2]


def _added_token_chars(tokenizer_json: dict) -> set[int]:
    return {ord(ch) for t in tokenizer_json.get("added_tokens") or [] for ch in t["content"]}


def _composition_pairs() -> list[tuple[int, int]]:
    """Code point pairs whose canonical composition an engine's NFC tables may know and the reference's not."""
    pairs = set()
    for cp in range(0x110000):
        if cp in _SURROGATES:
            continue
        d = unicodedata.decomposition(chr(cp))
        if d and not d.startswith("<"):
            parts = [int(x, 16) for x in d.split()]
            if len(parts) == 2:
                pairs.add((parts[0], parts[1]))
    # Hangul: every L+V, and LV+T for the first LV of each L (T is chosen by the arithmetic, not tables)
    for l_ in range(0x1100, 0x1113):
        for v in range(0x1161, 0x1176):
            pairs.add((l_, v))
    for lv in range(0xAC00, 0xD7A4, 28):
        for t in range(0x11A8, 0x11C3, 9):
            pairs.add((lv, t))
    for lo, hi in NEW_COMPOSITION_BLOCKS:
        for a in range(lo, hi + 1):
            for b in range(lo, hi + 1):
                pairs.add((a, b))
    return sorted(pairs)


@dataclass
class ProbeResult:
    disagreeing: set[int]
    seconds: float
    probes: int
    chunks: int
    differing_chunks: int
    separator: str
    one_by_one: int


def _encode_ref(ref_tokenizer, texts: list[str]) -> list[np.ndarray]:
    encs = ref_tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.int32) for e in encs]


def _compare_chunk(r: np.ndarray, f: np.ndarray, nseg: int, sep_id: int) -> list[int] | None:
    """Indices of the differing segments, or None when the chunk's split cannot be trusted."""
    pr = np.flatnonzero(r == sep_id)
    if len(pr) != nseg - 1:
        return None
    pf = np.flatnonzero(f == sep_id)
    if len(pf) != nseg - 1:
        return None  # the engine split the chunk differently: judge its probes one by one
    if len(r) == len(f) and np.array_equal(pr, pf):
        bad_pos = np.flatnonzero(r != f)
        return sorted(set(np.searchsorted(pr, bad_pos).tolist()))
    bad = []
    rs = np.split(r, pr)
    fs = np.split(f, pf)
    for i, (a, b) in enumerate(zip(rs, fs)):
        if not np.array_equal(a, b):
            bad.append(i)
    return bad


def probe_disagreements(ref_tokenizer, fast: FastEncoder | Callable[[list[str]], list[np.ndarray]],
                        tokenizer_json: dict, *, code_points: Sequence[int] | np.ndarray | None = None,
                        contexts: Sequence[str] = CONTEXTS, pairs: Sequence[tuple[int, int]] | None = None,
                        chunk_probes: int = 2048) -> ProbeResult:
    """Probe code points (default: all but surrogates) in ``contexts`` and return where the engines differ."""
    t0 = time.perf_counter()
    fast_encode = fast.encode_pieces if hasattr(fast, "encode_pieces") else fast
    sep, sep_id = _pick_separator(tokenizer_json)
    risky = _added_token_chars(tokenizer_json)
    if code_points is None:
        code_points = ALL_CODE_POINTS
    if pairs is None:
        pairs = _composition_pairs()

    # probes: (text, owners) where owners are the code points blamed when the probe differs
    joined: list[tuple[str, tuple[int, ...]]] = []
    alone: list[tuple[str, tuple[int, ...]]] = []
    cps = [int(c) for c in code_points]
    for tmpl in contexts:
        if tmpl == "{c}":
            texts = [chr(c) for c in cps]
        else:
            texts = [tmpl.format(c=chr(c)) for c in cps]
        for c, t in zip(cps, texts):
            (alone if c in risky else joined).append((t, (c,)))
    for a, b in pairs:
        for t in (chr(a) + chr(b), "a" + chr(a) + chr(b) + "\u0301"):
            (alone if (a in risky or b in risky) else joined).append((t, (a, b)))

    disagreeing: set[int] = set()
    chunks_txt, chunks_own = [], []
    for i in range(0, len(joined), chunk_probes):
        part = joined[i:i + chunk_probes]
        chunks_txt.append(sep.join(t for t, _ in part))
        chunks_own.append([o for _, o in part])
    ref_ids = _encode_ref(ref_tokenizer, chunks_txt)
    fast_ids = fast_encode(chunks_txt)
    differing = 0
    for j, (r, f, owners) in enumerate(zip(ref_ids, fast_ids, chunks_own)):
        if len(r) == len(f) and np.array_equal(r, f) and np.count_nonzero(r == sep_id) == len(owners) - 1:
            continue
        differing += 1
        bad = _compare_chunk(r, f, len(owners), sep_id)
        if bad is None:  # cannot trust the split: every probe of the chunk goes one by one
            alone.extend(zip(chunks_txt[j].split(sep), owners))
            continue
        for i in bad:
            disagreeing.update(owners[i])
    if alone:
        texts = [t for t, _ in alone]
        for (t, o), r, f in zip(alone, _encode_ref(ref_tokenizer, texts), fast_encode(texts)):
            if not np.array_equal(r, f):
                disagreeing.update(o)
    return ProbeResult(disagreeing, time.perf_counter() - t0, len(joined) + len(alone), len(chunks_txt),
                       differing, sep, len(alone))


def check_probe_isolation(ref_tokenizer, tokenizer_json: dict, probes: Sequence[str]) -> bool:
    """True when the reference's IDs for the separator-joined probes equal its one-by-one IDs joined."""
    sep, sep_id = _pick_separator(tokenizer_json)
    whole = _encode_ref(ref_tokenizer, [sep.join(probes)])[0]
    parts = _encode_ref(ref_tokenizer, list(probes))
    expect = []
    for i, p in enumerate(parts):
        if i:
            expect.append(np.array([sep_id], dtype=np.int32))
        expect.append(p)
    return np.array_equal(whole, np.concatenate(expect) if expect else whole)
