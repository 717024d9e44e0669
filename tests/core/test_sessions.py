"""Session repair, extend, content reuse, eviction and failure handling, against the reference."""
from __future__ import annotations

import random
import re

import numpy as np
import pytest

from delta_ray import DeltaTokenizer, SessionNotFound
from delta_ray._core.keys import session_key
from exactness import ADVERSARIAL, special_fragments

pytestmark = pytest.mark.battery  # the quick exactness battery (also run under tokenizers 1.x)


def _transcript(ref, real_texts, n_chars=60_000) -> str:
    """A chat-like transcript with every feature appends must survive landing inside."""
    specials = special_fragments(ref, 4)
    rnd = random.Random(11)
    src = real_texts["english"] + real_texts["code"] + real_texts["multilingual"]
    parts = []
    while sum(map(len, parts)) < n_chars:
        start = rnd.randrange(len(src) - 3000)
        parts.append(rnd.choice(specials[:2]) + "user\n" + src[start:start + rnd.randint(200, 2500)])
        parts.append(rnd.choice(ADVERSARIAL) + "  12345 67\r\n\r\n   e\u0301\u0958/ don't  \n  ")
    return "".join(parts)


def _adversarial_positions(text: str, ref) -> list[int]:
    """Append boundaries inside whitespace runs, words, digit runs, special tokens, before a
    combining mark, between CR and LF, and after a newline plus spaces."""
    pos = set()
    for rx in (r" {2,}", r"[A-Za-z]{4,}", r"\d{3,}"):
        for m in list(re.finditer(rx, text))[:40]:
            pos.add(m.start() + 1)
    for tok in special_fragments(ref, 2)[:1]:
        for m in list(re.finditer(re.escape(tok), text))[:20]:
            pos.update({m.start() + 1, m.start() + len(tok) // 2, m.end() - 1})
    pos.update(m.start() for m in re.finditer("\u0301", text))
    pos.update(m.start() + 1 for m in re.finditer("\r\n", text))
    pos.update(m.end() for m in re.finditer(r"\n +", text))
    return sorted(p for p in pos if 0 < p < len(text))


def test_session_replay_with_adversarial_appends(name, tokenizer_paths, references, real_texts):
    ref = references[name]
    dt = DeltaTokenizer(tokenizer_paths[name])
    text = _transcript(ref, real_texts)
    positions = _adversarial_positions(text, ref)
    assert len(positions) > 100
    positions = positions[:: max(1, len(positions) // 120)] + [len(text)]
    for p in positions:
        got = dt.encode(text[:p], session="s").to_pylist()
        assert got == ref.encode(text[:p]).ids, (name, p, repr(text[p - 20:p + 20]))
    assert dt.stats["repair"] > len(positions) // 2  # the fast path ran, not only re-inits


def test_turn_ending_in_newline_spaces_then_append(name, tokenizer_paths, references):
    ref = references[name]
    dt = DeltaTokenizer(tokenizer_paths[name])
    base = "word " * 400 + "end\n   "
    for i, delta in enumerate(["\n   next", "\r\n  \n x", "\u0301a", "'s", "5678", "  ", "\n"]):
        text = base + delta
        assert dt.encode(base, session=f"k{i}").to_pylist() == ref.encode(base).ids
        assert dt.encode(text, session=f"k{i}").to_pylist() == ref.encode(text).ids


def test_extend_matches_reference_and_needs_a_session(tokenizer_paths, references, real_texts):
    name = "llama3.2"
    ref, dt = references[name], DeltaTokenizer(tokenizer_paths[name])
    text = real_texts["english"][:20_000]
    dt.encode(text, session="conv")
    for delta in ["\nUser: and then?", " 123", "\u0301", "<|eot_id|>", "\n\n"]:
        text += delta
        got = dt.extend("conv", delta).to_pylist()
        assert got == ref.encode(text).ids
    assert dt.encode(text, session="conv", add_special_tokens=False).to_pylist() == \
        ref.encode(text, add_special_tokens=False).ids
    with pytest.raises(SessionNotFound, match="send the whole text"):
        dt.extend("nope", "x")


def test_non_extension_reinitializes_or_reuses_prefix(tokenizer_paths, references, real_texts):
    """A new text that is not an extension (a template dropped an old block) is still exact."""
    name = "qwen-3"
    ref, dt = references[name], DeltaTokenizer(tokenizer_paths[name])
    t1 = real_texts["english"][:30_000] + "<think>long reasoning</think>" + real_texts["code"][:5000]
    t2 = real_texts["english"][:30_000] + real_texts["code"][:5000] + "\nmore"
    t3 = "completely different " * 50
    for t in (t1, t2, t3, t1):
        assert dt.encode(t, session="c").to_pylist() == ref.encode(t).ids
    assert dt.stats["repair"] >= 1  # t2 reused the shared prefix


def test_eviction_never_changes_ids(tokenizer_paths, references, real_texts):
    name = "deepseek-v3"
    ref = references[name]
    dt = DeltaTokenizer(tokenizer_paths[name], max_session_bytes=400_000, max_sessions=3)
    texts = [real_texts["english"][i * 5000:(i + 1) * 5000 + 30_000] for i in range(6)]
    for rnd in range(2):
        for i, t in enumerate(texts):
            t = t + "x" * rnd
            assert dt.encode(t, session=f"s{i}").to_pylist() == ref.encode(t).ids
    assert dt.core.sessions.store.evictions > 0 and len(dt.core.sessions.store) <= 3
    assert dt.core.sessions.store.resident_bytes <= 400_000


def test_bad_input_is_a_clear_error_and_leaves_the_session(tokenizer_paths, references):
    name = "qwen-3"
    ref, dt = references[name], DeltaTokenizer(tokenizer_paths[name])
    with pytest.raises(TypeError):
        dt.encode(b"bytes")
    with pytest.raises(TypeError):
        dt.encode("x", session=5)
    with pytest.raises(TypeError):
        dt.encode_batch("not a list")
    text = "hello world " * 100
    dt.encode(text, session="s")
    before = dt.core.sessions.store.get(session_key("s"))
    with pytest.raises(ValueError, match="rejected"):
        dt.encode(text + "\ud800 tail", session="s")
    with pytest.raises(ValueError, match="rejected"):
        dt.extend("s", "\udfff")
    assert dt.core.sessions.store.get(session_key("s")) is before
    assert dt.extend("s", " ok").to_pylist() == ref.encode(text + " ok").ids


def test_content_reuse_keyless(tokenizer_paths, references, real_texts):
    name = "minimax-m3"
    ref = references[name]
    dt = DeltaTokenizer(tokenizer_paths[name], reuse="content")
    text = real_texts["multilingual"][:20_000]
    for i in range(5):
        text += f"\nturn {i}: " + real_texts["english"][i * 700:(i + 1) * 700]
        assert dt.encode(text).to_pylist() == ref.encode(text).ids
    assert dt.stats["content_hit"] >= 3
    short = "tiny text"
    assert dt.encode(short).to_pylist() == ref.encode(short).ids


def test_encode_batch_and_decode(name, tokenizer_paths, references, real_texts):
    ref = references[name]
    dt = DeltaTokenizer(tokenizer_paths[name], chunk_size=4096, cut_threshold=8192)
    texts = ["", "a", real_texts["code"][:50_000], real_texts["multilingual"][:12_000], "x y z"]
    got = dt.encode_batch(texts)
    assert [g.to_pylist() for g in got] == [e.ids for e in ref.encode_batch(texts)]
    assert dt.decode(got[2]) == ref.decode(ref.encode(texts[2]).ids)
    assert isinstance(got[0].to_numpy(), np.ndarray)


def test_every_checkpoint_is_exact(name, tokenizer_paths, references, real_texts):
    """Each stored checkpoint (pos, tok) satisfies ids(text[:pos]) == ids[:tok] on the reference."""
    ref = references[name]
    dt = DeltaTokenizer(tokenizer_paths[name], chunk_size=8192, cut_threshold=20_000)
    text = real_texts["multilingual"][:25_000] + real_texts["code"][:30_000]
    for end in (40_000, 41_000, 41_500, 47_000, len(text)):
        dt.encode(text[:end], session="s")
    st = dt.core.sessions.store.get(session_key("s"))
    assert len(st.cp_pos) >= 3
    for pos, tok, ext in zip(st.cp_pos, st.cp_tok, st.cp_ext):
        assert ext <= len(st.text) or pos == st.cp_pos[-1]
        assert ref.encode(st.text[:pos], add_special_tokens=False).ids == st.ids[:tok].tolist()


def test_threads_extending_one_session_never_lose_an_update(tokenizer_paths, references):
    """8 threads x 200 extends on one session (a sync web app shares one DeltaTokenizer)."""
    import threading

    from delta_ray import DeltaTokenizer
    ref = references["qwen-3"]
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], engine="reference", shadow_rate=0.0)
    dt.encode("start.", session="s")
    errors = []

    def work(i):
        try:
            for j in range(200):
                dt.extend("s", f" t{i}-{j}.")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    text = dt.core.sessions.store.get(session_key("s")).text
    for i in range(8):
        for j in range(200):
            assert f" t{i}-{j}." in text  # no extend lost
    assert len(text) == len("start.") + sum(len(f" t{i}-{j}.") for i in range(8) for j in range(200))
    assert dt.encode(text, session="s").to_pylist() == ref.encode(text).ids


def test_session_keys_count_against_the_bound():
    """300 sessions with 1 MiB keys under an 8 MiB bound stay within the bound + 10%."""
    import numpy as np

    from delta_ray._core.session_store import SessionState, SessionStore
    store = SessionStore(max_bytes=8 << 20, max_sessions=10_000)
    z = np.zeros(0, np.int64)
    for i in range(300):
        store.put(f"{i:04d}" + "k" * (1 << 20), SessionState("x", np.zeros(1, np.int32), z, z, z))
    assert store.resident_bytes <= (8 << 20) * 1.1
    assert len(store) <= 8


def test_one_huge_session_evicts_nothing():
    import numpy as np

    from delta_ray._core.session_store import SessionState, SessionStore
    store = SessionStore(max_bytes=1 << 20)
    z = np.zeros(0, np.int64)
    for i in range(10):
        store.put(f"s{i}", SessionState("small", np.zeros(4, np.int32), z, z, z))
    assert store.put("huge", SessionState("h" * (1 << 20), np.zeros(4, np.int32), z, z, z)) is False
    assert len(store) == 10 and "huge" not in store


def test_a_stale_extend_is_refused(tokenizer_paths, references):
    """An extend made for state v1 that arrives after the caller resent the whole text (v2) must not
    apply on top of it (the delta would appear twice): the worker-side call refuses it."""
    from delta_ray import DeltaTokenizer, SessionNotFound
    ref = references["qwen-3"]
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], engine="reference", shadow_rate=0.0)
    v1, _, _ = dt.core.sessions.encode_session_delta(session_key("s"), "Hello there.")
    # the caller timed out on extend(" More.") and resent the whole text
    v2, _, _ = dt.core.sessions.encode_session_delta(session_key("s"), "Hello there. More.")
    with pytest.raises(SessionNotFound, match="stale"):
        dt.core.sessions.encode_session_delta(session_key("s"), "", v1, delta=" More.", expect_version=v1)
    assert dt.core.sessions.store.get(session_key("s")).text == "Hello there. More."
    v3, k, tail = dt.core.sessions.encode_session_delta(session_key("s"), "", v2, delta=" Next.", expect_version=v2)
    assert dt.core.sessions.store.get(session_key("s")).text == "Hello there. More. Next."
    assert dt.encode("Hello there. More. Next.", session="s").to_pylist() == ref.encode("Hello there. More. Next.").ids


def test_turns_keep_the_context_in_place_and_results_never_change(tokenizer_paths, references, real_texts):
    """A turn appends: the kept IDs and text are the previous state's own memory (no copy), and an
    array returned earlier is unchanged by later turns (its chunks are immutable)."""
    ref = references["qwen-3"]
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], engine="reference", shadow_rate=0.0)
    text = (real_texts["english"] * 2)[:100_000]  # over the rope's small-part merge threshold
    first = dt.encode(text, session="s")
    first_list = first.to_pylist()
    old = dt.core.sessions.store.get(session_key("s"))
    for i in range(6):
        delta = f"\nturn {i}: " + real_texts["code"][i * 700:(i + 1) * 700]
        text += delta
        got = dt.extend("s", delta) if i % 2 else dt.encode(text, session="s")
        assert got.to_pylist() == ref.encode(text).ids
        new = dt.core.sessions.store.get(session_key("s"))
        assert np.shares_memory(new.id_parts[0], old.id_parts[0])  # the context's IDs were not copied
        assert new.text_parts[0] is old.text_parts[0] or i % 2 == 0  # extend keeps the text in place
        old = new
    assert first.to_pylist() == first_list
    assert len(dt.core.sessions.store.get(session_key("s")).id_parts) <= 12  # the rope stays shallow
