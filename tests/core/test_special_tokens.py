"""Added-token occurrence checks against brute force."""
from __future__ import annotations

import random

import pytest

from delta_ray._core.special_tokens import SpecialTokenIndex

pytestmark = pytest.mark.battery  # the quick exactness battery (also run under tokenizers 1.x)


def _brute_crosses(tokens, text, b):
    return any(text.startswith(t, s) and s < b < s + len(t) for t in tokens for s in range(len(text)))


def _brute_overlaps(tokens, text, lo, hi):
    return lo < hi and any(text.startswith(t, s) and s < hi and s + len(t) > lo
                           for t in tokens for s in range(len(text)))


def test_crosses_and_overlaps_match_brute_force():
    tokens = ["<|im_end|>", "<|im_start|>", "<|im", "|>", "]<]start of speech[>[", "<｜▁pad▁｜>"]
    ix = SpecialTokenIndex(tokens)
    rnd = random.Random(3)
    alphabet = list("<|>im_endstar ]▁｜[") + tokens
    for _ in range(400):
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 12)))
        for b in range(len(text) + 1):
            assert ix.crosses(text, b) == _brute_crosses(tokens, text, b), (text, b)
        lo = rnd.randint(0, len(text))
        hi = rnd.randint(lo, len(text))
        assert ix.overlaps(text, lo, hi) == _brute_overlaps(tokens, text, lo, hi), (text, lo, hi)


def test_no_tokens():
    ix = SpecialTokenIndex([])
    assert not ix.crosses("abc", 1) and not ix.overlaps("abc", 0, 3) and ix.max_len == 0
