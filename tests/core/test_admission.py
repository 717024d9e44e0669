"""Admission reads the configuration; anything not covered is served by the reference alone."""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from delta_ray import DeltaTokenizer, NotAdmitted, NotAdmittedWarning, load_tokenizer
from delta_ray._core.reference_api import tokenizer_from_str


def _variant(path: str, edit) -> Tokenizer:
    cfg = json.load(open(path, encoding="utf-8"))
    edit(cfg)
    return tokenizer_from_str(json.dumps(cfg))


EDITS = {
    "prefix space": (lambda c: c["pre_tokenizer"]["pretokenizers"][-1].update(add_prefix_space=True),
                     "add_prefix_space"),
    "lookbehind regex": (lambda c: c["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex="(?<=x)\\w+|\\s+"),
                         "lookbehind"),
    "anchored regex": (lambda c: c["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex="^\\w+|\\s+"),
                       "anchor"),
    "nullable regex": (lambda c: c["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex="\\w*"),
                       "empty string"),
    "lstrip token": (lambda c: c["added_tokens"][0].update(lstrip=True), "lstrip"),
    "lowercase": (lambda c: c.update(normalizer={"type": "Lowercase"}), "normalizer"),
    "normalized token under NFC": (lambda c: c["added_tokens"][0].update(normalized=True), "non-identity normalizer"),
    "truncation": (lambda c: c.update(truncation={"direction": "Right", "max_length": 5, "strategy": "LongestFirst",
                                                  "stride": 0}), "truncation"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_not_admitted_falls_back_to_reference(edit, tokenizer_paths):
    fn, reason = EDITS[edit]
    tok = _variant(tokenizer_paths["qwen-3"], fn)
    with pytest.warns(NotAdmittedWarning, match="reference alone"):
        dt = DeltaTokenizer(tok, chunk_size=64, cut_threshold=256)
    assert not dt.admission.admitted and reason in dt.admission.reason
    with pytest.raises(NotAdmitted, match=reason.replace("(", "\\(")):
        DeltaTokenizer(tok, strict=True)
    text = "Hello   World 12345 don't\n\n" * 40
    for special in (True, False):
        assert (dt.encode(text, add_special_tokens=special).to_pylist()
                == tok.encode(text, add_special_tokens=special).ids)
    assert dt.encode(text, session="s").to_pylist() == tok.encode(text).ids
    assert dt.extend("s", " more").to_pylist() == tok.encode(text + " more").ids
    assert [a.to_pylist() for a in dt.encode_batch([text, "x"])] == [e.ids for e in tok.encode_batch([text, "x"])]
    assert dt.cuts(text) == []


def test_admission_of_the_six(tokenizer_paths):
    from delta_ray._core.reference_api import FULL_API
    kinds = {}
    for name, path in tokenizer_paths.items():
        dt = DeltaTokenizer(path, strict=True)
        assert dt.admission.admitted, dt.admission.reason
        kinds[name] = (dt.admission.guard, dt.admission.family, dt.admission.normalizer)
    if FULL_API:  # derived from the pre-tokenizer's own steps
        assert kinds["qwen-3"] == ("derived", None, "nfc")
        assert kinds["llama3.2"] == ("derived", None, None)
        assert kinds["minimax-m3"] == ("derived", None, "nfc")
    else:  # tokenizers 1.x: the hand-written families the reference confirms
        assert kinds["qwen-3"] == ("family", "qwen3", "nfc")
        assert kinds["llama3.2"] == ("family", "llama3", None)
        assert kinds["deepseek-v3"] == ("family", "deepseek-v3", None)
        assert kinds["minimax-m3"] == ("family", "o200k", "nfc")
    assert DeltaTokenizer(tokenizer_paths["llama3.2"]).admission.prefix_ids == (128000,)


def test_loading_forms(tokenizer_paths, tmp_path):
    import hashlib
    path = tokenizer_paths["glm-4"]
    a = load_tokenizer(path)
    assert a.digest == hashlib.sha256(open(path, "rb").read()).hexdigest()
    b = load_tokenizer(str(__import__("pathlib").Path(path).parent))
    assert b.digest == a.digest
    c = load_tokenizer(Tokenizer.from_file(path))
    assert c.tokenizer.encode("x y").ids == a.tokenizer.encode("x y").ids
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing.json")
    with pytest.raises(TypeError):
        load_tokenizer(42)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError):
        load_tokenizer(bad)
    with pytest.raises(ValueError):
        DeltaTokenizer(path, reuse="sometimes")


@pytest.mark.parametrize("padding, admitted", [
    ({"strategy": "BatchLongest", "direction": "Left", "pad_to_multiple_of": None, "pad_id": 0, "pad_type_id": 0,
      "pad_token": "!"}, True),
    ({"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": 8, "pad_id": 0, "pad_type_id": 0,
      "pad_token": "!"}, False),
    ({"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0, "pad_type_id": 0,
      "pad_token": "!"}, False),
])
def test_padding_is_admitted_where_it_cannot_change_one_text(padding, admitted, tokenizer_paths, tmp_path):
    """Padding to a batch's longest leaves one text's encode as it is: admitted, and no batch of pieces
    or of texts is padded; a fixed length or a multiple changes a one-text encode: refused."""
    cfg = json.load(open(tokenizer_paths["qwen-3"], encoding="utf-8"))
    cfg["padding"] = padding
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    ref = Tokenizer.from_file(str(path))
    text = "Hello   World 12345 don't\n\n" * 400
    for given in (str(path), ref):
        dt = DeltaTokenizer(given, chunk_size=64, cut_threshold=256, strict=admitted)
        assert dt.admission.admitted is admitted, dt.admission.reason
        assert dt.encode(text).to_pylist() == ref.encode(text).ids
        assert dt.encode(text, session="s").to_pylist() == ref.encode(text).ids
        assert [a.to_pylist() for a in dt.encode_batch([text, "x"])] == [ref.encode(t).ids for t in (text, "x")]
        if admitted:
            assert dt.cuts(text)
