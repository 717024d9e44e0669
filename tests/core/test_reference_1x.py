"""delta-ray on whichever tokenizers is installed: the compat layer, and tokenizers 1.x as the reference.

Under 0.x these tests check the 1.x mechanisms against the 0.x API, which still exposes the ground
truth (the synthetic normalizer tokenizer against ``normalizers.NFC``, the split-probe tokenizer
against ``pre_tokenizers.Split``, the vocabulary from tokenizer.json against ``id_to_token``). Under
1.x they check what only 1.x can show: qwen-3.5 is refused with its reason, the class verification
confirms almost every assigned code point, and the synthetic NFC is the one inside the real tokenizers.
"""
from __future__ import annotations

import json
import pathlib
import random

import numpy as np
import pytest

from delta_ray._core import reference_api as ra
from delta_ray._core.reference_version import reference_major
from delta_ray.apps.bundled import bundled_tokenizer_path

pytestmark = pytest.mark.battery
ONE_X = reference_major() >= 1
only_0x = pytest.mark.skipif(ONE_X, reason="needs the 0.x API as ground truth")
only_1x = pytest.mark.skipif(not ONE_X, reason="tokenizers 1.x only")
NFC_TOKENIZERS = ("qwen-3", "minimax-m3")


def _config(path: str) -> dict:
    return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))


def _sample_texts(real_texts) -> list[str]:
    rnd = random.Random(3)
    cps = [c for c in (rnd.randrange(0x110000) for _ in range(4000)) if not 0xD800 <= c < 0xE000]
    texts = ["e\u0301 A\u030a \u0958 \u1100\u1161\u11a8 \uac00\u11a8 \u0b47\u0b3e \u212b \u2126 \u1e9b\u0323",
             "".join(map(chr, cps)), "a\u0301\u0327b\u0327\u0301 \U000113c2\U000113b8 \U00016d67\U00016d67"]
    for t in real_texts.values():
        texts += [t[i:i + 3000] for i in range(0, min(len(t), 60000), 3000)]
    return texts


def test_the_installed_reference_is_accepted():
    import delta_ray
    assert delta_ray.DeltaTokenizer  # `import delta_ray` works under 0.x and 1.x alike
    assert ra.FULL_API == (not ONE_X)


@pytest.mark.parametrize("tok_name", NFC_TOKENIZERS)
def test_reference_nfc_is_the_real_tokenizers_nfc(tok_name, references, real_texts):
    """The NFC delta-ray cuts with is the one inside the tokenizer: byte-level decode(encode(x)) of the
    real tokenizer is exactly its normalized x (no added-token strings in these texts)."""
    ref = references[tok_name]
    nfc = ra.normalizer("NFC")
    texts = [t for t in _sample_texts(real_texts) if "<|" not in t and "]<]" not in t]
    got = [nfc(t) for t in texts]
    want = [ref.decode(e.ids, skip_special_tokens=False) for e in ref.encode_batch(texts, add_special_tokens=False)]
    assert sum(g != w for g, w in zip(got, want)) == 0
    assert any(g != t for g, t in zip(got, texts))  # the samples do exercise normalization


@only_0x
def test_synthetic_normalizers_equal_the_0x_normalizers_on_every_code_point():
    from tokenizers import normalizers

    from delta_ray._core.charclass import all_codepoints_text
    text, _ = all_codepoints_text()
    for kind in ("NFC", "NFD"):
        tok = ra._normalizer_tokenizer(kind)
        real = getattr(normalizers, kind)()
        for chunk in (text[i:i + 200_000] for i in range(0, len(text), 200_000)):
            synth = tok.decode(tok.encode(chunk, add_special_tokens=False).ids, skip_special_tokens=False)
            assert synth == real.normalize_str(chunk), kind
        pairs = "\n".join(a + b for a in ("e", "\u1100", "\uac00", "a\u0301", "\u0b47") for b in
                          ("\u0301", "\u0335", "\u1161", "\u11a8", "\u0b3e", "x"))
        assert tok.decode(tok.encode(pairs).ids) == real.normalize_str(pairs)


@only_0x
@pytest.mark.parametrize("tok_name", ["qwen-3", "deepseek-v3", "minimax-m3"])
def test_split_probe_tokenizer_shows_the_0x_pre_tokenizer_pieces(tok_name, real_texts):
    """The WordLevel probe tokenizer splits exactly like the reference's own pre-tokenizer."""
    from tokenizers import Tokenizer
    cfg = _config(bundled_tokenizer_path(tok_name))
    stages = [s for s in ra.split_stages(cfg) if s.get("type") != "ByteLevel"]
    ref = Tokenizer.from_str(json.dumps(cfg))
    texts = _sample_texts(real_texts)[:12]
    pieces_of = [[p for p, _ in ref.pre_tokenizer.pre_tokenize_str(t)] for t in texts]
    # Name every piece (byte-level mapped by the real pre-tokenizer: map them back to text).
    inv = {v: k for k, v in ra.byte_symbols().items()}
    decoded = [[bytes(inv[ch] for ch in p).decode("utf-8") for p in ps] for ps in pieces_of]
    vocab_pieces = sorted({p for ps in decoded for p in ps})
    tok, vocab = ra.split_probe_tokenizer(stages, vocab_pieces)
    for t, ps in zip(texts, decoded):
        assert tok.encode(t, add_special_tokens=False).ids == [vocab[p] for p in ps]


@only_0x
def test_vocab_and_added_tokens_from_tokenizer_json_equal_the_0x_api(tokenizer_paths, references):
    for name, path in tokenizer_paths.items():
        ref, cfg = references[name], _config(path)
        table = ra.config_vocab(cfg)
        assert ra.vocab_size(type("T", (), {})(), cfg) == ref.get_vocab_size(with_added_tokens=True)
        lookup = ra.id_to_token_fn(type("T", (), {})(), cfg)
        assert all(lookup(i) == ref.id_to_token(i) for i in range(0, max(table) + 3, 97))
        assert ra.added_token_contents(None, cfg) == ra.added_token_contents(ref)


@only_1x
def test_qwen35_is_refused_with_its_reason():
    """tokenizers 1.x cannot load qwen-3.5 (its Split pattern needs a system-regex backend): the
    reference itself refuses, so delta-ray says so when asked for it, never a crash at import."""
    from delta_ray import DeltaTokenizer
    from delta_ray._core.reference_api import ReferenceRefused
    path = bundled_tokenizer_path("qwen-3.5")
    with pytest.raises(ValueError, match="cannot encode with this tokenizer.json: .*system-regex") as info:
        DeltaTokenizer(path)
    assert isinstance(info.value.__cause__, ReferenceRefused) or isinstance(info.value, ReferenceRefused)


@only_1x
@pytest.mark.parametrize("family", ["qwen3", "llama3", "o200k", "deepseek-v3"])
def test_class_verification_confirms_assigned_code_points(family):
    """Every pair of family classes is told apart by the contexts, and the reference confirms the
    candidate class of almost every code point Python's Unicode tables assign."""
    import unicodedata

    from delta_ray._core.class_verify import check_sensitivity, verified_mask
    from delta_ray._core.families import FAMILIES, UNV
    assert check_sensitivity(FAMILIES[family]) == []
    mask = verified_mask(FAMILIES[family])
    assigned = np.array([unicodedata.category(chr(c)) not in ("Cn", "Cs") for c in range(0x110000)])
    share = mask[assigned].mean()
    assert share > 0.995, share
    assert not mask[0xD800:0xE000].any()  # surrogates are never probed, never verified
    table = FAMILIES[family].class_table()
    assert (table[~mask] == UNV).all() and (table[mask] != UNV).all()


@only_1x
def test_unverified_code_points_are_never_next_to_a_cut(references):
    from delta_ray import DeltaTokenizer
    from delta_ray._core.class_verify import verified_mask
    from delta_ray._core.families import FAMILIES
    dt = DeltaTokenizer(bundled_tokenizer_path("qwen-3"), engine="reference")
    bad = int(np.flatnonzero(~verified_mask(FAMILIES["qwen3"]) & (np.arange(0x110000) >= 0xE000))[0])
    text = f"word {chr(bad)} 123 more"
    pred = dt.core._predicate
    i = text.index(chr(bad))
    assert pred.check(text, i) is None and pred.check(text, i + 1) is None
    assert dt.encode(text).to_pylist() == references["qwen-3"].encode(text).ids


def test_fast_tier_is_admitted_against_the_installed_reference(references, real_texts):
    """The fast tier's probe, fuzzer and battery compare with whichever reference is installed, and
    the verdict is keyed by its version; the admitted engine's answers equal the reference's."""
    pytest.importorskip("fastokens")
    from delta_ray import DeltaTokenizer
    from delta_ray._core.reference_version import reference_version
    from delta_ray._engine.native import package_version
    from delta_ray._verify.admit import verdict_key
    name = "llama3.2"
    path = bundled_tokenizer_path(name)
    key = verdict_key(pathlib.Path(path).read_bytes(), "fastokens", package_version("fastokens"))
    assert key["tokenizers"] == reference_version()
    dt = DeltaTokenizer(path, engine="fast", shadow_rate=0.0)
    assert dt.admission.engine.startswith("fast (fastokens")
    ref = references[name]
    texts = [t[:50_000] for t in real_texts.values()] + _sample_texts(real_texts)[:6]
    for t in texts:
        assert dt.encode(t).to_pylist() == ref.encode(t).ids


@pytest.mark.parametrize("family", ["qwen3", "o200k", "deepseek-v3"])
def test_class_verification_catches_a_wrong_candidate(family, monkeypatch):
    """Control: give the candidate table a wrong class for a few code points (a letter called a
    digit, a digit called a letter, a space called punctuation); the reference's pieces disagree and
    exactly those code points come out unverified, while their neighbours stay verified."""
    from delta_ray._core import charclass as cc
    from delta_ray._core import class_verify as cv
    from delta_ray._core.families import FAMILIES, candidate_family_table
    table = cc.class_table().copy()
    wrong = {0xE9: cc.N, 0x0663: cc.L | cc.LO, 0x2003: cc.P}  # é, ARABIC-INDIC THREE, EM SPACE
    for cp, bits in wrong.items():
        table[cp] = bits
    cps = np.array(sorted(set(range(0x20, 0x300)) | {0x0660, 0x0661, 0x0662, 0x0663, 0x0664, 0x2002, 0x2003,
                                                          0x2004, 0x4E2D, 0x4E2E}), dtype=np.uint32)
    monkeypatch.setattr(cc, "class_table", lambda: table)
    monkeypatch.setattr(cc, "all_codepoints_text", lambda: (cps.tobytes().decode("utf-32-le"), cps))
    fam_cls = candidate_family_table.__wrapped__(family)
    verified = cv.derive_verified(cv.family_stages(FAMILIES[family])[0], fam_cls)
    assert not any(verified[cp] for cp in wrong)
    assert all(verified[cp] for cp in (0xE8, 0xEA, 0x0662, 0x0664, 0x2002, 0x4E2D, ord("a"), ord("1"), ord(" ")))


def test_decode_fn_is_the_reference_decode(references, real_texts):
    """The decode that releases the GIL (a batch of one, where the reference has decode_batch) is the
    reference's decode, special tokens skipped or not; without decode_batch, decode itself."""
    class DecodeOnly:  # a reference without decode_batch
        def __init__(self, tok):
            self.decode = tok.decode
    for name, ref in references.items():
        for text in (real_texts["multilingual"][:4000], real_texts["code"][:4000], ""):
            ids = ref.encode(text).ids + ref.encode("é 日本", add_special_tokens=False).ids[:-1]  # a cut UTF-8 tail
            for skip in (True, False):
                want = ref.decode(ids, skip_special_tokens=skip)
                assert ra.decode_fn(ref)(ids, skip) == want == ra.decode_fn(DecodeOnly(ref))(ids, skip), (name, skip)
