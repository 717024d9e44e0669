"""The stateless planner on real text: it finds cuts, respects its bounds, and stays exact."""
from __future__ import annotations

import time

import pytest

from delta_ray import DeltaTokenizer
from delta_ray._core.planner import PlannerConfig, chunk_count
from delta_ray._core.reference_api import encode_batch_ids
from delta_ray._core.reference_version import reference_major

pytestmark = pytest.mark.battery  # the quick exactness battery (also run under tokenizers 1.x)


def test_most_long_real_texts_get_cuts_at_small_chunk_size(name, tokenizer_paths, real_texts):
    dt = DeltaTokenizer(tokenizer_paths[name], chunk_size=256, cut_threshold=256, max_chunks=1 << 20, threads=1 << 20)
    texts = []
    for src in real_texts.values():
        texts += [src[i:i + 20_000] for i in range(0, len(src) - 20_000, 7_000)]
    with_cuts = 0
    for t in texts:
        cuts = dt.cuts(t)
        with_cuts += len(cuts) > 10
        assert cuts == sorted(set(cuts)) and all(0 < c < len(t) for c in cuts)
    assert with_cuts >= 0.8 * len(texts), (with_cuts, len(texts))


def test_chunked_encode_equals_reference_on_real_text(name, tokenizer_paths, references, real_texts):
    ref = references[name]
    dt = DeltaTokenizer(tokenizer_paths[name], chunk_size=2048, cut_threshold=4096, max_chunks=16, threads=16)
    for kind, src in real_texts.items():
        text = src[:60_000]
        assert len(dt.cuts(text)) >= 8, kind
        for special in (True, False):
            assert dt.encode(text, add_special_tokens=special).to_pylist() == \
                ref.encode(text, add_special_tokens=special).ids, kind


def test_thresholds_and_counts():
    cfg = PlannerConfig()
    assert chunk_count(100_000, cfg, 8) == 1  # under cut_threshold
    assert chunk_count(1_000_000, cfg, 8) == 8
    assert chunk_count(1_000_000, cfg, 64) == 16  # max_chunks
    assert chunk_count(200_000, cfg, 64) == 4  # ceil(N / chunk_size)
    tiny = PlannerConfig(chunk_size=16, cut_threshold=1)
    assert chunk_count(255, tiny, 64) == 1  # never cut under 256 characters


def test_no_chunk_shorter_than_the_floor(tokenizer_paths, real_texts):
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], chunk_size=300, cut_threshold=256, max_chunks=1000, threads=1000)
    text = real_texts["english"][:50_000]
    cuts = [0] + dt.cuts(text) + [len(text)]
    k = min(-(-len(text) // 300), 1000)
    floor = max(16, min(1024, len(text) // (4 * k)))
    assert min(b - a for a, b in zip(cuts, cuts[1:])) >= floor


def test_unsplittable_text_is_encoded_whole(tokenizer_paths, references):
    ref = references["llama3.2"]
    dt = DeltaTokenizer(tokenizer_paths["llama3.2"], chunk_size=256, cut_threshold=256)
    text = "a" * 20_000  # one letter run: no accepted transition anywhere
    assert dt.cuts(text) == []
    assert dt.encode(text).to_pylist() == ref.encode(text).ids


@pytest.mark.skipif(reference_major() >= 1, reason="a 0.x cost ratio: the 1.x reference encodes ~100x faster "
                    "than 0.x, so planning is not a small share of it (bench/bench_tk1.py measures both)")
def test_planner_is_a_small_share_of_encode_time(tokenizer_paths, references, real_texts):
    """Planning 1M characters costs a few percent of encoding them (measured, loosely bounded)."""
    ref = references["qwen-3"]
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], threads=16)
    text = (real_texts["english"] * 8)[:1_000_000]
    t0 = time.perf_counter()
    cuts = dt.cuts(text)
    plan = time.perf_counter() - t0
    t0 = time.perf_counter()
    encode_batch_ids(ref, [text[:200_000]], False)
    enc = (time.perf_counter() - t0) * 5
    assert len(cuts) == 15
    assert plan < 0.25 * enc  # the bench reports the real share; this only catches a blow-up
