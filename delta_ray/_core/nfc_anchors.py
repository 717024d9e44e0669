"""NFC anchors: code points before which the reference NFC normalizer always splits.

A cut inside an NFC tokenizer's text is only safe if normalization cannot reach across it. An
*anchor* is a code point ``c`` with ``NFC(X + c + Y) == NFC(X) + NFC(c + Y)`` for every X and Y: a
starter (canonical combining class 0) that is unchanged when normalized alone and that never
composes with what precedes it. The NFC inside ``tokenizers`` uses Unicode 9.0 tables and Python's
``unicodedata`` does not, so every fact is derived from the installed reference normalizer:

* not a mark by the reference's regex engine (``\\p{M}``);
* ``NFC(c) == c``;
* not reordered by probe marks: ``NFC(U+0301 c) == U+0301 c`` (catches ccc in 1..229) and
  ``NFC(c U+0335) == c U+0335`` (catches ccc > 1), so its combining class is 0;
* no composition with a preceding Hangul probe (U+1100 for vowel jamo, U+AC00 for trailing jamo);
* never a non-first character of any code point's canonical decomposition (``NFD``), which is a
  superset of the characters that can compose with a preceding one;
* the first character of its own ``NFD`` is an anchor too (true of every anchor under the Unicode
  9 tables, and derived rather than assumed): the reference's NFC, which decomposes before it
  composes, then starts afresh at an anchor, so the alignments it gives each character split there
  as its output does (docs/proof.md §17, a session's offsets under NFC).

The table is cached on disk keyed by the ``tokenizers`` version. Under tokenizers 1.x (no
``normalizers`` module) the same facts come from the reference's NFC and NFD run through synthetic
tokenizers it loads (:func:`delta_ray._core.reference_api.normalizer`: ``decode(encode(s))`` of a byte-level
tokenizer with that normalizer is exactly the normalized ``s``); the mark test then uses the candidate
mark class (``M``) of :mod:`delta_ray._core.charclass` together with Python's ``unicodedata`` categories (more
exclusions only remove anchors, which costs cuts, never IDs).
"""
from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Callable

import numpy as np

from .charclass import N_CODEPOINTS, M, all_codepoints_text, candidate_source, class_table
from .reference_api import FULL_API, normalizer
from .table_cache import cached_table

TABLE_VERSION = 2  # 2: an anchor's NFD starts with an anchor
_SEP = "\n"  # a starter that composes with nothing; the probes are joined with it and split back


def _probe_unchanged(norm: Callable[[str], str], chars: list[str], before: str, after: str) -> np.ndarray:
    """For each char c, whether norm(before + c + after) == before + c + after, in one batched call."""
    probes = [before + c + after for c in chars]
    out = norm(_SEP + _SEP.join(probes) + _SEP).split(_SEP)[1:-1]
    if len(out) != len(probes):  # a probe's output contained the separator: answer one by one
        out = [norm(p) for p in probes]
    return np.fromiter((o == p for o, p in zip(out, probes)), dtype=bool, count=len(probes))


def derive_anchor_table() -> np.ndarray:
    """Compute the anchor flag of every code point from the installed reference normalizer."""
    nfc, nfd = normalizer("NFC"), normalizer("NFD")
    text, cps = all_codepoints_text()
    chars = [c for c in text if c != _SEP]
    cp_of = np.fromiter((ord(c) for c in chars), dtype=np.int64, count=len(chars))
    ok = ~((class_table()[cp_of] & M) > 0)
    if not FULL_API:  # candidate classes (regex package): also exclude what unicodedata calls a mark
        ok &= np.fromiter((not unicodedata.category(c).startswith("M") for c in chars), dtype=bool, count=len(chars))
    for before, after in (("", ""), ("\u0301", ""), ("", "\u0335"), ("\u1100", ""), ("\uac00", "")):
        ok &= _probe_unchanged(nfc, chars, before, after)
    anchors = np.zeros(N_CODEPOINTS, dtype=bool)
    anchors[cp_of[ok]] = True
    # Characters that appear after the first position of any canonical decomposition may compose
    # with a preceding character: never anchors.
    decomposed = nfd(_SEP + _SEP.join(chars) + _SEP).split(_SEP)[1:-1]
    if len(decomposed) != len(chars):  # pragma: no cover - NFD never produces LF
        raise RuntimeError("the reference NFD changed the number of lines")
    seconds = {ord(ch) for d in decomposed if len(d) > 1 for ch in d[1:]}
    for cp in seconds:
        anchors[cp] = False
    # An anchor whose NFD starts with a non-anchor: not an anchor. One pass is the fixpoint, since a
    # decomposition's first character decomposes to itself and so keeps its own flag here.
    for c, d in zip(chars, decomposed):
        if d != c and anchors[ord(c)] and not anchors[ord(d[0])]:
            anchors[ord(c)] = False
    anchors[ord(_SEP)] = True  # LF: a control starter, no decomposition, composes with nothing
    return anchors


@lru_cache(maxsize=1)
def anchor_table() -> np.ndarray:
    """The cached anchor flags (bool per code point) of the installed reference NFC."""
    name = "nfc-anchors" if FULL_API else f"nfc-anchors-{candidate_source()}"
    return cached_table(name, TABLE_VERSION, derive_anchor_table, (N_CODEPOINTS,), np.bool_)
