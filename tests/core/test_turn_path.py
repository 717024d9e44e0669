"""The compact session turn (issue 27): what it reads and skips keeps every check's meaning.

Each test compares with the reference, and each one checks a mechanism that would give wrong IDs or
a wrong state without it: the chained-checkpoint invariant the turn's one-checkpoint lookup relies
on, the shared checkpoint log's immutability, the encoder stack's direct path (guard and shadow
still applied), the Arrow chunk reuse, the cost-based whole re-encode, and the rope's lazy joins.
"""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from delta_ray import DeltaTokenizer
from delta_ray._core.encoder import ReferenceEncoder
from delta_ray._core.keys import session_key
from delta_ray._core.plan import (
    REENCODE,
    REFERENCE_SESSION,
    REPAIR,
    SESSION,
    SPLICE_CHARS_FAST,
    SPLICE_CHARS_REFERENCE,
    Router,
)
from delta_ray._core.repair import encode_turn
from delta_ray._core.rope import YOUNG_PARTS
from delta_ray._core.session_store import owners_bytes
from exactness import chat_messages

HAS_FAST = importlib.util.find_spec("fastokens") is not None


def _assert_chained(state) -> None:
    pos, ext = state.cp_pos, state.cp_ext
    assert np.all(np.diff(pos) > 0) and np.all(np.diff(ext) > 0)
    assert np.all(ext[:-1] <= pos[1:])  # each one's evidence ends before the next cut
    assert np.all(ext > pos)


def test_checkpoints_stay_chained_and_exact_over_mixed_turns(tokenizer_paths, references, real_texts):
    """extend, whole transcripts, a divergence and a replay: after each turn the checkpoints are
    strictly increasing in pos and ext and chained (what lets a turn read only the last valid one),
    and every checkpoint's IDs are the reference's IDs of its prefix."""
    ref = references["qwen-3"]
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], engine="reference", shadow_rate=0.0,
                        chunk_size=8192, cut_threshold=20_000)
    msgs = chat_messages(real_texts, 60)
    text = "".join(msgs[:30])
    dt.encode(text, session="s")
    for i, m in enumerate(msgs[30:]):
        if i % 3 == 0:
            text += m
            got = dt.extend("s", m)
        elif i == 10:  # a template that rewrites an earlier message: diverges inside the context
            text = text[:len(text) // 2] + "<|im_start|>user\nrewritten<|im_end|>\n" + m
            got = dt.encode(text, session="s")
        else:
            text += m
            got = dt.encode(text, session="s")
        assert got.to_pylist() == ref.encode(text).ids
        st = dt.core.sessions.store.get(session_key("s"))
        _assert_chained(st)
        assert st.last_checkpoint == (int(st.cp_pos[-1]), int(st.cp_tok[-1]), int(st.cp_ext[-1]))
    ids = st.ids
    for pos, tok in zip(st.cp_pos[-8:], st.cp_tok[-8:]):
        assert ref.encode(st.text[:pos], add_special_tokens=False).ids == ids[:tok].tolist()


def test_the_shared_checkpoint_log_never_changes_an_older_state(tokenizer_paths, references, real_texts):
    """Two turns from the same state: the first appends to the shared log in place, the second
    (its base is no longer the newest writer) must copy; neither changes the other's checkpoints
    or the base's, and both are exact."""
    ref = references["qwen-3"]
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], engine="reference", shadow_rate=0.0)
    msgs = chat_messages(real_texts, 12)
    base_text = "".join(msgs[:10])
    dt.encode(base_text, session="s")
    dt.extend("s", msgs[10])
    base = dt.core.sessions.store.get(session_key("s"))
    before = [c.copy() for c in (base.cp_pos, base.cp_tok, base.cp_ext)]
    args = (dt.core.predicate, dt.core.engine, dt.core.planner, 1, dt.core.margin)
    n0 = base.n_chars
    a = encode_turn(base.text_parts + (msgs[11],), n0 + len(msgs[11]), base, n0, *args).state
    other = "<|im_start|>user\nsomething else entirely, 12345<|im_end|>\n"
    b = encode_turn(base.text_parts + (other,), n0 + len(other), base, n0, *args).state
    assert a._cp_log is base._cp_log and b._cp_log is not base._cp_log  # in place, then a copy
    for col, want in zip((base.cp_pos, base.cp_tok, base.cp_ext), before):
        assert np.array_equal(col, want)
    for st, tail in ((a, msgs[11]), (b, other)):
        _assert_chained(st)
        assert st.ids.tolist() == ref.encode(base.text + tail, add_special_tokens=False).ids
        for pos, tok in zip(st.cp_pos[-3:], st.cp_tok[-3:]):
            assert ref.encode(st.text[:pos], add_special_tokens=False).ids == st.ids[:tok].tolist()


@pytest.mark.skipif(not HAS_FAST, reason="fastokens is not installed")
def test_the_direct_path_keeps_the_guard_and_the_shadow(tokenizer_paths, references, real_texts):
    """A turn with the guarded fast tier calls the engine directly, but only when the guard allows
    every piece (minimax-m3: fastokens splits " I'\u017f" differently from the reference, so a
    turn that skipped the guard would return wrong IDs), and the shadow verifier still samples it."""
    from delta_ray._engine.engine import FastTier
    from delta_ray._engine.guard import GuardSet
    from delta_ray._engine.native import cached_fast_encoder
    name = "minimax-m3"
    ref = references[name]
    fast = cached_fast_encoder(open(tokenizer_paths[name], "rb").read(), "fastokens")
    bad = " I'\u017f"
    assert fast.encode(bad).tolist() != ref.encode(bad, add_special_tokens=False).ids  # what the guard prevents
    enc = FastTier(fast, GuardSet(frozenset({0x17F})))
    dt = DeltaTokenizer(tokenizer_paths[name], encoder=enc, shadow_rate=1.0)
    text = real_texts["english"][:20_000]
    dt.encode(text, session="s")
    for delta in (" one more line.\n", bad + " and then", " plain again.\n"):
        text += delta
        assert dt.extend("s", delta).to_pylist() == ref.encode(text).ids
    assert enc.fallback_texts >= 1 and enc.fast_texts >= 2
    dt.core.shadow.drain()
    assert dt.core.shadow.comparisons >= 2 and dt.core.shadow.mismatches == 0  # the direct path was sampled


def test_a_turn_reuses_the_arrow_arrays_of_the_parts_it_keeps(tokenizer_paths, references, real_texts):
    """The Arrow result of a turn shares the previous result's arrays for the kept parts (a
    zero-copy slice for the part cut at the checkpoint), and every earlier result stays unchanged."""
    ref = references["qwen-3"]
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], engine="reference", shadow_rate=0.0)
    msgs = chat_messages(real_texts, 40)
    text = "".join(msgs[:30])
    first = dt.encode(text, session="s")
    kept = first.to_pylist()
    results = []
    for m in msgs[30:]:
        prev = dt.core.sessions.store.get(session_key("s"))
        text += m
        got = dt.extend("s", m)
        assert got.to_pylist() == ref.encode(text).ids
        new = dt.core.sessions.store.get(session_key("s"))
        shared = [i for i, p in enumerate(new.id_parts) if i < len(prev.id_parts) and p is prev.id_parts[i]]
        for i in shared:
            assert new.arrow_chunks()[i] is prev.arrow_chunks()[i]
        results.append((got, got.to_pylist()))
    assert first.to_pylist() == kept
    assert all(r.to_pylist() == want for r, want in results)


def test_a_turn_with_little_to_reuse_is_re_encoded_whole_and_the_session_goes_on(tokenizer_paths, references):
    """Router.turn picks a whole re-encode when the shared text is under the repair's fixed cost;
    the state it leaves has checkpoints, so the next turn repairs from it."""
    router = Router(admitted=True, cut_threshold=10)
    assert router.decide("x" * 100, "s") is SESSION
    assert router.turn(SPLICE_CHARS_FAST - 1, fast=True) is REENCODE
    assert router.turn(SPLICE_CHARS_FAST, fast=True) is REPAIR
    assert router.turn(SPLICE_CHARS_REFERENCE - 1, fast=False) is REENCODE
    assert Router(admitted=False, cut_threshold=10).decide("x", "s") is REFERENCE_SESSION
    assert len("Hi there. ") < SPLICE_CHARS_REFERENCE
    ref = references["qwen-3"]
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], engine="reference", shadow_rate=0.0)
    text = "Hi there. "  # shorter than the reference's SPLICE_CHARS_REFERENCE
    dt.encode(text, session="s")
    text += "How are you? I hope all is well."  # the next turn has enough to reuse
    assert dt.encode(text, session="s").to_pylist() == ref.encode(text).ids
    assert dt.stats["reencode"] == 1 and dt.core.sessions.store.get(session_key("s")).n_checkpoints >= 1
    text += " Fine, thanks. " * 10
    assert dt.extend("s", " Fine, thanks. " * 10).to_pylist() == ref.encode(text).ids
    assert dt.stats["repair"] >= 1


def test_small_appends_wait_and_are_joined_eight_at_a_time(tokenizer_paths, references, real_texts):
    """Most turns copy no text: small appended parts are kept as they are until there are
    YOUNG_PARTS of them, then joined once; the rope stays shallow and the IDs exact."""
    ref = references["qwen-3"]
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], engine="reference", shadow_rate=0.0)
    text = real_texts["english"][:50_000]
    dt.encode(text, session="s")
    first_part = dt.core.sessions.store.get(session_key("s")).text_parts[0]
    depths = []
    for i, m in enumerate(chat_messages(real_texts, 3 * YOUNG_PARTS)):
        text += m
        assert dt.extend("s", m).to_pylist() == ref.encode(text).ids
        st = dt.core.sessions.store.get(session_key("s"))
        depths.append(len(st.text_parts))
        assert st.text_parts[0] is first_part  # the context is never copied again
        # the byte count a turn derives from its base's equals a full recount of the new state
        full = sum(map(sys.getsizeof, st.text_parts)) + owners_bytes(st.id_parts) + 24 * st.n_checkpoints
        assert st.nbytes == full and dt.core.sessions.store.resident_bytes == full + sys.getsizeof(session_key("s"))
    assert max(depths) <= YOUNG_PARTS + 1 and min(depths) < max(depths)
    assert "".join(st.text_parts) == text


def test_a_continuation_keeps_whole_parts_and_reuses_their_arrow_arrays(tokenizer_paths, references, real_texts):
    """A turn's new IDs are stored as two parts split at its last cut, so the next continuation's
    kept prefix is the previous parts minus that tail, as they are (no numpy or Arrow slice), and
    their Arrow arrays are the previous answer's; the rope stays shallow and every answer exact."""
    ref = references["qwen-3"]
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], engine="reference", shadow_rate=0.0)
    msgs = chat_messages(real_texts, 60)
    text = "".join(msgs[:20])
    dt.encode(text, session="s")
    whole_parts = 0
    for m in msgs[20:]:
        prev = dt.core.sessions.store.get(session_key("s"))
        prev_chunks = prev.arrow_chunks()
        text += m
        assert dt.extend("s", m).to_pylist() == ref.encode(text).ids
        new = dt.core.sessions.store.get(session_key("s"))
        kept = len(prev.id_parts) - 1
        if len(new.id_parts) == len(prev.id_parts) + 1:  # no join this turn: head and tail appended
            assert all(new.id_parts[i] is prev.id_parts[i] for i in range(kept))
            assert all(new.arrow_chunks()[i] is prev_chunks[i] for i in range(kept))
            assert new.id_parts[-1].base is not None and new.id_parts[-1].base is new.id_parts[-2].base
            whole_parts += 1
        assert len(new.id_parts) <= 2 * YOUNG_PARTS  # bounded: the tail is never joined, the rest as before
        assert new.id_bytes == owners_bytes(new.id_parts)  # the incremental byte count stays exact
    assert whole_parts >= 20


@pytest.mark.parametrize("name", ["qwen-3", "llama3.2", "glm-4"])
def test_added_token_prefilter_agrees_with_every_occurrence(tokenizer_paths, references, name):
    """SpecialTokenIndex skips its regex when no added token's first character occurs before the
    position: compared with every occurrence found by brute force, at every position of texts dense
    in tokens, their fragments and their first characters."""
    import random
    dt = DeltaTokenizer(tokenizer_paths[name], engine="reference", shadow_rate=0.0)
    sp = dt.core._predicate.specials
    assert sp._firsts is not None  # the prefilter is in use for this family
    rng = random.Random(7)
    toks = sp.tokens
    for _ in range(30):
        bits = []
        for _ in range(40):
            t = rng.choice(toks)
            bits.append(rng.choice([t, t[:rng.randrange(1, len(t) + 1)], t[rng.randrange(len(t)):],
                                    "ab c", "<", "[", "x" * rng.randrange(1, 40)]))
        text = "".join(bits)
        occ = [(s, s + len(t)) for t in toks for s in range(len(text)) if text.startswith(t, s)]
        for b in range(len(text) + 1):
            assert sp.crosses(text, b) == any(s < b < e for s, e in occ), (text, b)
        for lo in range(0, len(text), 7):
            hi = lo + rng.randrange(1, 30)
            assert sp.overlaps(text, lo, hi) == any(s < hi and e > lo for s, e in occ), (text, lo, hi)


def test_shadow_sampling_by_gaps_keeps_the_rate(references):
    """The shadow verifier draws the gap to its next sample instead of a number per call: each call
    is still sampled with probability ``rate`` (binomial bounds, fixed seed), 0 samples nothing, 1
    samples every call, and setting ``rate`` takes effect at once."""
    from delta_ray._engine.shadow import ShadowVerifier

    class _Engine:
        reference = None

    n = 40_000
    for rate in (0.0, 0.01, 0.2, 0.5, 1.0):
        v = ShadowVerifier(_Engine(), rate, seed=3)
        hits = sum(v.sampled() for _ in range(n))
        sd = (n * rate * (1 - rate)) ** 0.5
        assert abs(hits - n * rate) <= 6 * sd + 1, (rate, hits)
    v = ShadowVerifier(_Engine(), 0.0, seed=3)
    v.rate = 1.0
    assert all(v.sampled() for _ in range(100))
    v.rate = 0.0
    assert not any(v.sampled() for _ in range(n))
    from delta_ray._engine.engine import Engine
    engine = Engine(ReferenceEncoder(references["qwen-3"]), None, 1.0)
    engine.encode_pieces(["some text"]), engine.encode_flat(["more text"])
    engine.shadow.drain()
    assert engine.shadow.comparisons == 0  # the reference's answers are never re-checked


def test_to_arrow_wraps_contiguous_int32_as_is_and_converts_the_rest():
    """to_arrow's no-conversion path is taken only by 1-D contiguous native int32 arrays (zero-copy);
    strided views, other dtypes, other byte orders and lists are converted, with the same values."""
    from delta_ray._core.assembly import to_arrow
    a = np.arange(10, dtype=np.int32)
    tail = a[3:]
    got = to_arrow(tail)
    assert got.to_pylist() == tail.tolist() and got.buffers()[1].address == tail.ctypes.data  # zero-copy
    for x in (a[::2], a[::-1], np.arange(4, dtype=np.int64), np.arange(3, dtype=">i4"), a[::2][:1], a[:0]):
        assert to_arrow(x).to_pylist() == np.asarray(x).tolist()
    assert to_arrow([1, 2]).to_pylist() == [1, 2]
