"""Probe contexts derived from the pattern, and the case-fold guard (issue: exactness by construction)."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from delta_ray._core import case_groups as cg
from delta_ray._core.encoder import ReferenceEncoder
from delta_ray._verify import probe_contexts as pc
from delta_ray._verify.guard_probe import probe_disagreements

HAS_FAST = importlib.util.find_spec("fastokens") is not None


@pytest.fixture(scope="module")
def configs(tokenizer_paths):
    return {n: json.load(open(p, encoding="utf-8")) for n, p in tokenizer_paths.items()}


def test_case_insensitive_groups_are_read_from_the_pattern(configs):
    groups = cg.case_insensitive_groups(cg.split_patterns(configs["minimax-m3"]))
    assert groups and all(g == "'s|'t|'re|'ve|'m|'ll|'d" for g in groups)
    assert cg.fold_letters(cg.split_patterns(configs["qwen-3"])) == frozenset("strevmld")
    assert cg.case_insensitive_groups(cg.split_patterns(configs["deepseek-v3"])) == []


def test_fold_sensitive_code_points(name, configs):
    fold = pc.fold_sensitive_code_points(configs[name])
    if name == "deepseek-v3":  # no case-insensitive group: nothing to fold
        assert fold == frozenset()
        return
    # U+017F LONG S folds to "s" (the reference's own regex engine and Unicode's simple folding);
    # no ASCII letter is ever in the set.
    assert 0x17F in fold and all(cp >= 0x80 for cp in fold)
    # Multi-character folds spell nothing in 's|'t|'re|'ve|'m|'ll|'d (U+00DF -> ss, U+FB06 -> st),
    # and KELVIN SIGN folds to "k", which no contraction uses: German text keeps the fast tier.
    assert not ({0xDF, 0x1E9E, 0xFB05, 0xFB06, 0x212A} & fold)


def test_multi_character_folds_count_when_the_group_spells_them():
    fold = pc.fold_sensitive_for_patterns(("(?i:'ss|'st)",))
    assert {0xDF, 0x1E9E, 0xFB05, 0xFB06, 0x17F} <= fold


def test_contraction_witness_is_a_token(name, configs):
    cfg = configs[name]
    if name == "deepseek-v3":
        return
    w = pc.contraction_witness(cfg)
    vocab = cfg["model"]["vocab"]
    spanning = [t for t in vocab if t.endswith("'") and t[:-1].lstrip("\u0120").isascii()
                and t[:-1].lstrip("\u0120").isalpha()]
    if spanning:  # o200k: "W'" tokens exist because contractions attach to letter runs
        assert w.replace(" ", "\u0120") + "'" in vocab
    else:  # no token spans a letter and the apostrophe: the fallback
        assert w == " I"


def _split_after_witness(ref, needle: str):
    """An engine equal to the reference except that it breaks the piece before the apostrophe of
    ``needle`` (what an engine that does not fold a letter into the contraction group does)."""
    enc = ReferenceEncoder(ref)

    def encode(texts):
        out = []
        for t in texts:
            i = t.find(needle)
            if i < 0:
                out.append(enc.encode_pieces([t])[0])
            else:
                cut = i + needle.index("'")
                out.append(np.concatenate(enc.encode_pieces([t[:cut], t[cut:]])))
        return out
    return encode


def test_control_derived_contexts_catch_a_contraction_fold_bug(references, configs):
    """Control: an engine wrong only after a space, an uppercase letter and an apostrophe (it does
    not fold U+017F into the contraction group) is caught by the derived contexts; the fixed
    contexts of format 3 miss it."""
    name = "minimax-m3"
    ref, cfg = references[name], configs[name]
    witness = pc.contraction_witness(cfg)
    wrong = _split_after_witness(ref, witness + "'\u017f")
    cps = range(0x170, 0x180)
    derived = probe_disagreements(ref, wrong, cfg, code_points=cps, contexts=pc.derived_contexts(cfg), pairs=[])
    assert derived.disagreeing == {0x17F}
    fixed = probe_disagreements(ref, wrong, cfg, code_points=cps, contexts=pc.BASE_CONTEXTS, pairs=[])
    assert fixed.disagreeing == set()  # what the derived contexts add


@pytest.mark.skipif(not HAS_FAST, reason="fastokens is not installed")
def test_fastokens_long_s_contraction_is_guarded(references, configs, tokenizer_paths):
    """fastokens 0.3.5 does not fold U+017F into o200k's contraction group; the reference does.
    Minimal reproduction: " I'\u017f" (reference [" I'", "\u017f"], fastokens [" I", "'", "\u017f"])."""
    from delta_ray._engine.native import cached_fast_encoder
    name = "minimax-m3"
    ref, cfg = references[name], configs[name]
    fast = cached_fast_encoder(open(tokenizer_paths[name], "rb").read(), "fastokens")
    derived = probe_disagreements(ref, fast, cfg, code_points=[0x17F], contexts=pc.derived_contexts(cfg), pairs=[])
    fixed = probe_disagreements(ref, fast, cfg, code_points=[0x17F], contexts=pc.BASE_CONTEXTS, pairs=[])
    text = " I'\u017f"
    engine_wrong = fast.encode(text).tolist() != ref.encode(text, add_special_tokens=False).ids
    if engine_wrong:  # the installed fastokens still has the bug: the derived contexts see it
        assert 0x17F in derived.disagreeing and 0x17F not in fixed.disagreeing
    assert 0x17F in pc.fold_sensitive_code_points(cfg)  # guarded whatever the engine does
