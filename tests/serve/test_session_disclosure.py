"""What the one-process server tells a client about other clients' content: the
``x-delta-ray-session`` header says held/new only for the client's own key space (a tenant, or a
session it names), never for keyless content that every tenantless client shares, and the
counters that count held against new (``/metrics``) are not served unless the operator asks.
Without a tenant a client could otherwise learn, one request per guess and without noise, whether
another client sent a text with the same 4,096-byte opening (docs/threat-model.md, "HTTP")."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

# Keyless prompts from 4,096 UTF-8 bytes are reused by content (inside their tenant), keyed by
# their first 4,096 bytes: each test's texts open with a tag of their own.
OPENING = "The quarterly figures for the northern region, confidential draft. " * 80


def _opening(tag: str) -> str:
    return f"[{tag}] {OPENING}"


@pytest.fixture(scope="module")
def srv(tokenizer_paths):
    from conftest import LocalThread
    s = LocalThread(tokenizer_paths["qwen-3"])  # the defaults: no metrics option
    yield s
    s.stop()


def _post(base: str, body: dict) -> "tuple[int, str]":
    req = urllib.request.Request(f"{base}/tokenize", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
        return r.status, r.headers["x-delta-ray-session"]


def test_metrics_are_not_served_unless_asked_for(srv, local_host):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{srv.base}/metrics", timeout=30)
    assert err.value.code == 404
    with urllib.request.urlopen(f"{local_host.base}/metrics", timeout=30) as r:  # metrics=True (conftest)
        assert r.status == 200 and b"delta_ray_requests" in r.read()


def test_keyless_content_without_a_tenant_is_not_flagged_held_or_new(srv):
    """The victim sends a text; the attacker's guess with the same opening must not read "held"."""
    assert _post(srv.base, {"prompt": _opening("guess") + "victim's numbers: 17, 42."}) == (200, "-")
    assert _post(srv.base, {"prompt": _opening("guess") + "attacker's guess."}) == (200, "-")


def test_the_operator_still_counts_held_and_new(local_host):
    """The counters the header does not show are still kept, and served with metrics=True."""
    def held() -> int:
        with urllib.request.urlopen(f"{local_host.base}/metrics", timeout=30) as r:
            lines = r.read().decode().splitlines()
        name = 'delta_ray_requests{path="serve_session_held"}'
        return sum(int(x.rsplit(" ", 1)[1]) for x in lines if x.startswith(name))
    before = held()
    text = _opening("counted") + "counted twice."
    assert _post(local_host.base, {"prompt": text})[0] == 200
    assert _post(local_host.base, {"prompt": text})[0] == 200
    assert held() == before + 1


@pytest.mark.parametrize("key", [{"cache_salt": "tenant-a"}, {"session_id": "chat-1"},
                                 {"session_id": "chat-2", "cache_salt": "tenant-a"}],
                         ids=["tenant", "session", "session-of-tenant"])
def test_a_tenant_or_a_named_session_still_reads_held_or_new(srv, key):
    """Inside a tenant, or for a session the client names, held/new is the client's own: the first
    answer is "new", the next "held" (for a name without a tenant it tells only whether that name
    was used, which whoever knows the name may learn anyway, by sending a turn)."""
    text = _opening(str(sorted(key.items())))
    assert _post(srv.base, {"prompt": text, **key}) == (200, "new")
    assert _post(srv.base, {"prompt": text + " more", **key}) == (200, "held")
