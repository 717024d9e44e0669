"""NFC anchors, checked over every code point against the reference normalizer."""
from __future__ import annotations

import numpy as np
import pytest

from delta_ray._core.charclass import all_codepoints_text
from delta_ray._core.nfc_anchors import anchor_table
from delta_ray._core.reference_api import normalizer

pytestmark = pytest.mark.battery

# Left contexts that compose or reorder with what follows, right contexts that compose with or
# reorder against what precedes.
LEFT = ["e", "\u1100", "\uac00", "\u0915", "a\u0301", "\u0b47", "<"]
RIGHT = ["\u0301", "\u0335", "\u093c", "\u1161", "\u11a8", "\u0b3e", "\u0338", "x"]


def test_every_anchor_splits_normalization():
    """For every anchor c and every context pair: NFC(X c Y) == NFC(X) + NFC(c Y)."""
    nfc = normalizer("NFC")  # the reference's own (0.x normalizers, or a synthetic tokenizer under 1.x)
    table = anchor_table()
    text, cps = all_codepoints_text()
    anchors = [chr(c) for c in cps[table[cps]] if c != 0x0A]
    sep = "\n"
    for left, right in zip(LEFT, RIGHT[: len(LEFT)]):
        whole = nfc(sep.join(left + c + right for c in anchors)).split(sep)
        parts = nfc(sep.join(c + right for c in anchors)).split(sep)
        lhs = nfc(left)
        assert len(whole) == len(parts) == len(anchors)
        bad = [hex(ord(c)) for c, w, p in zip(anchors, whole, parts) if w != lhs + p]
        assert bad == [], (left, right, bad[:10])


def test_known_non_anchors():
    table = anchor_table()
    for ch in "\u0301\u093c\u0958\u1161\u11a8\u0b3e\u3099\u0344":
        assert not table[ord(ch)], hex(ord(ch))
    for ch in "a Z.\n\u00e9\uac00\u1100\u4e00":
        assert table[ord(ch)], hex(ord(ch))


def test_anchor_table_is_a_cached_bool_table():
    t = anchor_table()
    assert t is anchor_table() and t.dtype == np.bool_


def test_an_anchors_decomposition_starts_with_an_anchor():
    """For every anchor c, the first character of the reference's NFD(c) is an anchor (what a
    session's offsets under NFC rely on, docs/proof.md §17); some anchors do decompose."""
    nfd = normalizer("NFD")
    table = anchor_table()
    text, cps = all_codepoints_text()
    anchors = [chr(c) for c in cps[table[cps]] if c != 0x0A]
    decomposed = nfd("\n".join(anchors)).split("\n")
    assert len(decomposed) == len(anchors)
    assert [hex(ord(c)) for c, d in zip(anchors, decomposed) if not table[ord(d[0])]] == []
    assert sum(d != c for c, d in zip(anchors, decomposed)) > 10000  # precomposed letters, Hangul syllables
