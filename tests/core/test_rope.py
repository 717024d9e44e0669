"""The rope's merge policy (delta_ray/_core/rope.py): one rule, :func:`merge_start`, applied to text
parts, ID parts and the compact turn's Arrow chunks alike."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from delta_ray._core.rope import (
    MERGE_IDS_BELOW,
    MERGE_TEXT_BELOW,
    YOUNG_PARTS,
    merge_id_parts,
    merge_start,
    merge_text_parts,
    rope_common_prefix,
)
from delta_ray._core.turn_path import merge_chunks


def stepwise(sizes: list[int], small: int) -> list[int]:
    """The policy as first written (join the young parts, then the binary counter's pairs, one join
    at a time), on sizes: the oracle the one-index form must reproduce."""
    parts = [s for s in sizes if s]
    young = 0
    while young < len(parts) and parts[-1 - young] < small:
        young += 1
    if young >= YOUNG_PARTS:
        parts[-young:] = [sum(parts[-young:])]
    elif young:
        return parts
    while len(parts) >= 2 and parts[-2] <= 2 * parts[-1]:
        parts[-2:] = [parts[-2] + parts[-1]]
    return parts


sizes_st = st.lists(st.one_of(st.integers(1, 40), st.integers(1, 20_000)), max_size=24)


@settings(max_examples=400, deadline=None)
@given(sizes_st, st.sampled_from([16, MERGE_TEXT_BELOW]))
def test_one_index_is_the_stepwise_policy(sizes, small):
    j = merge_start(sizes, small)
    got = sizes if j >= len(sizes) - 1 else sizes[:j] + [sum(sizes[j:])]
    assert got == stepwise(sizes, small)


@settings(max_examples=200, deadline=None)
@given(sizes_st)
def test_text_ids_and_arrow_chunks_merge_alike(sizes):
    """The three ropes of one session keep the same shape: joined parts hold exactly the joined
    elements, in order."""
    rng = np.random.default_rng(len(sizes))
    ids = [rng.integers(0, 1000, s, dtype=np.int32) for s in sizes]
    merged = merge_id_parts(ids)
    assert [len(p) for p in merged] == stepwise(sizes, MERGE_IDS_BELOW)
    assert np.array_equal(np.concatenate(merged) if merged else np.zeros(0, np.int32),
                          np.concatenate(ids) if ids else np.zeros(0, np.int32))
    chunks, lens, joined = merge_chunks(tuple(pa.array(p) for p in ids), tuple(sizes))
    assert list(lens) == [len(c) for c in chunks] == stepwise(sizes, MERGE_IDS_BELOW)
    assert joined == (len(chunks) != len(sizes))
    assert pa.chunked_array(chunks, type=pa.int32()).to_numpy().tolist() == \
        (np.concatenate(ids).tolist() if ids else [])
    texts = ["".join(chr(97 + (i + k) % 26) for k in range(s)) for i, s in enumerate(sizes)]
    merged_text = merge_text_parts(texts)
    assert [len(p) for p in merged_text] == stepwise(sizes, MERGE_TEXT_BELOW)
    assert "".join(merged_text) == "".join(texts)


def test_joined_chunks_come_from_the_c_allocator():
    """A compact turn's join allocates outside pyarrow's default pool (mimalloc on Linux, whose
    huge-page arenas made one turn in 25-100 fault a fresh 2 MB page: 5-9 ms of kernel time)."""
    default = pa.default_memory_pool()
    chunks = tuple(pa.array(np.arange(i * 100, i * 100 + 50, dtype=np.int32)) for i in range(YOUNG_PARTS + 2))
    before = default.bytes_allocated()
    joined_chunks, _, joined = merge_chunks(chunks, tuple(len(c) for c in chunks))
    assert joined
    assert default.bytes_allocated() == before
    assert pa.chunked_array(joined_chunks).to_pylist() == pa.chunked_array(chunks).to_pylist()


def test_appends_stay_shallow():
    """A session's life of small appends: O(log n) + YOUNG_PARTS parts."""
    parts: tuple = ()
    for _ in range(5000):
        parts = merge_text_parts(parts + ("x" * 1300,))
        assert len(parts) <= 2 * np.log2(sum(map(len, parts))) + YOUNG_PARTS


def test_arrow_parts_reuse_only_what_they_show():
    """A kept part reuses its Arrow array, a prefix view its zero-copy slice; a view of the same
    memory that is not its prefix (another offset, another stride) is wrapped anew: every chunk
    shows exactly its part (the pool's mirror gets tails from transports that may share memory)."""
    from delta_ray._core.session_store import arrow_parts

    owner = np.arange(1000, dtype=np.int32)
    old = (owner[:600], owner[600:])
    old_chunks = arrow_parts(old)
    new = (old[0], owner[600:700], owner[601:650], owner[600:900:2][:10], np.arange(5, dtype=np.int32))
    olds = old + (owner[600:], owner[600:], owner[600:])  # the same owner at every index
    chunks = arrow_parts(new, olds, old_chunks + (old_chunks[1],) * 3)
    assert chunks[0] is old_chunks[0]
    for p, c in zip(new, chunks):
        assert c.to_numpy().tolist() == p.tolist()


@settings(max_examples=300, deadline=None)
@given(sizes_st, st.integers(0, 10**9), st.integers(0, 3000))
def test_a_splice_is_the_general_route_in_one_walk(sizes, at, tail_len):
    """``splice_arrow`` (the pool's splice of a worker's answer) gives the parts the general route
    gives (``merge_id_parts`` of the kept prefix plus the tail) and chunks that show them: a kept
    part keeps its array, the cut one a zero-copy slice of its array (the same buffer), the tail and
    any joined part their own; an answer that keeps more IDs than the rope holds is refused."""
    import pytest

    from delta_ray._core.rope import prefix_parts
    from delta_ray._core.session_store import arrow_parts, splice_arrow

    rng = np.random.default_rng(len(sizes) * 7 + tail_len)
    parts = merge_id_parts([rng.integers(0, 1000, s, dtype=np.int32) for s in sizes])
    chunks = arrow_parts(parts)
    total = sum(map(len, parts))
    k = at % (total + 1)
    tail = rng.integers(0, 1000, tail_len, dtype=np.int32)
    got_parts, got_chunks = splice_arrow(parts, chunks, k, tail)
    want = merge_id_parts(list(prefix_parts(parts, k)) + [tail])
    assert [len(p) for p in got_parts] == [len(p) for p in want]
    assert all(np.array_equal(a, b) for a, b in zip(got_parts, want))
    assert len(got_chunks) == len(got_parts)
    for p, c in zip(got_parts, got_chunks):
        assert c.to_numpy().tolist() == p.tolist()
    for i, (p, c) in enumerate(zip(got_parts, got_chunks)):
        if i < len(parts) and p is parts[i]:
            assert c is chunks[i]
        elif i < len(parts) and p.base is not None and p.base is (parts[i].base if parts[i].base is not None
                                                                    else parts[i]) and len(p) < len(parts[i]):
            assert c.buffers()[1].address == chunks[i].buffers()[1].address  # the slice, not a copy
    # chunks that are not the parts' own are not reused, and an empty part is dropped as the merge
    # rule drops it: the same parts as the general route, chunks that show them
    holey = parts[:1] + (np.zeros(0, np.int32),) + parts[1:]
    for args in ((parts, chunks[:-1]), (holey, arrow_parts(holey))):
        again_parts, again_chunks = splice_arrow(*args, k, tail)
        assert [p.tolist() for p in again_parts] == [p.tolist() for p in want]
        assert [c.to_numpy().tolist() for c in again_chunks] == [p.tolist() for p in want]
    with pytest.raises(ValueError):
        splice_arrow(parts, chunks, total + 1, tail)


def _naive_common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 40_000), st.lists(st.integers(0, 40_000), max_size=6), st.integers(0, 41_000),
       st.sampled_from(["change", "cut", "extend", "same"]), st.sampled_from("ab\u017f\U0001F600"))
def test_rope_common_prefix_is_the_common_prefix(n, splits, at, how, ch):
    """The rope's common prefix with a text (the session turn's divergence point): the characters
    compared in place, the part where they differ searched by blocks of 4K doubling, then halved;
    equal to a character-by-character count for every place of the difference, in short and long
    parts, in texts shorter and longer than the rope, and with characters of every width."""
    base = "".join(chr(97 + (i * 7919 % 23)) for i in range(n))
    bounds = sorted({0, n, *(min(s, n) for s in splits)})
    parts = tuple(base[x:y] for x, y in zip(bounds, bounds[1:]))
    at = min(at, n)
    other = {"change": base[:at] + ch + base[at + 1:], "cut": base[:at], "extend": base + ch * 3,
             "same": base}[how]
    assert rope_common_prefix(parts, other) == _naive_common_prefix(base, other)
