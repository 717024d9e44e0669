"""The user's facade: a small surface over TokenizerCore, every answer the reference's."""
from __future__ import annotations

import inspect

import pytest
import tokenizers

from delta_ray import DeltaTokenizer, SessionNotFound
from delta_ray._tokenizer_core import TokenizerCore

USER_SURFACE = {"encode", "extend", "encode_batch", "decode", "cuts", "drop_session", "admission", "digest",
                "config", "stats", "core"}


def test_the_facade_is_small():
    public = {n for n, _ in inspect.getmembers(DeltaTokenizer) if not n.startswith("_")}
    assert public == USER_SURFACE
    assert len(public) <= 12


def test_facade_answers_equal_the_reference(tokenizer_paths):
    path = tokenizer_paths["llama3.2"]
    ref = tokenizers.Tokenizer.from_file(path)
    dt = DeltaTokenizer(path, chunk_size=4096, cut_threshold=8192, threads=2)
    assert isinstance(dt.core, TokenizerCore)
    long_text = "The quick brown fox, 123 times: jumps!\n" * 600
    for flag in (True, False):
        assert (dt.encode(long_text, add_special_tokens=flag).to_pylist()
                == ref.encode(long_text, add_special_tokens=flag).ids)
    assert dt.cuts(long_text)  # long enough to be cut
    turn = "User: hello there\n"
    assert dt.encode(turn, session="s").to_pylist() == ref.encode(turn).ids
    assert dt.extend("s", "Assistant: hi!\n").to_pylist() == ref.encode(turn + "Assistant: hi!\n").ids
    texts = ["a b c", long_text[:5000], ""]
    assert [a.to_pylist() for a in dt.encode_batch(texts)] == [e.ids for e in ref.encode_batch(texts)]
    ids = ref.encode("hello world").ids
    assert dt.decode(ids) == ref.decode(ids)
    assert dt.drop_session("s") and not dt.drop_session("s")
    with pytest.raises(SessionNotFound):
        dt.extend("s", "more")
    assert dt.digest == dt.core.digest and dt.admission.admitted and dt.config.chunk_size == 4096
    assert dt.stats is dt.core.stats and dt.stats["chunked"] >= 1


def test_a_session_named_like_a_content_entry_keeps_its_own_text(tokenizer_paths):
    """With content reuse on, keyless conversations live in the same store as sessions: a user's
    session named like one ("content:0", or the conversation's very store key) must neither be
    replaced by a keyless text nor extend it."""
    path = tokenizer_paths["qwen-3"]
    ref = tokenizers.Tokenizer.from_file(path)
    dt = DeltaTokenizer(path, reuse="content", engine="reference")
    mine = "My own conversation. " * 300
    other = "Somebody else's keyless prompt, long enough to be indexed by content. " * 200
    assert dt.encode(other).to_pylist() == ref.encode(other).ids  # a keyless conversation
    choice = dt.core.sessions.choose_keyless(other)
    assert choice is not None and not choice.new  # the held conversation's store key
    for name in ("content:0", choice.key):
        assert dt.encode(mine, session=name).to_pylist() == ref.encode(mine).ids
    for name in ("content:0", choice.key):
        assert dt.extend(name, " More.").to_pylist() == ref.encode(mine + " More.").ids
    assert dt.encode(other + " Again.").to_pylist() == ref.encode(other + " Again.").ids
    assert dt.stats["content_hit"] == 1  # the conversation was not replaced by the session's text


@pytest.mark.parametrize("bad", ["false", "", 0, 1, None, 1.0])
def test_add_special_tokens_must_be_a_bool(tokenizer_paths, bad):
    """The reference raises TypeError for a non-bool flag; accepting the string "false" added the BOS."""
    import numpy as np
    path = tokenizer_paths["llama3.2"]
    ref = tokenizers.Tokenizer.from_file(path)
    with pytest.raises(TypeError):
        ref.encode("x", add_special_tokens=bad)
    dt = DeltaTokenizer(path)
    dt.encode("hello", session="s")
    for call in (lambda: dt.encode("hello", add_special_tokens=bad),
                 lambda: dt.encode("hello", session="s", add_special_tokens=bad),
                 lambda: dt.extend("s", " x", add_special_tokens=bad),
                 lambda: dt.encode_batch(["a"], add_special_tokens=bad),
                 lambda: dt.decode([1, 2], skip_special_tokens=bad)):
        with pytest.raises(TypeError, match="must be bool"):
            call()
    # numpy's bool is a bool to the reference too
    assert dt.encode("hello", add_special_tokens=np.bool_(False)).to_pylist() == \
        ref.encode("hello", add_special_tokens=np.bool_(False)).ids


def test_decode_says_what_is_wrong(tokenizer_paths):
    """decode([-1]) was an OverflowError and decode(['a']) a ValueError from int(): the error now
    names the position and what it holds; valid IDs decode as the reference does."""
    import numpy as np
    import pyarrow as pa
    path = tokenizer_paths["llama3.2"]
    ref = tokenizers.Tokenizer.from_file(path)
    dt = DeltaTokenizer(path)
    for bad, error, words in (([-1], ValueError, "position 0 holds -1"), ([5, 2 ** 32], ValueError, "position 1"),
                              (["a"], TypeError, "position 0 holds a str"), ([1.0], TypeError, "float"),
                              ("abc", TypeError, "not str"), ([[1], [2, 3]], TypeError, "flat")):
        with pytest.raises(error, match=words):
            dt.decode(bad)
    ids = ref.encode("Hello, world! 123").ids
    for form in (ids, tuple(ids), np.array(ids, np.int64), pa.array(ids, pa.int32()), []):
        assert dt.decode(form) == ref.decode(list(form))


@pytest.mark.parametrize("admitted", [True, False])
def test_one_return_type_per_call(tokenizer_paths, admitted):
    """A stateless answer is an Int32Array and a session answer a ChunkedArray, on an admitted
    configuration and on one the reference serves alone (its session answers are one chunk)."""
    import json

    import pyarrow as pa

    from delta_ray._core.reference_api import tokenizer_from_str
    cfg = json.loads(open(tokenizer_paths["llama3.2"], encoding="utf-8").read())
    if not admitted:
        cfg["normalizer"] = {"type": "Lowercase"}  # not covered by the exactness argument
    ref = tokenizer_from_str(json.dumps(cfg))
    dt = DeltaTokenizer(ref, cut_threshold=8192)
    assert bool(dt.admission) is admitted
    text = "Hello There, a turn of a chat.\n" * 20
    got = dt.encode(text)
    assert type(got) is pa.Int32Array and got.to_pylist() == ref.encode(text).ids
    got = dt.encode(text, session="s")
    assert type(got) is pa.ChunkedArray and got.to_pylist() == ref.encode(text).ids
    got = dt.extend("s", " More.", add_special_tokens=False)
    assert type(got) is pa.ChunkedArray and got.to_pylist() == ref.encode(text + " More.", add_special_tokens=False).ids
