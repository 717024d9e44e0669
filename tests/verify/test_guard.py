"""The guard: probe isolation, disagreement detection, GuardSet.allows, the on-disk cache."""
from __future__ import annotations

import importlib.util
import json
import os
import time

import numpy as np
import pytest

from delta_ray._core.encoder import Encoder, ReferenceEncoder
from delta_ray._engine.engine import Engine, FastTier
from delta_ray._engine.guard import GuardSet
from delta_ray._engine.native import cached_fast_encoder
from delta_ray._verify.guard_battery import verify_fast_engine
from delta_ray._verify.guard_probe import (
    CONTEXTS,
    _pick_separator,
    check_probe_isolation,
    guard_set_for,
    probe_disagreements,
)
from delta_ray.apps.bundled import (
    TEST_TOKENIZERS,
    BundledTokenizerError,
    bundled_tokenizer_json,
    bundled_tokenizer_path,
)

tokenizers = pytest.importorskip("tokenizers")
HAS_GIGATOKEN = importlib.util.find_spec("gigatoken") is not None
HAS_FASTOKENS = importlib.util.find_spec("fastokens") is not None


@pytest.fixture(scope="module")
def bundled():
    out = {}
    for name in TEST_TOKENIZERS:
        try:
            out[name] = (bundled_tokenizer_json(name), bundled_tokenizer_path(name))
        except BundledTokenizerError as exc:
            pytest.skip(str(exc))
    return out


pytestmark = pytest.mark.usefixtures("private_cache")  # a fresh admission cache per test


# ---------------------------------------------------------------------------------------------
# GuardSet.allows
# ---------------------------------------------------------------------------------------------

def test_allows_ascii_and_non_ascii():
    g = GuardSet(frozenset({0x1AEB, 0x16D67, 0x0899, 0x0898}))
    assert g.allows("")
    assert g.allows("plain ascii text, code(); 123\r\n")
    assert g.allows("naïve café 日本語 👨‍👩‍👧")
    assert g.allows("\U00016d66 neighbours \u089a \u1aea")
    assert not g.allows("a\u1aeb")
    assert not g.allows("x" * 10000 + "\U00016d67")
    assert not g.allows("\u0898")
    assert g.first_guarded("ab\u0899c") == 2 and g.first_guarded("abc") is None
    assert "\u0899" in g and 0x0899 in g and "a" not in g and len(g) == 4
    assert g.ranges() == [(0x0898, 0x0899), (0x1AEB, 0x1AEB), (0x16D67, 0x16D67)]


def test_allows_agrees_with_membership_in_every_str_kind():
    """allows(t) is exactly 'no code point of t is guarded', whatever CPython's storage of t (ASCII,
    Latin-1, UCS-2, UCS-4), for guards with BMP, astral, surrogate and regex-special code points."""
    import random
    rng = random.Random(5)
    pools = [range(0x20, 0x7F), range(0x80, 0x100), range(0x100, 0xD800), range(0xD800, 0xE000),
             range(0xE000, 0x10000), range(0x10000, 0x110000)]
    for trial in range(60):
        guarded = frozenset(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 12))) | (
            frozenset({ord("]"), ord("-"), ord("^"), ord("\\")}) if trial % 3 == 0 else frozenset())
        g = GuardSet(guarded)
        for _ in range(40):
            kinds = pools[:rng.randint(1, len(pools))]
            text = "".join(chr(rng.choice(rng.choice(kinds))) for _ in range(rng.randint(0, 30)))
            if rng.random() < 0.3:
                text += chr(rng.choice(sorted(guarded)))
            assert g.allows(text) == (not any(ord(c) in guarded for c in text)), (sorted(guarded), text)


def test_allows_empty_and_ascii_guards():
    empty = GuardSet(frozenset())
    assert empty.allows("anything \U0010ffff")
    g = GuardSet(frozenset({ord("\r"), ord("]"), ord("-"), ord("^"), ord("\\"), 0}))
    assert g.allows("abc") and g.allows("é")
    for bad in ("a\rb", "x]", "-", "^", "\\", "\x00", "é\r"):
        assert not g.allows(bad), repr(bad)


def test_allows_is_cheap_relative_to_encoding():
    g = GuardSet(frozenset(range(0x31350, 0x323B0)) | frozenset({0x1AEB, 0x0899, 0xA7CF}))
    text = ("Москва 日本語 naïve café, ελληνικά, हिन्दी " * 25000)[:1_000_000]
    ref = tokenizers.Tokenizer.from_file(bundled_tokenizer_path("qwen-3"))
    t = time.perf_counter()
    ref.encode(text[:200_000], add_special_tokens=False)
    encode_per_mb = (time.perf_counter() - t) * 5
    t = time.perf_counter()
    for _ in range(5):
        assert g.allows(text)
    per_mb = (time.perf_counter() - t) / 5
    # Relative, not absolute (a shared machine): the check is a small fraction of an encode.
    assert per_mb < 0.1 * encode_per_mb, f"allows() {per_mb * 1e3:.1f} ms vs encode {encode_per_mb * 1e3:.1f} ms per 1M"
    ascii_text = "x" * 1_000_000
    t = time.perf_counter()
    ascii_text.encode("utf-32-le")  # one linear pass over the text, for scale
    one_pass = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(1000):
        g.allows(ascii_text)
    assert time.perf_counter() - t < one_pass  # O(1): the string's own ASCII flag, not a scan


# ---------------------------------------------------------------------------------------------
# Probe isolation and detection
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TEST_TOKENIZERS)
def test_separator_isolates_probes(name, bundled):
    data, path = bundled[name]
    ref = tokenizers.Tokenizer.from_file(path)
    cfg = json.loads(data)
    sep, sep_id = _pick_separator(cfg)
    assert ref.encode(sep, add_special_tokens=False).ids == [sep_id]
    sample = [0x41, 0x61, 0x31, 0x20, 0x0A, 0x0D, 0x27, 0x301, 0xE9, 0x958, 0x1100, 0x1161, 0xAC00, 0x4E2D,
              0x3042, 0x1F600, 0x200D, 0x1AEB, 0x16D67, 0x31350, 0xE0041, 0x10FFFF, 0xA0, 0x3000, 0x2028]
    probes = [tmpl.format(c=chr(c)) for tmpl in CONTEXTS for c in sample]
    probes += ["\u1100\u1161", "a\u0915\u093c\u0301", "\U00016d67\U00016d67"]
    assert check_probe_isolation(ref, cfg, probes)


def test_probe_finds_a_planted_disagreement(bundled):
    """A wrong engine (the reference, plus one stray ID after every probe holding U+00E9) is caught on exactly it."""
    data, path = bundled["qwen-3"]
    cfg = json.loads(data)
    ref = tokenizers.Tokenizer.from_file(path)
    ref_enc = ReferenceEncoder(ref)
    sep, sep_id = _pick_separator(cfg)

    def planted(texts):
        out = []
        for t in texts:
            pieces = t.split(sep)
            ids: list[int] = []
            for i, (piece, got) in enumerate(zip(pieces, ref_enc.encode_pieces(pieces))):
                if i:
                    ids.append(sep_id)
                ids += got.tolist() + ([0] if "\u00e9" in piece else [])
            out.append(np.array(ids, dtype=np.int32))
        return out

    res = probe_disagreements(ref, planted, cfg, code_points=range(0xC0, 0x180))
    assert res.disagreeing == {0xE9}
    assert res.differing_chunks >= 1 and res.probes > 2 * 0xC0


@pytest.mark.skipif(not HAS_GIGATOKEN, reason="gigatoken is not installed")
def test_guard_catches_a_real_disagreement(bundled):
    """gigatoken composes Kirat Rai U+16D67 U+16D67 (Unicode 16 NFC); the reference's NFC (9.0) does not.

    FastEncoder alone differs from the reference; the guard derived by the probe rejects texts holding
    the code point, and the guarded encoder returns the reference's IDs.
    """
    data, path = bundled["qwen-3"]
    ref = tokenizers.Tokenizer.from_file(path)
    fast = cached_fast_encoder(data, "gigatoken")
    text = "Kirat Rai: \U00016d67\U00016d67 and a mark a\u1aeb\u0301."
    want = ref.encode(text, add_special_tokens=False).ids
    assert fast.encode(text).tolist() != want  # the engine alone is wrong here

    guard = guard_set_for(data, fast, ref_tokenizer=ref,
                          code_points=list(range(0x16D40, 0x16D80)) + list(range(0x1AB0, 0x1B00)))
    assert 0x16D67 in guard and 0x1AEB in guard
    assert not guard.allows(text)
    assert guard.allows("Kirat Rai is not here: ok")
    enc = FastTier(fast, guard)
    engine = Engine(ReferenceEncoder(ref))
    engine.use(enc, "the guarded tier (test)")
    assert isinstance(engine, Encoder)
    out = engine.encode_pieces([text, "plain", "café"])
    assert out[0].tolist() == want
    assert out[1].tolist() == ref.encode("plain", add_special_tokens=False).ids
    assert enc.fallback_texts == 1 and enc.fast_texts == 2
    ok, reason = verify_fast_engine(ref, fast, [text])
    assert not ok
    ok, reason = verify_fast_engine(ref, fast, [text], guard=guard)
    assert ok or "recent" not in reason


@pytest.mark.skipif(not HAS_FASTOKENS, reason="fastokens is not installed")
def test_fastokens_agrees_on_recent_unicode(bundled):
    """The default engine shares the reference's tables where gigatoken's differ (no guarded code point)."""
    data, path = bundled["qwen-3"]
    ref = tokenizers.Tokenizer.from_file(path)
    fast = cached_fast_encoder(data, "fastokens")
    res = probe_disagreements(ref, fast, json.loads(data),
                              code_points=list(range(0x16D40, 0x16D80)) + list(range(0x1AB0, 0x1B00)))
    assert res.disagreeing == set()


def test_guard_cache_roundtrip(bundled, tmp_path):
    data, path = bundled["llama3.2"]
    try:
        fast = cached_fast_encoder(data)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no fast engine: {exc}")
    cps = range(0x300, 0x380)
    g1 = guard_set_for(data, fast, code_points=cps)
    assert g1.stats["cached"] is False
    g2 = guard_set_for(data, fast, code_points=cps)
    assert g2.stats["cached"] is True and g2.code_points == g1.code_points and g2.key == g1.key
    files = list((tmp_path / "cache" / "guard").glob("guardset-*.json"))
    assert len(files) == 1
    assert list((tmp_path / "cache" / "guard").glob("refdigests-*.json"))  # the reference's digests, for re-probes
    doc = json.loads(files[0].read_text())
    assert doc["key"]["tokenizer_sha256"] == g1.key["tokenizer_sha256"]
    assert doc["payload"]["ranges_sha256"]  # the guard set is bound to its own digest
    assert doc["key"]["backend"] == fast.backend and doc["key"]["backend_version"] == fast.backend_version
    # another subset is another key
    g3 = guard_set_for(data, fast, code_points=range(0x380, 0x390))
    assert g3.stats["cached"] is False and g3.key != g1.key


def test_recorded_reference_digests_skip_the_reference(bundled):
    """A second probe of the same tokenizer runs the reference only where the engine's IDs differ."""
    data, path = bundled["llama3.2"]
    try:
        fast = cached_fast_encoder(data)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no fast engine: {exc}")
    ref = tokenizers.Tokenizer.from_file(path)
    digests: dict = {}
    cps = range(0x2000, 0x2100)
    first = probe_disagreements(ref, fast, json.loads(data), code_points=cps, ref_digests=digests)
    assert first.reference_chunks == first.chunks and len(digests) == first.chunks
    second = probe_disagreements(ref, fast, json.loads(data), code_points=cps, ref_digests=digests)
    assert second.disagreeing == first.disagreeing
    assert second.reference_chunks == first.differing_chunks


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("guard-cache")


@pytest.mark.slow
@pytest.mark.parametrize("backend", [
    pytest.param("fastokens", marks=pytest.mark.skipif(not HAS_FASTOKENS, reason="no fastokens")),
    pytest.param("gigatoken", marks=pytest.mark.skipif(not HAS_GIGATOKEN, reason="no gigatoken"))])
@pytest.mark.parametrize("name", TEST_TOKENIZERS)
def test_full_guard_probe(name, backend, bundled, shared_cache, monkeypatch):
    """Every code point, every context; the guarded engine passes the battery.

    The second engine probed on a tokenizer reuses the reference's recorded chunk digests (one cache
    for the module; test_recorded_reference_digests_skip_the_reference checks that reuse whatever
    order the tests run in). The probe's wall and CPU time are printed, not asserted: absolute
    times on a shared machine are noise (the first probe of a tokenizer took 116 s of CPU idle and
    139-216 s under load).
    """
    monkeypatch.setenv("DELTA_RAY_CACHE", str(shared_cache))
    data, path = bundled[name]
    ref = tokenizers.Tokenizer.from_file(path)
    fast = cached_fast_encoder(data, backend)
    t, cpu = time.perf_counter(), time.process_time()
    guard = guard_set_for(data, fast, ref_tokenizer=ref)
    elapsed, cpu = time.perf_counter() - t, time.process_time() - cpu
    print(f"{name}/{backend}: {len(guard)} guarded code points, probe {elapsed:.1f}s wall, {cpu:.1f}s CPU, "
          f"load {os.getloadavg()[0]:.1f}, {guard.stats}")
    assert 0 <= guard.stats["reference_chunks"] <= guard.stats["chunks"], guard.stats
    ok, reason = verify_fast_engine(ref, fast, guard=guard)
    assert ok, reason
    if backend == "fastokens":  # only the case-fold guard (none for DeepSeek's case-sensitive pattern)
        from delta_ray._verify.probe_contexts import fold_sensitive_code_points
        assert guard.code_points == fold_sensitive_code_points(json.loads(data))
