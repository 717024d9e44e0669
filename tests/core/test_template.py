"""The one Template value (delta_ray/_core/template.py) against the reference's own post-processing.

Every form (one array, a flat batch, a session's Arrow parts, a session answer that resends only
what changed) is compared with ``encode(x, add_special_tokens=True/False).ids`` of the reference.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import exactness
from delta_ray._core.admission import Admission, admit
from delta_ray._core.assembly import flat_list_array
from delta_ray._core.loading import load_tokenizer
from delta_ray._core.template import NO_TEMPLATE, Template
from delta_ray._tokenizer_core import TokenizerCore

# llama3.2 and glm-4 add a BOS; qwen-3 adds nothing (the test fails if that ever changes unnoticed)
HAS_PREFIX = {"llama3.2": True, "glm-4": True, "qwen-3": False}
TEXTS = ["", " ", "Hello world", "  leading spaces\n\n", "naïve café 中文 😀\r\n", "x" * 300,
         "def f(a, b):\n    return a + b  # 12345\n", *exactness.ADVERSARIAL[::7]]


@pytest.fixture(scope="module", params=sorted(HAS_PREFIX))
def case(request, tokenizer_paths, references):
    name = request.param
    if name not in tokenizer_paths:
        pytest.skip(f"{name} is not loadable by the installed reference")
    ref = references[name]
    template = Template.of(admit(load_tokenizer(tokenizer_paths[name])))
    return name, ref, template


def _ids(ref, text: str, add: bool) -> list[int]:
    return ref.encode(text, add_special_tokens=add).ids


def test_template_is_the_admitted_one(case):
    name, ref, template = case
    assert bool(len(template.prefix)) == HAS_PREFIX[name]
    assert not len(template.suffix)
    assert template.when(False) is NO_TEMPLATE and template.when(True) is template
    assert not template.prefix.flags.writeable  # shared by every answer: nobody may write it


def test_apply_is_the_reference(case):
    _, ref, template = case
    for text in TEXTS + exactness.special_fragments(ref):
        raw = np.asarray(_ids(ref, text, False), dtype=np.int32)
        for add in (True, False):
            out = template.when(add).apply(raw)
            assert out.dtype == np.int32 and out.tolist() == _ids(ref, text, add), (text, add)
            assert template.when(add).count(len(raw)) == len(out)
    raw = np.arange(3, dtype=np.int32)
    assert NO_TEMPLATE.apply(raw) is raw  # no copy when there is nothing to add


def test_apply_flat_is_the_reference(case):
    _, ref, template = case
    rows = [_ids(ref, t, False) for t in TEXTS]
    values = np.asarray([i for r in rows for i in r], dtype=np.int32)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    for add in (True, False):
        out, new_offsets = template.when(add).apply_flat(values, offsets)
        assert out.dtype == np.int32 and len(out) == new_offsets[-1]
        assert flat_list_array(out, new_offsets).to_pylist() == [_ids(ref, t, add) for t in TEXTS]


@pytest.mark.parametrize("prefix,suffix", [((7,), ()), ((), (9,)), ((1, 2), (3,)), ((5,), (6, 7, 8)), ((), ())])
def test_apply_flat_wraps_every_row(prefix, suffix):
    """Templates no bundled tokenizer has (a suffix, several IDs) against wrapping each row by hand."""
    template = Template(prefix, suffix)
    rng = np.random.default_rng(3)
    for _ in range(30):
        lengths = rng.integers(0, 6, size=rng.integers(0, 12))
        values = rng.integers(0, 1000, size=int(lengths.sum())).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        out, new_offsets = template.apply_flat(values, offsets)
        want = [list(prefix) + values[a:b].tolist() + list(suffix) for a, b in zip(offsets, offsets[1:])]
        assert flat_list_array(out, new_offsets).to_pylist() == want
        assert [template.apply(values[a:b]).tolist() for a, b in zip(offsets, offsets[1:])] == want


def test_arrow_chunks_are_the_reference(case):
    _, ref, template = case
    text = TEXTS[4] + TEXTS[6]
    raw = np.asarray(_ids(ref, text, False), dtype=np.int32)
    parts = [raw[:3], raw[3:3], raw[3:]]  # an empty part is dropped, never an empty chunk
    for add in (True, False):
        chunked = template.when(add).chunked(parts)
        assert chunked.type == pa.int32() and chunked.to_pylist() == _ids(ref, text, add)
        assert all(len(c) for c in chunked.chunks)
        arrow_parts = tuple(pa.array(p, type=pa.int32()) for p in parts)
        assert pa.chunked_array(template.when(add).chunks(arrow_parts)).to_pylist() == _ids(ref, text, add)
        # a pool's splice hands Arrow chunks, none empty: the same answer without the per-part test
        spliced = tuple(a for a in arrow_parts if len(a))
        fast = template.when(add).chunked_arrays(spliced)
        assert fast.type == pa.int32() and fast.to_pylist() == _ids(ref, text, add)
        assert template.when(add).chunked_arrays(()).to_pylist() == _ids(ref, "", add)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("suffix", [(), (99, 98)])
def test_start_and_tail_splice_the_previous_answer(case, suffix):
    """A session answer that sends only what changed: the previous answer cut to ``start(k)``
    followed by ``tail(k, raw IDs from k on)`` is the reference's answer for the new text, for
    every k a repair may keep (0 included: everything resent). With a suffix, whose old copy must
    be cut off (a template no bundled tokenizer has, checked against prefix + raw + suffix)."""
    _, ref, admitted = case
    template = Template(admitted.prefix, suffix)
    old, new = "Hello there, how are", "Hello there, how are you today?\n"
    raw_old, raw_new = _ids(ref, old, False), _ids(ref, new, False)
    for add in (True, False):
        t = template.when(add)
        previous = t.apply(np.asarray(raw_old, dtype=np.int32)).tolist()
        want = t.apply(np.asarray(raw_new, dtype=np.int32)).tolist()
        if not suffix:
            assert want == _ids(ref, new, add)
        for k in range(_common(raw_old, raw_new) + 1):
            tail = t.tail(k, np.asarray(raw_new[k:], dtype=np.int32))
            assert previous[:t.start(k)] + tail.tolist() == want, (add, k)
            assert t.count(len(raw_new)) == len(want)


def test_session_delta_through_the_core(case, tokenizer_paths):
    """The same splice on TokenizerCore's own session answer (what the pool and Serve send)."""
    name, ref, _ = case
    core = TokenizerCore(tokenizer_paths[name])
    old = "The quick brown fox jumps over the lazy dog. " * 200  # past the repair-or-re-encode bound
    core.encode(old, session="s")
    state = core.sessions.store.get("s")
    version, k, tail = core.sessions.encode_session_delta("s", None, known_version=state.version, delta="And again.")
    assert k > 0  # a repair kept IDs: the delta path is what is tested
    for add in (True, False):
        t = core.template.when(add)
        previous = _ids(ref, old, add)
        got = previous[:t.start(k)] + t.tail(k, np.asarray(tail, dtype=np.int32)).tolist()
        assert got == _ids(ref, old + "And again.", add)
        assert t.count(k + len(tail)) == len(got)


def test_unadmitted_has_no_template():
    """An unadmitted configuration's reference post-processes its own encodes: nothing to add here."""
    assert Template.of(Admission(False, "refused", prefix_ids=(1,), suffix_ids=(2,))) is NO_TEMPLATE
    assert Template.of(Admission(True, "ok", prefix_ids=(1,), suffix_ids=(2,))) == Template((1,), (2,))
