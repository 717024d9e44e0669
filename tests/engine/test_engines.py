"""The fast tier inside the cuts: the core's battery with engine="fast" on all six tokenizers,
guard confinement with an engine that does disagree, and the shadow verifier's switch-back."""
from __future__ import annotations

import importlib.util
import random

import numpy as np
import pytest

from delta_ray import DeltaTokenizer
from delta_ray._core.keys import session_key
from delta_ray._engine.engine import FastTier
from exactness import ADVERSARIAL, special_fragments
from wrong_engine import WrongEngine

HAS_FAST = importlib.util.find_spec("fastokens") is not None
HAS_GIGA = importlib.util.find_spec("gigatoken") is not None


@pytest.fixture(scope="module")
def fast_deltas(tokenizer_paths):
    if not HAS_FAST:
        pytest.skip("fastokens is not installed")
    # engine="fast" admits now: guard probe over every code point plus the battery (cached on disk)
    return {n: DeltaTokenizer(p, engine="fast", chunk_size=2048, cut_threshold=4096, threads=8)
            for n, p in tokenizer_paths.items()}


def test_core_battery_with_the_fast_engine(name, fast_deltas, references, real_texts):
    dt, ref = fast_deltas[name], references[name]
    assert dt.admission.engine.startswith("fast"), dt.admission.engine
    texts = [src[:40_000] for src in real_texts.values()]
    rnd = random.Random(3)
    frags = ADVERSARIAL + special_fragments(ref)
    texts += ["".join(rnd.choice(frags) for _ in range(rnd.randint(1, 400))) for _ in range(60)]
    texts += ["", "a", "<|im_end|>", "\u0958/", "e\u0301" * 3000]
    for special in (True, False):
        got = dt.encode_batch(texts, add_special_tokens=special)
        want = ref.encode_batch(texts, add_special_tokens=special)
        assert [g.to_pylist() for g in got] == [w.ids for w in want]
    for t in texts[:3]:
        assert dt.encode(t).to_pylist() == ref.encode(t).ids
    # sessions: appends landing anywhere, repaired by the fast engine
    text = real_texts["code"][:20_000]
    for i in range(12):
        text += rnd.choice(frags) + real_texts["english"][i * 300:(i + 1) * 300 + rnd.randint(0, 40)]
        assert dt.encode(text, session="s").to_pylist() == ref.encode(text).ids
    assert dt.core.engine.now().tier.fast_texts > 0  # the fast engine did the work


@pytest.mark.skipif(not HAS_GIGA, reason="gigatoken is not installed")
def test_guard_confines_a_disagreeing_engine_to_its_chunk(tokenizer_paths, references, real_texts):
    """gigatoken disagrees with the reference on some recent code points: with its guard, only the
    chunk holding one goes to the reference and the IDs stay exact; without it they would not."""
    from delta_ray._engine.engine import FastTier
    from delta_ray._engine.native import cached_fast_encoder
    from delta_ray._verify.guard_probe import guard_set_for

    name = "qwen-3"
    ref = references[name]
    data = open(tokenizer_paths[name], "rb").read()
    fast = cached_fast_encoder(data, "gigatoken")
    probe = [0x16D67, 0x1611E, 0x113C2, 0x0C3C, 0x1ACF, 0x11F41, 0x1E4EC]
    guard = guard_set_for(data, fast, ref_tokenizer=ref, code_points=probe)
    bad = next(cp for cp in probe if cp in guard)
    needle = chr(bad) * 2
    assert not np.array_equal(fast.encode("x " + needle + " y"),
                              ref.encode("x " + needle + " y", add_special_tokens=False).ids)
    text = real_texts["english"][:30_000] + needle + real_texts["code"][:30_000]
    guarded = FastTier(fast, guard)
    dt = DeltaTokenizer(tokenizer_paths[name], encoder=guarded, chunk_size=4096, cut_threshold=8192, threads=16)
    assert dt.encode(text).to_pylist() == ref.encode(text).ids
    assert guarded.fallback_texts == 1 and guarded.fast_texts >= 10  # one chunk confined
    unguarded = DeltaTokenizer(tokenizer_paths[name], encoder=fast, chunk_size=4096, cut_threshold=8192, threads=16)
    assert unguarded.encode(text).to_pylist() != ref.encode(text).ids  # what the guard prevents


def test_shadow_verifier_switches_back_to_the_reference(tokenizer_paths, references):
    ref = references["glm-4"]
    dt = DeltaTokenizer(tokenizer_paths["glm-4"], encoder=WrongEngine(ref), shadow_rate=1.0)
    text = "Hello shadow verification " * 20
    wrong = dt.encode(text).to_pylist()
    assert wrong != ref.encode(text).ids  # the injected engine is wrong, and sampled
    dt.core.shadow.drain()
    assert dt.core.shadow.mismatches >= 1 and dt.core.shadow.comparisons >= 1
    assert "disabled" in dt.admission.engine
    for t in (text, text + "!", "other text"):
        assert dt.encode(t).to_pylist() == ref.encode(t).ids
    assert dt.encode(text + "!!", session="s").to_pylist() == ref.encode(text + "!!").ids


def test_engine_argument(tokenizer_paths):
    with pytest.raises(ValueError):
        DeltaTokenizer(tokenizer_paths["qwen-3"], engine="turbo")
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], engine="reference")
    assert dt.admission.engine.startswith("reference")
    with pytest.raises(ValueError):
        DeltaTokenizer(tokenizer_paths["qwen-3"], shadow_rate=2.0)


def test_a_caught_mismatch_leaves_nothing_wrong_behind(tokenizer_paths, references, tmp_path, monkeypatch):
    """After the shadow verifier catches the engine, the sessions and content entries it produced are
    gone, the next turns of those sessions are exact, and the rejection is persisted."""
    from delta_ray._engine.verdicts import load_verdict, save_verdict
    from delta_ray._verify.admit import verdict_key
    monkeypatch.setenv("DELTA_RAY_CACHE", str(tmp_path / "cache"))
    name = "glm-4"
    ref = references[name]
    wrong = FastTier(WrongEngine(ref),
                     verdict_key=verdict_key(open(tokenizer_paths[name], "rb").read(), "fastokens", "injected"))
    save_verdict(wrong.verdict_key, True, "admitted", [])
    dt = DeltaTokenizer(tokenizer_paths[name], encoder=wrong, shadow_rate=0.0, reuse="content")
    base = "Turn one of a long conversation. " * 200
    for key in ("a", "b"):
        assert dt.encode(base + key, session=key).to_pylist() != ref.encode(base + key).ids  # wrong, unchecked
    dt.encode(base * 3)  # a content entry made by the wrong engine
    assert dt.core.sessions.has_session(session_key("a")) and len(dt.core.sessions.store) == 3
    dt.core.shadow.rate = 1.0
    dt.encode("one sampled call")
    dt.core.shadow.drain()
    assert "disabled" in dt.admission.engine
    assert len(dt.core.sessions.store) == 0 and not dt.core.sessions.has_session(session_key("a"))  # purged
    for key in ("a", "b"):  # the next turn re-initializes from the reference
        text = base + key + " and turn two"
        assert dt.encode(text, session=key).to_pylist() == ref.encode(text).ids
    assert dt.encode(base * 3 + "!").to_pylist() == ref.encode(base * 3 + "!").ids
    rec = load_verdict(wrong.verdict_key)
    assert rec is not None and rec["ok"] is False  # a restart will not admit it again


def test_shadow_logs_carry_no_request_text(tokenizer_paths, references, caplog, monkeypatch):
    import logging
    monkeypatch.delenv("DELTA_RAY_LOG_TEXT", raising=False)
    ref = references["glm-4"]
    dt = DeltaTokenizer(tokenizer_paths["glm-4"], encoder=WrongEngine(ref), shadow_rate=1.0)
    secret = "my password is hunter2 " * 3
    with caplog.at_level(logging.ERROR, logger="delta_ray.engine.shadow"):
        dt.encode(secret)
        dt.core.shadow.drain()
    assert dt.core.shadow.mismatches == 1
    assert "hunter2" not in caplog.text and "69-character" in caplog.text


def test_in_process_shadow_is_on_by_default(tokenizer_paths):
    from delta_ray._core import constants as C
    dt = DeltaTokenizer(tokenizer_paths["glm-4"], engine="reference")
    assert dt.core.shadow.rate == C.SHADOW_RATE > 0


def test_a_rejection_elsewhere_disables_the_fast_tier_here(tokenizer_paths, references, tmp_path, monkeypatch):
    """Another process (a pool worker) persisting a rejection makes this one purge and switch too."""
    import time as _time

    from delta_ray._engine import verdicts
    from delta_ray._engine.verdicts import reject_verdict, save_verdict
    from delta_ray._verify.admit import verdict_key
    monkeypatch.setenv("DELTA_RAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(verdicts, "VERDICT_POLL_S", 0.05)
    name = "glm-4"
    ref = references[name]
    enc = FastTier(WrongEngine(ref),
                   verdict_key=verdict_key(open(tokenizer_paths[name], "rb").read(), "fastokens", "injected-2"))
    save_verdict(enc.verdict_key, True, "admitted", [])
    dt = DeltaTokenizer(tokenizer_paths[name], encoder=enc, shadow_rate=0.0)
    dt.encode("some text " * 50, session="a")
    assert dt.core.sessions.has_session(session_key("a"))
    reject_verdict(enc.verdict_key, "caught by another worker")
    deadline = _time.time() + 10
    while "disabled" not in dt.admission.engine and _time.time() < deadline:
        _time.sleep(0.05)
    # no state is read once disabled
    assert "disabled" in dt.admission.engine and not dt.core.sessions.has_session(session_key("a"))
    assert dt.encode("some text " * 51, session="a").to_pylist() == ref.encode("some text " * 51).ids


def test_no_turn_reuses_a_disabled_engine_state_before_its_purge_has_run(tokenizer_paths, references, tmp_path,
                                                                          monkeypatch):
    """The switch to the reference is immediate; the purge listener runs after the rejection is
    persisted. Turns that come in between (here: while the rejection is being written) must not
    replay or extend the disabled engine's IDs."""
    from delta_ray._engine import engine as engine_module
    monkeypatch.setenv("DELTA_RAY_CACHE", str(tmp_path / "cache"))
    ref = references["glm-4"]
    dt = DeltaTokenizer(tokenizer_paths["glm-4"], encoder=WrongEngine(ref), shadow_rate=0.0, reuse="content")
    text = "A conversation the wrong engine encoded. " * 100
    assert dt.encode(text, session="a").to_pylist() != ref.encode(text).ids  # wrong, unchecked
    dt.encode(text * 3)  # a content entry too
    seen = {}
    real_reject = engine_module.reject_verdict

    def reject_meanwhile(key, reason):
        # back_to_reference has switched the engine; its listeners (the purge) have not run
        seen["replay"] = dt.encode(text, session="a").to_pylist()
        seen["extend"] = dt.extend("a", " and more").to_pylist()
        seen["content"] = dt.encode(text * 3).to_pylist()
        real_reject(key, reason)

    monkeypatch.setattr(engine_module, "reject_verdict", reject_meanwhile)
    dt.core.engine.back_to_reference("caught in a test")
    assert seen["replay"] == ref.encode(text).ids
    assert seen["extend"] == ref.encode(text + " and more").ids
    assert seen["content"] == ref.encode(text * 3).ids


@pytest.mark.skipif(not HAS_FAST, reason="fastokens is not installed")
def test_a_guarded_code_point_sends_only_a_window_to_the_reference(tokenizer_paths, references, real_texts):
    """One guarded character in a long text: the reference encodes a few thousand characters
    around it, not its whole chunk, and the IDs are exact."""
    from delta_ray._engine.engine import FastTier
    from delta_ray._engine.guard import GuardSet
    from delta_ray._engine.native import cached_fast_encoder
    name = "minimax-m3"
    ref = references[name]
    fast = cached_fast_encoder(open(tokenizer_paths[name], "rb").read(), "fastokens")
    enc = FastTier(fast, GuardSet(frozenset({0x17F})))
    body = (real_texts["english"] * 3)[:300_000]
    text = body[:150_000] + " I'\u017f " + body[150_000:]
    for threads in (1, 4):
        enc.fallback_chars = 0
        dt = DeltaTokenizer(tokenizer_paths[name], encoder=enc, threads=threads, chunk_size=65536,
                            cut_threshold=131072, shadow_rate=0.0)
        assert dt.encode(text).to_pylist() == ref.encode(text).ids
        assert 0 < enc.fallback_chars <= 8192, enc.fallback_chars
    enc.fallback_chars = 0
    assert dt.encode(text, session="s").to_pylist() == ref.encode(text).ids  # sessions too
    assert enc.fallback_chars <= 8192 * 4
