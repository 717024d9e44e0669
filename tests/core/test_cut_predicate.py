"""The safe-cut predicate against the reference: exhaustive short strings, adversarial fragments,
continuations, and a control that proves the battery reaches the NFC cases."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delta_ray import DeltaTokenizer
from delta_ray._core.cut_predicate import CutPredicate
from exactness import ADVERSARIAL, REPRESENTATIVES, Battery, accepted_cuts, all_strings, special_fragments

pytestmark = pytest.mark.battery  # the quick exactness battery (also run under tokenizers 1.x)


@pytest.fixture(scope="module")
def deltas(tokenizer_paths):
    return {n: DeltaTokenizer(p) for n, p in tokenizer_paths.items()}


def _pairs(pred, texts, open_end=False):
    return [(t, b) for t in texts for b in accepted_cuts(pred, t, open_end)]


def test_all_six_admitted(deltas):
    for name, dt in deltas.items():
        assert dt.admission.admitted, (name, dt.admission.reason)


def test_exhaustive_short_strings(name, deltas, references):
    """Every string of length 2-3 over the class representatives, cut at every accepted position."""
    dt, ref = deltas[name], references[name]
    pred = dt.core._predicate
    texts = list(all_strings(REPRESENTATIVES, 3))
    pairs = _pairs(pred, texts)
    assert len(pairs) > 1000  # the predicate does accept cuts here: the test can fail
    assert Battery(ref).cut_failures(pairs) == []


@pytest.mark.slow
def test_exhaustive_length_four(name, deltas, references):
    dt, ref = deltas[name], references[name]
    texts = list(all_strings(REPRESENTATIVES[:16], 4))
    bat = Battery(ref)
    for i in range(0, len(texts), 20000):
        assert bat.cut_failures(_pairs(dt.core._predicate, texts[i:i + 20000])) == []
        bat.clear()


def test_continuations_of_short_strings(name, deltas, references):
    """A cut accepted for an open end stays exact whatever follows."""
    dt, ref = deltas[name], references[name]
    rnd = random.Random(1)
    # The evidence of a continuation-safe cut must lie inside the stored text, so each short string
    # is followed by a random tail of representatives as long as the longest added token.
    width = dt.core._predicate.specials.max_len
    texts = [t + "".join(rnd.choice(REPRESENTATIVES) for _ in range(width))
             for t in all_strings(REPRESENTATIVES, 3)]
    deltas_ = REPRESENTATIVES + ["\u0301\u0301", "'s", "123", "\r\n", "  x"] + special_fragments(ref, 4)
    triples = [(t, b, d) for t in texts for b in accepted_cuts(dt.core._predicate, t, open_end=True)[:4]
               for d in rnd.sample(deltas_, 3)]
    assert len(triples) > 1000
    assert Battery(ref).continuation_failures(triples) == []


def _fragments(ref):
    return ADVERSARIAL + special_fragments(ref)


@pytest.mark.parametrize("seed", range(3))
def test_random_fragment_strings(name, deltas, references, seed):
    """Strings of 2-12 adversarial fragments (special tokens included), every accepted cut."""
    dt, ref = deltas[name], references[name]
    frags = _fragments(ref)
    rnd = random.Random(seed)
    texts = ["".join(rnd.choice(frags) for _ in range(rnd.randint(2, 12))) for _ in range(1500)]
    pairs = _pairs(dt.core._predicate, texts)
    assert len(pairs) > 500
    assert Battery(ref).cut_failures(pairs) == []
    triples = [(t[:b2], b, t[b2:]) for t in texts[:400] for b2 in range(len(t) // 2, len(t))
               for b in accepted_cuts(dt.core._predicate, t[:b2], open_end=True)[-2:]]
    assert Battery(ref).continuation_failures(triples) == []


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_property_cuts_and_chunks(data, deltas, references):
    """Hypothesis: random fragment texts; every accepted cut, and the planner with tiny chunks."""
    name = data.draw(st.sampled_from(sorted(deltas)))
    dt, ref = deltas[name], references[name]
    frags = _fragments(ref)
    text = "".join(data.draw(st.lists(st.sampled_from(frags), min_size=2, max_size=40)))
    assert Battery(ref).cut_failures(_pairs(dt.core._predicate, text and [text])) == []
    long_text = text * (1 + 600 // max(1, len(text)))
    tiny = DeltaTokenizer(dt.core.loaded, chunk_size=16, cut_threshold=256, max_chunks=64, threads=64)
    for special in (False, True):
        assert tiny.encode(long_text, add_special_tokens=special).to_pylist() == \
            ref.encode(long_text, add_special_tokens=special).ids


def test_control_without_nfc_guard_finds_differences(deltas, references):
    """Switching the NFC guard off must make the battery fail: it reaches the cases the guard is for."""
    # In Qwen3.5 and o200k marks join letter runs, so their tables already refuse every raw
    # transition NFC can change; in Qwen3 a mark is punctuation-like and the guard carries weight.
    for name in ("qwen-3",):
        pred = deltas[name].core._predicate
        assert pred.normalize is not None
        unguarded = CutPredicate(pred.family, pred.specials)  # raw classes only, no NFC check
        texts = list(all_strings(REPRESENTATIVES, 3)) + ["\u0958/", "e\u0301x", "\u1100\u1161"]
        failures = Battery(references[name]).cut_failures(_pairs(unguarded, texts))
        assert failures, name
        assert Battery(references[name]).cut_failures(_pairs(pred, texts)) == []


def test_control_without_special_guard_finds_differences(deltas, references):
    """Likewise for the added-token guard: cutting inside a special token changes IDs."""
    name = "qwen-3"
    pred = deltas[name].core._predicate
    from delta_ray._core.special_tokens import SpecialTokenIndex
    unguarded = CutPredicate(pred.family, SpecialTokenIndex([]), pred.normalize, pred.anchors)
    texts = ["a<|im_end|>b", "x <|im_start|>user\nhi<|im_end|>\n", "<|endoftext|>5<|endoftext|>"]
    assert Battery(references[name]).cut_failures(_pairs(unguarded, texts))
    assert Battery(references[name]).cut_failures(_pairs(pred, texts)) == []
