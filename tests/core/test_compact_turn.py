"""The compact continuation (issue 27, :mod:`delta_ray._core.turn_path`): every answer is the
reference's, and every check the general turn makes still decides when it matters.

Each test compares with the reference, and each guard test fails when its check is skipped: a
compact path that kept its engine across a switch, served a purged state, skipped the guard or the
shadow verifier's sampling would use the fast engine where it must not (counted by the engine's
own counters) or answer from a discarded state.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from delta_ray import DeltaTokenizer, SessionNotFound
from delta_ray._core.keys import session_key
from delta_ray._core.session_store import owners_bytes
from delta_ray._engine.engine import FastTier
from exactness import chat_messages

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastokens") is None, reason="fastokens is not installed")


def _fast(tokenizer_paths, references, name: str, guard=(), **options):
    """A tokenizer on the guarded fastokens engine (given, so no admission runs) and that engine."""
    from delta_ray._engine.engine import FastTier
    from delta_ray._engine.guard import GuardSet
    from delta_ray._engine.native import cached_fast_encoder
    fast = cached_fast_encoder(open(tokenizer_paths[name], "rb").read(), "fastokens")
    enc = FastTier(fast, GuardSet(frozenset(guard)))
    return DeltaTokenizer(tokenizer_paths[name], encoder=enc, **options), enc


def _compact(dt, key: str = "s") -> bool:
    head = dt.core.sessions.store.peek(session_key(key))._head
    return head is not None and head[2]


@pytest.mark.parametrize("name", ["qwen-3", "llama3.2"])
def test_compact_turns_are_the_reference(name, tokenizer_paths, references, real_texts):
    """extends and whole transcripts (with and without the template), then a divergence from a
    compact state and more turns: every answer is the reference's, earlier answers never change,
    the state's IDs and incremental byte count stay exact, and the compact path served the turns."""
    ref = references[name]
    dt, _ = _fast(tokenizer_paths, references, name, shadow_rate=0.0)
    msgs = chat_messages(real_texts, 60)
    text = "".join(msgs[:12])
    dt.encode(text, session="s")
    answers, compact = [], 0
    for i, m in enumerate(msgs[12:48]):
        text += m
        add = i % 5 != 3
        got = dt.extend("s", m, add_special_tokens=add) if i % 2 else dt.encode(text, session="s",
                                                                               add_special_tokens=add)
        want = ref.encode(text, add_special_tokens=add).ids
        assert got.to_pylist() == want
        answers.append((got, want))
        compact += _compact(dt)
        st = dt.core.sessions.store.peek(session_key("s"))
        assert st.id_bytes == owners_bytes(st.id_parts)
        assert np.array_equal(st.ids, ref.encode(text, add_special_tokens=False).ids)
    assert compact >= 30  # the compact path served the continuations
    text = text[:len(text) // 2] + "<|im_start|>user\nrewritten<|im_end|>\n"  # the general turn, from a compact state
    assert dt.encode(text, session="s").to_pylist() == ref.encode(text).ids
    for m in msgs[48:]:
        text += m
        assert dt.extend("s", m).to_pylist() == ref.encode(text).ids
    assert _compact(dt)
    for got, want in answers:  # zero-copy answers: no later turn wrote into their buffers
        assert got.to_pylist() == want


def test_delta_answers_take_the_compact_path(tokenizer_paths, references, real_texts):
    """A pool worker's and a Serve replica's turn (``encode_session_delta``, the caller holding the
    previous IDs or not, by delta or by whole transcript): the caller's splice of (version, k,
    tail) is the reference's IDs every turn, and the compact path served the continuations."""
    ref = references["qwen-3"]
    dt, _ = _fast(tokenizer_paths, references, "qwen-3", shadow_rate=0.0)
    core = dt.core
    msgs = chat_messages(real_texts, 40)
    text = "".join(msgs[:12])
    version, k, tail = core.sessions.encode_session_delta(session_key("s"), text)
    assert k == 0
    held = (version, np.asarray(tail))  # (version, IDs) the caller holds
    compact = 0
    for i, m in enumerate(msgs[12:]):
        text += m
        known = held[0] if i % 4 != 3 else None  # now and then a caller that lost its IDs
        if i % 3 == 2:
            version, k, tail = core.sessions.encode_session_delta(session_key("s"), text, known_version=known)
        else:
            version, k, tail = core.sessions.encode_session_delta(session_key("s"), "", known_version=known, delta=m,
                                                         expect_version=held[0])
        ids = np.concatenate([held[1][:k], np.asarray(tail)]) if k else np.asarray(tail)
        assert ids.tolist() == ref.encode(text, add_special_tokens=False).ids, i
        assert k == 0 or known is not None
        held = (version, ids)
        compact += _compact(dt)
    assert compact >= 20


def test_an_engine_switch_stops_the_compact_path(tokenizer_paths, references, real_texts):
    """After the engine switches to another tier, no turn reaches the old one (the path reads the
    engine once per turn) and every answer is still the reference's."""
    ref = references["qwen-3"]
    dt, enc = _fast(tokenizer_paths, references, "qwen-3", shadow_rate=0.0)
    msgs = chat_messages(real_texts, 24)
    text = "".join(msgs[:12])
    dt.encode(text, session="s")
    text += msgs[12]
    assert dt.extend("s", msgs[12]).to_pylist() == ref.encode(text).ids and _compact(dt)
    other = FastTier(enc.fast, enc.guard)
    dt.core.engine.use(other, "another tier (test)")
    used = enc.fast_texts
    for m in msgs[13:]:
        text += m
        assert dt.extend("s", m).to_pylist() == ref.encode(text).ids
    assert enc.fast_texts == used and other.fast_texts > 0


def test_a_disabled_fast_tier_leaves_no_compact_state(tokenizer_paths, references, real_texts):
    """A shadow mismatch (simulated: the switch's own disable) discards the sessions the fast tier
    made: the next extend finds none, and later turns never reach the fast engine."""
    ref = references["qwen-3"]
    dt, enc = _fast(tokenizer_paths, references, "qwen-3", shadow_rate=0.0)
    msgs = chat_messages(real_texts, 20)
    text = "".join(msgs[:12])
    dt.encode(text, session="s")
    for m in msgs[12:15]:
        text += m
        dt.extend("s", m)
    assert _compact(dt)
    dt.core.engine.back_to_reference("test: shadow mismatch")
    with pytest.raises(SessionNotFound):
        dt.extend("s", msgs[15])
    used = enc.fast_texts
    text += msgs[15]
    assert dt.encode(text, session="s").to_pylist() == ref.encode(text).ids
    for m in msgs[16:]:
        text += m
        assert dt.extend("s", m).to_pylist() == ref.encode(text).ids
    assert enc.fast_texts == used


def test_the_guard_still_decides_in_the_compact_path(tokenizer_paths, references, real_texts):
    """A piece holding a guarded code point goes to the general path (the reference encodes it):
    the fallback counter moves, and the answer is the reference's."""
    ref = references["qwen-3"]
    dt, enc = _fast(tokenizer_paths, references, "qwen-3", guard={0xE9}, shadow_rate=0.0)
    msgs = chat_messages(real_texts, 20)
    text = "".join(msgs[:12]).replace("\u00e9", "e")
    dt.encode(text, session="s")
    for i, m in enumerate(msgs[12:]):
        m = m.replace("\u00e9", "e")
        if i % 3 == 1:
            m = m.replace("<|im_end|>", " caf\u00e9 au lait<|im_end|>")
        text += m
        assert dt.extend("s", m).to_pylist() == ref.encode(text).ids
    assert enc.fallback_texts >= 2 and enc.fast_texts >= 10


def test_the_shadow_verifier_samples_compact_turns(tokenizer_paths, references, real_texts):
    """With shadow_rate=1.0 every compact turn is queued for comparison (both of its pieces)."""
    ref = references["qwen-3"]
    dt, _ = _fast(tokenizer_paths, references, "qwen-3", shadow_rate=1.0)
    msgs = chat_messages(real_texts, 24)
    text = "".join(msgs[:12])
    dt.encode(text, session="s")
    dt.core.shadow.drain()
    before, compact = dt.core.shadow.comparisons, 0
    for m in msgs[12:]:
        text += m
        assert dt.extend("s", m).to_pylist() == ref.encode(text).ids
        compact += _compact(dt)
        dt.core.shadow.drain()  # the queue holds 64 calls: keep it from dropping any
    assert compact >= 10
    assert dt.core.shadow.comparisons - before >= 2 * compact and dt.core.shadow.mismatches == 0
