"""The one keyless policy (``delta_ray._core.keyless``) and the one session owner it reads
(``SessionStore``): interleaved keyless conversations that share a long system prompt each continue
their own state, on the library and the HTTP handler alike, with the reference's IDs every turn."""
from __future__ import annotations

import numpy as np
import pytest

from conversations import shared_prompt_conversations as _conversations
from delta_ray import DeltaTokenizer
from delta_ray._core.id_lists import list_bytes
from delta_ray._core.keys import content_key, keyless_head, keyless_key, session_key
from delta_ray._core.session_store import SessionState, SessionStore

NAME = "qwen-3"


def _state(text: str) -> SessionState:
    return SessionState(text, np.arange(len(text) // 4, dtype=np.int32), None, None, None)


def test_keyless_keys_name_their_head_and_nothing_else():
    """A keyless key reads back its head; a session's key never does, whatever its name (a session
    named like a keyless key), nor does a content key without a serial."""
    head = content_key("ab" * 16, "tenant.x")
    key = keyless_key(head, 7)
    assert keyless_head(key) == head and keyless_head(keyless_key(content_key("cd" * 16), 1)) == content_key("cd" * 16)
    for other in (session_key(key), session_key("x.1"), session_key(key, "t|c:y"), head, content_key("x")):
        assert keyless_head(other) is None, other


def test_the_store_lists_a_heads_conversations_and_bounds_them():
    store = SessionStore(max_candidates=3)
    head = content_key("ab" * 16)
    for i in range(5):
        store.put(keyless_key(head, i), _state(f"conversation {i} " * 100))
    assert [k for k, _ in store.candidates(head)] == [keyless_key(head, i) for i in (4, 3, 2)]
    assert len(store) == 3  # the head's oldest went with its listing
    store.put(keyless_key(head, 2), _state("grown " * 200))  # a turn: most recent again
    assert [k for k, _ in store.candidates(head)][0] == keyless_key(head, 2)
    store.pop(keyless_key(head, 4))
    assert [k for k, _ in store.candidates(head)] == [keyless_key(head, 2), keyless_key(head, 3)]
    store.put(session_key("s"), _state("a session " * 100))
    assert len(store.candidates(head)) == 2 and store.clear() == 3 and store.candidates(head) == []


def test_a_kept_list_belongs_to_one_state_and_is_counted():
    """A list is kept beside the state it was made for, counted in the store's bytes, and goes with
    any new state under its key, or with an entry over the per-state bound."""
    store = SessionStore(max_bytes=1 << 22)
    a, b = _state("first " * 400), _state("second " * 400)
    ids = a.ids.tolist()
    store.put("k", a, kept=(ids, list_bytes(ids)))
    assert store.kept("k", a.version) is ids and store.kept("k", b.version) is None
    with_list = store.resident_bytes
    store.put("k", b)
    assert store.kept("k", a.version) is None and store.kept("k", b.version) is None
    assert store.resident_bytes < with_list
    assert not store.attach("k", a.version, ids, list_bytes(ids))  # not the state held now
    assert store.attach("k", b.version, ids, 10) and store.kept("k", b.version) is ids
    assert not store.attach("k", b.version, ids, 1 << 22) and "k" not in store  # over the bound: gone
    assert store.resident_bytes == 0


def test_interleaved_keyless_conversations_sharing_a_system_prompt_each_continue(tokenizer_paths, references,
                                                                                  real_texts):
    """Three conversations behind one 50K-character system prompt, interleaved turn by turn: after
    each one's first turn, every turn continues its own state (the turn re-encodes only its tail);
    the IDs are the reference's. The test can fail: with one candidate per head (the earlier
    first-4 KB key) the conversations replace each other and every turn starts a new one."""
    ref = references[NAME]
    convs = _conversations(real_texts)

    def run(candidates: int | None = None) -> list[bool]:
        dt = DeltaTokenizer(tokenizer_paths[NAME], reuse="content", engine="reference")
        if candidates is not None:
            dt.core.sessions.store.max_candidates = candidates
        new = []
        for t in range(len(convs[0])):
            for renders in convs:
                choice = dt.core.sessions.choose_keyless(renders[t])
                assert choice is not None
                new.append(choice.new)
                assert dt.encode(renders[t]).to_pylist() == ref.encode(renders[t]).ids
        assert dt.core.stats["reencode"] == 0  # every conversation after the first reused the prompt
        return new
    n = len(convs)
    assert run() == [True] * n + [False] * (n * (len(convs[0]) - 1))
    assert run(candidates=1) == [True] * (n * len(convs[0]))  # the control: each replaced another


def test_a_new_conversation_forks_from_the_one_it_shares_a_long_start_with(tokenizer_paths, references,
                                                                          real_texts):
    """A keyless text that shares the system prompt but not the turns of a held conversation starts a
    new one from the held state (its first turn already reuses the prompt's IDs) and leaves the held
    one in place."""
    ref = references[NAME]
    a, b = _conversations(real_texts, n=2, turns=2)
    dt = DeltaTokenizer(tokenizer_paths[NAME], reuse="content", engine="reference")
    assert dt.encode(a[1]).to_pylist() == ref.encode(a[1]).ids
    choice = dt.core.sessions.choose_keyless(b[1])
    assert choice is not None and choice.new and choice.fork is not None
    assert dt.core.sessions.store.peek(choice.key) is dt.core.sessions.store.peek(choice.fork)  # shared, not copied
    assert dt.encode(b[1]).to_pylist() == ref.encode(b[1]).ids
    assert dt.stats["content_hit"] == 1 and dt.stats["content_miss"] == 1  # a[1] was new, b[1] a fork
    again = dt.core.sessions.choose_keyless(a[1] + " more")
    assert again is not None and not again.new  # the first conversation is still held


def test_keyless_conversations_never_cross_tenants(tokenizer_paths, references, real_texts):
    """The same text in two tenants: two heads, each its own conversation; neither is a candidate
    of the other's texts."""
    ref = references[NAME]
    (a,) = _conversations(real_texts, n=1, turns=1)
    dt = DeltaTokenizer(tokenizer_paths[NAME], reuse="content", engine="reference")
    core = dt.core
    first = core.sessions.choose_keyless(a[0], "victim")
    assert first is not None
    ids, _ = core.sessions.session_list(first.key, a[0], False)
    assert ids == ref.encode(a[0], add_special_tokens=False).ids
    other = core.sessions.choose_keyless(a[0], "attacker")
    assert other is not None and other.new and other.fork is None and other.key != first.key
    same = core.sessions.choose_keyless(a[0], "victim")
    assert same is not None and same.key == first.key and not same.new


@pytest.mark.parametrize("n_chars", [100, 4095])
def test_short_keyless_texts_are_not_kept(tokenizer_paths, references, n_chars):
    ref = references[NAME]
    dt = DeltaTokenizer(tokenizer_paths[NAME], reuse="content", engine="reference")
    text = ("x y " * n_chars)[:n_chars]
    assert dt.core.sessions.choose_keyless(text) is None
    assert dt.encode(text).to_pylist() == ref.encode(text).ids and len(dt.core.sessions.store) == 0
