"""Every kind of key in its own injective namespace (_core/keys.py), and the attacks that needed it."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delta_ray._core.arguments import check_tenant
from delta_ray._core.keys import ContentDigest, content_key, describe, is_content_key, session_key

_names = st.text(alphabet=st.sampled_from("ab:|st-c0123456789\x00é"), max_size=12)
_tenants = st.none() | _names


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("sc"), _tenants, _names), min_size=2, max_size=8))
def test_keys_are_injective_across_kinds_and_tenants(triples):
    """Distinct (kind, tenant, name) never share a key: no session name spells a content key,
    no (tenant, name) pair spells another tenant's ("acme", "corp:chat1") vs ("acme:corp", "chat1")."""
    make = {"s": session_key, "c": content_key}
    keys = {make[kind](name, tenant): (kind, tenant, name) for kind, tenant, name in triples}
    assert len(keys) == len(set(triples))
    for key, (kind, _tenant, _name) in keys.items():
        assert is_content_key(key) == (kind == "c")


@pytest.mark.parametrize("tenant", [None, "", "acme", "t5:acme|s:", "secret-salt-1234"])
def test_messages_never_show_a_tenant(tenant):
    key = session_key("conv-42", tenant)
    text = describe(key)
    assert "conv-42" in text
    assert tenant is None or tenant == "" or tenant not in text
    assert "t-|" not in text and "|s:" not in text
    assert "secret" not in describe(content_key("abcd", "secret-salt"))


def test_a_session_named_like_a_content_key_is_still_a_session():
    """The pool stored keyless texts under the string "t-|c:<digest>" and sessions under their raw
    names, so a session could be named after another caller's content key."""
    spelled = content_key("0" * 32)
    assert session_key(spelled) != spelled and not is_content_key(session_key(spelled))


def test_content_digests_are_keyed():
    """Without the secret nobody can compute another caller's content key from a public prefix."""
    text = "You are a helpful assistant. " * 200
    a, b = ContentDigest(), ContentDigest()
    assert a.of(text) == a.of(text) != b.of(text)
    shared = ContentDigest.derived(b"pool secret", b"purpose")
    assert shared.of(text) == ContentDigest.derived(b"pool secret", b"purpose").of(text)
    assert shared.of(text) != ContentDigest.derived(b"other secret", b"purpose").of(text)
    # only the head counts: texts that open alike share a key (their states are compared in full)
    assert a.of("x" * 4096 + "one") == a.of("x" * 4096 + "two") and a.of("one") != a.of("two")
    assert a.of("é" * 5000) == a.of("é" * 2048 + "tail")  # 4,096 UTF-8 bytes


@pytest.mark.parametrize("bad", [5, b"acme", ["a"], 1.5])
def test_a_tenant_must_be_a_str(bad):
    with pytest.raises(TypeError, match="tenant must be str or None"):
        check_tenant(bad)
    assert check_tenant(None) is None and check_tenant("a") == "a"
