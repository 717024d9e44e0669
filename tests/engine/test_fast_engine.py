"""The fast encoder tier: FastEncoder equals the reference (add_special_tokens=False) on every bundled tokenizer."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from delta_ray._core.encoder import Encoder
from delta_ray._engine.native import (
    DEFAULT_BACKEND,
    FAST_BACKENDS,
    FastEncoder,
    FastEngineUnavailable,
    available_backends,
    cached_fast_encoder,
    fast_engine_versions,
)
from delta_ray._verify.guard_battery import adversarial_battery, verify_fast_engine
from delta_ray.apps.bundled import TEST_TOKENIZERS, BundledTokenizerError, bundled_tokenizer_path

tokenizers = pytest.importorskip("tokenizers")


def _backend_param(name):
    missing = importlib.util.find_spec(name) is None
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=f"{name} is not installed (pip install {name})"))


BACKENDS = [_backend_param(b) for b in FAST_BACKENDS]


@pytest.fixture(scope="module")
def tokenizer_paths():
    out = {}
    for name in TEST_TOKENIZERS:
        try:
            out[name] = bundled_tokenizer_path(name)
        except BundledTokenizerError as exc:
            pytest.skip(str(exc))
    return out


@pytest.fixture(scope="module")
def references(tokenizer_paths):
    return {name: tokenizers.Tokenizer.from_file(p) for name, p in tokenizer_paths.items()}


def _battery_cases():
    # the default engine on every tokenizer; the other engine on two of them (all six in the slow tier)
    for backend in BACKENDS:
        name_b = backend.values[0]
        for name in TEST_TOKENIZERS:
            marks = list(backend.marks)
            if name_b != DEFAULT_BACKEND and name not in ("qwen-3", "deepseek-v3"):
                marks.append(pytest.mark.slow)
            yield pytest.param(name, name_b, marks=marks, id=f"{name}-{name_b}")


@pytest.mark.parametrize(("name", "backend"), list(_battery_cases()))
def test_fast_encoder_equals_reference_on_adversarial_battery(name, backend, tokenizer_paths, references):
    fast = cached_fast_encoder(tokenizer_paths[name], backend)
    assert fast.backend == backend and fast.name == "fast"
    assert isinstance(fast, Encoder)
    ref = references[name]
    if backend == "gigatoken":
        # gigatoken's Unicode tables are not the reference's: judge it where its guard lets it work
        from delta_ray._engine.guard import GuardSet
        from delta_ray._verify.guard_battery import ALPHABETS as _ALPHABETS
        recent = {ord(ch) for s in _ALPHABETS["recent"] for ch in s}
        ok, reason = verify_fast_engine(ref, fast, guard=GuardSet(frozenset(recent)))
    else:
        ok, reason = verify_fast_engine(ref, fast)
    assert ok, f"{name}/{backend}: {reason}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_encode_pieces_contract(backend, tokenizer_paths, references):
    path = tokenizer_paths["qwen-3"]
    fast = cached_fast_encoder(path, backend)
    texts = ["Hello, world!", "", "<|im_end|>x<|im_start|>", "naïve café\r\n\n  x", "日本語 123"]
    out = fast.encode_pieces(texts)
    assert len(out) == len(texts)
    for t, ids in zip(texts, out):
        assert isinstance(ids, np.ndarray) and ids.dtype == np.int32 and ids.ndim == 1
        assert ids.tolist() == references["qwen-3"].encode(t, add_special_tokens=False).ids
    out[0][0] = out[0][0]  # writable
    assert fast.encode_pieces([]) == []
    assert fast.encode("").shape == (0,)
    with pytest.raises(ValueError):
        fast.encode_pieces(["ok", "bad \ud800 surrogate"])
    # a path and its bytes name the same engine (both are loaded from the bytes, keyed by digest)
    with open(path, "rb") as fh:
        assert cached_fast_encoder(fh.read(), backend) is fast


def test_auto_picks_the_default_backend(tokenizer_paths):
    avail = available_backends()
    if not avail:
        pytest.skip("no fast engine installed")
    fast = cached_fast_encoder(tokenizer_paths["qwen-3"])
    assert fast.backend == avail[0]
    if DEFAULT_BACKEND in avail:
        assert fast.backend == DEFAULT_BACKEND
    assert fast.backend_version == fast_engine_versions()[fast.backend]
    assert fast.digest in fast.cache_key and fast.backend in fast.cache_key


def test_unavailable_reasons(tokenizer_paths, monkeypatch):
    with pytest.raises(FastEngineUnavailable) as exc:
        FastEncoder(b'{"version": "1.0"}', "auto")
    assert "model" in exc.value.reason
    with pytest.raises(FastEngineUnavailable):
        FastEncoder("/nonexistent/tokenizer.json")
    with pytest.raises(ValueError):
        FastEncoder(tokenizer_paths["qwen-3"], "sentencepiece")
    for name in FAST_BACKENDS:  # a missing package reads as unavailable, naming the package
        monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.setitem(sys.modules, f"{name}.gigatoken_rs", None)
    with pytest.raises(FastEngineUnavailable) as exc:
        FastEncoder(tokenizer_paths["qwen-3"], "auto")
    for name in FAST_BACKENDS:
        assert name in exc.value.reason


def test_versions_for_cache_keys():
    v = fast_engine_versions()
    assert set(v) == {"tokenizers", *FAST_BACKENDS}
    assert v["tokenizers"] == tokenizers.__version__


def test_battery_catches_a_wrong_engine(tokenizer_paths, references):
    avail = available_backends()
    if not avail:
        pytest.skip("no fast engine installed")
    fast = cached_fast_encoder(tokenizer_paths["llama3.2"], avail[0])

    class OffByOne:
        name = "fast"

        def encode_pieces(self, texts):
            out = fast.encode_pieces(texts)
            return [ids + 1 if "\u0958" in t else ids for t, ids in zip(texts, out)]

    ok, reason = verify_fast_engine(references["llama3.2"], OffByOne())
    assert not ok and "differs" in reason
    battery = adversarial_battery(references["llama3.2"])
    assert any("<|eot_id|>" in t for t in battery) and any("\r\n" in t for t in battery)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
@pytest.mark.skipif(importlib.util.find_spec("fastokens") is None, reason="fastokens is not installed")
def test_fastokens_runs_on_the_calling_thread(tokenizer_paths):
    """With FASTOKENS_BPE_THREADS unset, importing engine.native pins fastokens' pool to one thread."""
    code = textwrap.dedent(f"""
        import os
        from delta_ray._engine.native import FastEncoder
        assert os.environ["FASTOKENS_BPE_THREADS"] == "1"
        fast = FastEncoder({tokenizer_paths["qwen-3"]!r}, "fastokens")
        before = len(os.listdir("/proc/self/task"))
        text = "Some text to encode, long enough to split. " * 20000
        fast.encode_pieces([text, text[:70000], text[:1000]] * 3)
        print(before, len(os.listdir("/proc/self/task")))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTOKENS_")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    before, after = map(int, res.stdout.split())
    assert after == before, f"fastokens started {after - before} thread(s)"


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_may_share_one_engine(backend, tokenizer_paths):
    """One engine per process serves every thread (fastokens drops the GIL while it encodes)."""
    from concurrent.futures import ThreadPoolExecutor

    fast = cached_fast_encoder(tokenizer_paths["qwen-3"], backend)
    texts = [f"thread text {i}: naïve café 日本語 {'x' * (i % 50)} <|im_end|>\n" * (1 + i % 40) for i in range(200)]
    want = [ids.tolist() for ids in fast.encode_pieces(texts)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda t: fast.encode(t).tolist(), texts))
    assert got == want
