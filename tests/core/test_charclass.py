"""The class table matches the reference's own regex engine, code point by code point."""
from __future__ import annotations

import random

import numpy as np
from tokenizers import Regex, pre_tokenizers

from delta_ray._core import charclass as cc


def test_sampled_code_points_agree_with_reference_regex():
    table = cc.class_table()
    rnd = random.Random(7)
    cps = [c for c in (rnd.randrange(0x110000) for _ in range(3000)) if not 0xD800 <= c < 0xE000]
    cps += [ord(c) for c in "a Z5\t\n\r'.\u0301\u00a0\u3000\u2028\u0660\u4e00\U0001F600\u200d"]
    for bit, prop in cc._PROPS:
        rx = pre_tokenizers.Split(Regex(prop), behavior="removed", invert=True)
        for cp in cps:
            expect = len(rx.pre_tokenize_str(chr(cp))) == 1
            assert bool(table[cp] & bit) == expect, (hex(cp), prop)


def test_table_is_cached_and_stable():
    assert cc.class_table() is cc.class_table()
    table = cc.class_table()
    assert table.dtype == np.uint16 and table.shape == (cc.N_CODEPOINTS,)
    assert table[ord("a")] & cc.L and table[ord("a")] & cc.LL
    assert table[ord("5")] & cc.N and table[ord(" ")] & cc.W and table[0x301] & cc.M
    assert int((table & cc.W > 0).sum()) == 25  # Unicode White_Space
