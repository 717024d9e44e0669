"""The differential fuzzer: engines behind their guards against the reference on generated text."""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from delta_ray._core.encoder import ReferenceEncoder
from delta_ray._engine.guard import GuardSet
from delta_ray._verify.fuzz import fuzz, fuzz_alphabet, shrink
from delta_ray._verify.probe_contexts import fold_sensitive_code_points

HAS_FAST = importlib.util.find_spec("fastokens") is not None
HAS_GIGA = importlib.util.find_spec("gigatoken") is not None
DEFAULT_SECONDS = float(os.environ.get("DELTA_RAY_FUZZ_SECONDS", "2"))


def _setup(name, tokenizer_paths, references):
    cfg = json.load(open(tokenizer_paths[name], encoding="utf-8"))
    added = [t["content"] for t in cfg.get("added_tokens") or []]
    return cfg, fuzz_alphabet(cfg, added), ReferenceEncoder(references[name]).encode_pieces


def test_alphabet_covers_the_pipeline(tokenizer_paths, references):
    cfg, alphabet, _ = _setup("minimax-m3", tokenizer_paths, references)
    for frag in ("\u017f", "\u00df", " I'", "'S", "'LL", "A", "\u01c5", "\u02b0", "\r", "/", " !"):
        assert frag in alphabet, frag
    assert any(t["content"] in alphabet for t in cfg["added_tokens"])


def test_control_fuzzer_finds_an_ascii_case_folding_bug(tokenizer_paths, references):
    """An engine that does not fold ASCII case in the contraction group ("'S" as if no contraction)
    is found within the default budget and shrunk to a short text holding "'S"."""
    _, alphabet, reference = _setup("llama3.2", tokenizer_paths, references)

    def wrong(texts):
        out = []
        for t in texts:
            i = t.find("'S")
            out.append(reference([t])[0] if i < 0 else np.concatenate(reference([t[:i + 1], t[i + 1:]])))
        return out
    res = fuzz(reference, wrong, alphabet, seconds=30, max_disagreements=1)
    assert res.disagreements, f"no disagreement in {res.comparisons} comparisons"
    small = res.disagreements[0]
    assert "'S" in small and len(small) <= 12
    assert not np.array_equal(reference([small])[0], wrong([small])[0])


def test_shrink_keeps_the_disagreement(tokenizer_paths, references):
    _, _, reference = _setup("qwen-3", tokenizer_paths, references)

    def wrong(texts):
        return [ids + (1 if "\u00e9" in t else 0) for t, ids in zip(texts, reference(texts))]
    small = shrink("Hello world, caf\u00e9 au lait 123!", reference, wrong, lambda t: True)
    assert small == "\u00e9"


@pytest.mark.skipif(not HAS_FAST, reason="fastokens is not installed")
def test_fastokens_behind_its_fold_guard_agrees(name, tokenizer_paths, references):
    """CI's default tier: a few seconds per tokenizer of fastokens behind the case-fold guard."""
    from delta_ray._engine.native import cached_fast_encoder
    cfg, alphabet, reference = _setup(name, tokenizer_paths, references)
    fast = cached_fast_encoder(open(tokenizer_paths[name], "rb").read(), "fastokens")
    guard = GuardSet(fold_sensitive_code_points(cfg))
    res = fuzz(reference, fast.encode_pieces, alphabet, allows=guard.allows, seconds=DEFAULT_SECONDS, seed=7)
    print(f"{name}: {res.comparisons} comparisons, {res.skipped} skipped by the guard")
    assert res.comparisons > 1000
    assert res.disagreements == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", [
    pytest.param("fastokens", marks=pytest.mark.skipif(not HAS_FAST, reason="no fastokens")),
    pytest.param("gigatoken", marks=pytest.mark.skipif(not HAS_GIGA, reason="no gigatoken"))])
def test_fuzz_slow_tier_a_million_comparisons(name, backend, tokenizer_paths, references):
    """Slow tier: at least 1M comparisons per tokenizer and engine behind its full admitted guard."""
    from delta_ray._verify.admit import admit_fast
    cfg, alphabet, reference = _setup(name, tokenizer_paths, references)
    enc = admit_fast(open(tokenizer_paths[name], "rb").read(), ReferenceEncoder(references[name]), backend)
    res = fuzz(reference, enc.fast.encode_pieces, alphabet, allows=enc.guard.allows,
               comparisons=1_000_000, seed=11, batch=8192, max_parts=8)
    print(f"{name}/{backend}: {res.comparisons} comparisons in {res.seconds:.0f}s, {res.skipped} skipped")
    assert res.disagreements == []
