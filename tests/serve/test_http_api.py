"""Ray-free validation of the /tokenize and /detokenize bodies."""
from __future__ import annotations

import pytest

from delta_ray.server.http_api import BadRequest, parse_detokenize, parse_tokenize


def test_prompt_and_defaults():
    r = parse_tokenize({"prompt": "hi", "model": "m"}, {"m"})
    assert r.prompt == "hi" and r.add_special_tokens is True and r.session is None
    r = parse_tokenize({"messages": [{"role": "user", "content": "x"}]}, {"m"})
    assert r.add_special_tokens is False and r.add_generation_prompt is True


@pytest.mark.parametrize("body, status", [
    ([], 400), ({"prompt": 1}, 400), ({"prompt": "x", "zzz": 0}, 400), ({}, 400),
    ({"prompt": "x", "messages": []}, 400), ({"prompt": "x", "model": "other"}, 404),
    ({"messages": ["x"]}, 400), ({"prompt": "x", "session_id": ""}, 400),
    ({"prompt": "x", "continue_final_message": True}, 400), ({"prompt": "x", "return_token_strs": 1}, 400),
])
def test_bad_tokenize_bodies(body, status):
    with pytest.raises(BadRequest) as info:
        parse_tokenize(body, {"m"})
    assert info.value.status == status and str(info.value)


def test_detokenize_and_sessions():
    assert parse_detokenize({"tokens": [0, 5]}, set(), 10) == [0, 5]
    for bad in ({"tokens": [10]}, {"tokens": [True]}, {"tokens": "x"}, {"tokens": [1], "x": 1}):
        with pytest.raises(BadRequest):
            parse_detokenize(bad, set(), 10)


def test_nested_or_malformed_json_is_a_400():
    from delta_ray.server.http_api import loads_json
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"prompt": ', b"\xff\xfe", b'{"a": NaN'):
        with pytest.raises(BadRequest) as exc:
            loads_json(raw)
        assert exc.value.status == 400 and len(str(exc.value)) < 300


def test_ids_serialize_from_their_buffer():
    import numpy as np

    from delta_ray.server.http_api import dumps_json
    out = dumps_json({"count": 3, "tokens": np.array([1, 2, 3], dtype=np.int32)})
    assert out == b'{"count":3,"tokens":[1,2,3]}'


def test_the_routing_header_carries_a_digest_not_the_tenant():
    """x-session-id routes by a digest of the tenant-namespaced key: stable, distinct per tenant,
    a valid header value, and neither the cache_salt nor the session id appears in it."""
    from delta_ray.actors.tenant_keys import routing_key
    salt = "acme-secret-salt"
    key = routing_key("chat-42", salt)
    assert key == routing_key("chat-42", salt) and key.isascii() and key.isprintable()
    assert salt not in key and "chat-42" not in key and "acme" not in key
    assert len({routing_key("c", t) for t in (None, "", "a", "b")}) == 4
    assert routing_key("日本", "\u0000t").isascii() and routing_key(None, salt) is None
    assert routing_key("corp:chat1", "acme") != routing_key("chat1", "acme:corp")  # injective underneath


def test_append_takes_a_version_and_its_sessions_flag_by_default():
    r = parse_tokenize({"append": "x", "session_id": "s", "session_version": "v1"}, set())
    assert r.append == "x" and r.session_version == "v1" and r.add_special_tokens is None
    r = parse_tokenize({"append": "x", "session_id": "s", "session_version": "v1", "add_special_tokens": False}, set())
    assert r.add_special_tokens is False
    for body in ({"append": "x", "session_id": "s"}, {"append": "x", "session_id": "s", "session_version": ""},
                 {"prompt": "x", "session_version": "v"}):
        with pytest.raises(BadRequest, match="session_version"):
            parse_tokenize(body, set())


def test_detokenize_size_is_capped_before_validation():
    from delta_ray.server.http_api import detokenize_size
    assert detokenize_size({"tokens": [1, 2]}, 2) == 2 and detokenize_size({"tokens": "x"}, 2) == 0
    with pytest.raises(BadRequest) as info:
        detokenize_size({"tokens": [1, 2, 3]}, 2)
    assert info.value.status == 413


def test_names_are_bounded_and_never_echoed_at_length():
    """Names are hashed and compared on the event loop, and error messages quote them: a 10 MB
    session_id or model is refused at once, and unknown fields are named briefly."""
    long = "n" * 100_000
    for field in ("session_id", "cache_salt", "model"):
        with pytest.raises(BadRequest, match=field) as info:
            parse_tokenize({"prompt": "x", field: long}, {"m"})
        assert info.value.status == 400 and len(str(info.value)) < 200
    with pytest.raises(BadRequest, match="session_version"):
        parse_tokenize({"append": "x", "session_id": "s", "session_version": long}, set())
    with pytest.raises(BadRequest, match="cache_salt"):
        parse_detokenize({"tokens": [1], "cache_salt": long}, set(), 10)
    assert parse_tokenize({"prompt": "x", "session_id": "n" * 4096}, set()).session == "n" * 4096  # the limit
    with pytest.raises(BadRequest) as info:
        parse_tokenize({"prompt": "x", **{f"field{i}" * 1000: 0 for i in range(1000)}}, {"m"})
    assert "and 995 more" in str(info.value) and len(str(info.value)) < 600
    with pytest.raises(BadRequest) as info:
        parse_tokenize({"prompt": "x", "model": "m" * 4096}, {"m"})
    assert info.value.status == 404 and len(str(info.value)) < 200


@pytest.mark.parametrize("salt", ["", " ", "\t\n", "\u3000"])
def test_a_blank_cache_salt_is_never_a_tenant(salt):
    """An empty or whitespace-only ``cache_salt`` is refused with a 400 on every /tokenize body
    (prompt, messages, append): read as a tenant, every client whose salt came out blank would share
    one namespace, which ``--require-tenant`` exists to prevent. The message never echoes the salt."""
    bodies = ({"prompt": "x"}, {"prompt": "x", "session_id": "s"},
              {"messages": [{"role": "user", "content": "x"}]},
              {"append": "x", "session_id": "s", "session_version": "v1"})
    for body in bodies:
        with pytest.raises(BadRequest, match="cache_salt") as info:
            parse_tokenize({**body, "cache_salt": salt}, set())
        assert info.value.status == 400
    # any other string is a tenant, compared exactly (never stripped)
    for tenant in (" a ", "a", "\x00", "0"):
        assert parse_tokenize({"prompt": "x", "cache_salt": tenant}, set()).tenant == tenant


def test_require_tenant_refuses_a_blank_cache_salt(tokenizer_paths, references):
    """The replica's handler (Ray-free) under ``require_tenant``: no salt and a blank salt are each a
    400 naming cache_salt; a real salt is served, equal to the reference. Fails when a blank salt
    passes as a tenant."""
    import asyncio
    import json

    from delta_ray._core.config import TokenizerConfig
    from delta_ray._core.loading import load_tokenizer
    from delta_ray._tokenizer_core import TokenizerCore
    from delta_ray.apps.bundled import bundled_tokenizer_config
    from delta_ray.server.chat_template import ChatTemplate
    from delta_ray.server.serve_handler import RequestHandler

    class NoMetrics:
        def __getattr__(self, name):
            return lambda *a, **k: None

    async def chunks(raw: bytes):
        yield raw

    name = "llama3.2"
    loaded = load_tokenizer(tokenizer_paths[name])
    config = TokenizerConfig(chunk_size=4096, cut_threshold=12_000, threads=1, engine="reference", shadow_rate=0.0)
    h = RequestHandler(loaded, TokenizerCore(loaded, config), served={name}, record=NoMetrics(),
                       template=ChatTemplate.from_config(bundled_tokenizer_config(name)), require_tenant=True)

    def post(body: dict) -> tuple[int, dict]:
        status, data, _ = asyncio.run(h.http("tokenize", None, chunks(json.dumps(body).encode())))
        return status, json.loads(data)

    for extra in ({}, {"cache_salt": ""}, {"cache_salt": "   "}, {"cache_salt": None}):
        status, out = post({"prompt": "hello", "session_id": "shared-name", **extra})
        assert status == 400 and "cache_salt" in out["error"]["message"], extra
    status, out = post({"prompt": "hello", "session_id": "s", "cache_salt": "acme"})
    assert status == 200 and out["tokens"] == references[name].encode("hello").ids
