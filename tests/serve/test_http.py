"""The HTTP API over real HTTP on loopback, once per host: the one-process server (no Ray) and the Ray
Serve app. The same requests get the same answers on both: every 200 is the reference's IDs, bad
input a 4xx with a message, limits a 413, tenants separate, appends a 409 where the state differs."""
from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request

import pytest
from tokenizers import Tokenizer

from delta_ray.apps.bundled import bundled_tokenizer_config
from delta_ray.server.chat_template import ChatTemplate


def _post(url, body, raw=None, headers=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_tokenize_prompt_messages_sessions(host, references, real_texts):
    base = host.base
    ref: Tokenizer = references["qwen-3"]
    text = real_texts["english"][:30_000]
    for special in (True, False):
        status, out = _post(f"{base}/tokenize", {"model": "qwen-3", "prompt": text, "add_special_tokens": special})
        assert status == 200 and out["tokens"] == ref.encode(text, add_special_tokens=special).ids
        assert out["count"] == len(out["tokens"])
    conv = text[:5000]
    for turn in range(4):
        conv += f"\nturn {turn}: " + real_texts["code"][turn * 900:(turn + 1) * 900]
        for tenant in ("a", "b"):
            status, out = _post(f"{base}/tokenize", {"prompt": conv, "session_id": "c1", "cache_salt": tenant})
            assert status == 200 and out["tokens"] == ref.encode(conv).ids
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello <|im_end|> x"}]
    rendered = ChatTemplate.from_config(bundled_tokenizer_config("qwen-3")).render(messages, add_generation_prompt=True)
    status, out = _post(f"{base}/tokenize", {"messages": messages, "add_generation_prompt": True})
    assert status == 200 and out["tokens"] == ref.encode(rendered, add_special_tokens=False).ids
    status, out = _post(f"{base}/detokenize", {"tokens": out["tokens"]})
    assert status == 200 and out["prompt"] == ref.decode(ref.encode(rendered).ids)
    assert _get(f"{base}/health")[0] == 200


def test_a_long_keyless_text_is_cut_and_exact(host, references, real_texts):
    """Past cut_threshold (20,000 here) a keyless text is cut at safe cuts: the pieces run on the
    process's threads (local) or the pool (Serve), and the answer is the reference's."""
    text = (real_texts["code"] + real_texts["multilingual"])[:120_000]
    status, out = _post(f"{host.base}/tokenize", {"prompt": text, "cache_salt": "long"})
    assert status == 200 and out["tokens"] == references["qwen-3"].encode(text).ids


@pytest.mark.parametrize("body, raw, status", [
    (None, b"{not json", 400),
    ({"prompt": 5}, None, 400),
    ({"prompt": "x", "bogus": 1}, None, 400),
    ({"prompt": "x", "messages": []}, None, 400),
    ({}, None, 400),
    ({"prompt": "x", "model": "other-model"}, None, 404),
    ({"prompt": "x" * 300_000}, None, 413),
    (None, b'{"prompt":"x","tools":[' + b"0," * 79_999 + b'0]}', 413),  # 80,000 values in 160 KB: refused unparsed
    ({"messages": [{"content": "no role"}]}, None, 400),
    ({"prompt": "x", "add_special_tokens": "yes"}, None, 400),
    ({"prompt": "x", "session_id": "s" * 5000}, None, 400),  # names are capped
])
def test_bad_requests_are_4xx_and_service_keeps_serving(host, references, body, raw, status):
    got, out = _post(f"{host.base}/tokenize", body, raw)
    assert got == status and out["error"]["message"]
    got, out = _post(f"{host.base}/tokenize", {"prompt": "still serving"})
    assert got == 200 and out["tokens"] == references["qwen-3"].encode("still serving").ids


def test_detokenize_rejects_bad_ids(host):
    assert _post(f"{host.base}/detokenize", {"tokens": [1, -5]})[0] == 400
    assert _post(f"{host.base}/detokenize", {"tokens": "abc"})[0] == 400


def test_unknown_routes_and_methods_are_json_errors(host):
    status, data = _get(f"{host.base}/tokenize")
    assert status == 405 and json.loads(data)["error"]["code"] == 405
    status, data = _get(f"{host.base}/no-such-route")
    assert status == 404 and json.loads(data)["error"]["message"]


def test_concurrent_clients(host, references, real_texts):
    ref = references["qwen-3"]
    errors = []

    def client(i):
        conv = real_texts["multilingual"][i * 3000:(i + 1) * 3000]
        for turn in range(4):
            conv += f" turn {turn} " + real_texts["english"][turn * 500:(turn + 1) * 500]
            status, out = _post(f"{host.base}/tokenize", {"prompt": conv, "session_id": f"cc{i}"})
            if status != 200 or out["tokens"] != ref.encode(conv).ids:
                errors.append((i, turn, status))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_nested_json_is_a_400_without_internals(host):
    got, out = _post(f"{host.base}/tokenize", None, b'{"prompt": "x", "tools": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")
    assert got == 400 and "Traceback" not in out["error"]["message"] and len(out["error"]["message"]) < 300


def test_a_chunked_upload_is_refused_while_it_streams(host):
    """No Content-Length: the body limit still holds while the body streams in."""
    hostport = host.base.split("/")[2]
    prefix = host.base.split(hostport, 1)[1]
    h, port = hostport.split(":")
    conn = http.client.HTTPConnection(h, int(port), timeout=60)
    sent = 0

    def chunks():
        nonlocal sent
        yield b'{"prompt": "'
        for _ in range(200):  # 200 x 64 KiB = 12.5 MiB against a 200 KB limit
            sent += 65536
            yield b"x" * 65536
        yield b'"}'
    try:
        conn.request("POST", f"{prefix}/tokenize", body=chunks(), headers={"Content-Type": "application/json"},
                     encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server hung up mid-upload: refused while streaming
    finally:
        conn.close()
    assert _post(f"{host.base}/tokenize", {"prompt": "still serving"})[0] == 200


def test_keyless_long_prompts_never_share_state_across_tenants(host, references):
    """A keyless non-ASCII prompt of >= 4 KB is reused only inside its tenant (no timing oracle)."""
    from delta_ray._core.keys import ContentDigest, content_key
    text = "é" * 3000  # 3,000 characters, 6,000 UTF-8 bytes
    for tenant in ("victim", "attacker"):
        got, out = _post(f"{host.base}/tokenize", {"prompt": text, "cache_salt": tenant})
        assert got == 200 and out["tokens"] == references["qwen-3"].encode(text).ids
        assert "session_version" not in out  # content reuse is the server's, never a session a client extends
    digest = ContentDigest().of(text)
    assert content_key(digest, "victim") != content_key(digest, "attacker")


def test_append_over_http_sends_and_receives_only_the_change(host, references, real_texts):
    """A client appends a delta to its session and receives the IDs from the first one that changed;
    its previous IDs cut at `start` plus the tail are exactly the reference's IDs of the whole text."""
    base = host.base
    ref = references["qwen-3"]
    text = real_texts["english"][:30_000]
    got, out = _post(f"{base}/tokenize", {"prompt": text, "session_id": "app", "cache_salt": "t"})
    assert got == 200
    ids, version = out["tokens"], out["session_version"]
    for i in range(4):
        delta = f"\nUser: question {i}?\nAssistant:" + real_texts["code"][i * 300:(i + 1) * 300]
        text += delta
        got, out = _post(f"{base}/tokenize", {"append": delta, "session_id": "app", "cache_salt": "t",
                                              "session_version": version})
        assert got == 200 and 0 < out["start"] <= len(ids)
        assert len(out["tokens"]) < 400  # kilobytes, not the transcript's IDs
        ids, version = ids[:out["start"]] + out["tokens"], out["session_version"]
        assert ids == ref.encode(text).ids and out["count"] == len(ids)
    got, out = _post(f"{base}/tokenize", {"append": "x", "session_id": "app", "cache_salt": "t"})
    assert got == 400 and "session_version" in out["error"]["message"]  # which state it extends is not optional
    got, out = _post(f"{base}/tokenize", {"append": "x", "session_id": "unknown-session", "session_version": version})
    assert got == 409 and "send the whole text" in out["error"]["message"]
    assert _post(f"{base}/tokenize", {"append": "x", "prompt": "y", "session_id": "app"})[0] == 400
    assert _post(f"{base}/tokenize", {"append": "x"})[0] == 400


def test_a_retried_append_is_a_409_not_applied_twice(host, references):
    """The answer to an append was lost and the client sends it again with the version it had: the
    server holds the next state, so the retry is a 409; the text is never extended twice."""
    ref = references["qwen-3"]
    body = {"session_id": "retry", "cache_salt": "t"}
    text = "The quick brown fox. " * 300
    got, out = _post(f"{host.base}/tokenize", {"prompt": text, **body})
    ids, sent = out["tokens"], out["session_version"]
    got, out = _post(f"{host.base}/tokenize", {"append": " once.", "session_version": sent, **body})
    assert got == 200
    ids, version = ids[:out["start"]] + out["tokens"], out["session_version"]
    got, out = _post(f"{host.base}/tokenize", {"append": " once.", "session_version": sent, **body})
    assert got == 409 and "send the whole text" in out["error"]["message"] and "'t'" not in out["error"]["message"]
    got, out = _post(f"{host.base}/tokenize", {"append": " twice.", "session_version": version, **body})
    assert got == 200 and ids[:out["start"]] + out["tokens"] == ref.encode(text + " once. twice.").ids


def test_an_append_after_a_turn_served_elsewhere_is_a_409(host, other, references):
    """A turn served by another instance (a fallback replica, another process) leaves this one's
    state stale: an append here with the other's version is a 409, never the stale text extended;
    after the whole transcript is resent, appends work again."""
    ref = references["qwen-3"]
    body = {"session_id": "moved", "cache_salt": "acme"}
    text = "Once upon a time, " * 200
    assert _post(f"{host.base}/tokenize", {"prompt": text, **body})[0] == 200
    text += "a second turn, served elsewhere."
    got, out = _post(f"{other.base}/tokenize", {"prompt": text, **body})
    assert got == 200 and out["tokens"] == ref.encode(text).ids
    got, out = _post(f"{host.base}/tokenize", {"append": " third.", "session_version": out["session_version"], **body})
    assert got == 409 and "send the whole text" in out["error"]["message"]
    got, out = _post(f"{host.base}/tokenize", {"prompt": text, **body})
    assert got == 200 and out["tokens"] == ref.encode(text).ids
    ids = out["tokens"]
    got, out = _post(f"{host.base}/tokenize", {"append": " third.", "session_version": out["session_version"], **body})
    assert got == 200 and ids[:out["start"]] + out["tokens"] == ref.encode(text + " third.").ids


def test_require_tenant_refuses_requests_without_one(other, references):
    """With require_tenant, a session id is never a name shared by every caller."""
    got, out = _post(f"{other.base}/tokenize", {"prompt": "hello", "session_id": "shared-name"})
    assert got == 400 and "cache_salt" in out["error"]["message"]
    got, out = _post(f"{other.base}/tokenize", {"prompt": "hello", "session_id": "s", "cache_salt": "acme"})
    assert got == 200 and out["tokens"] == references["qwen-3"].encode("hello").ids


def test_the_local_server_counts_requests_at_metrics(local_host):
    """The one-process server has no Ray metrics export: its counters are served in Prometheus' format."""
    def count(text: str, line: str) -> int:
        return sum(int(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(line))
    before = _get(f"{local_host.base}/metrics")[1].decode()
    assert _post(f"{local_host.base}/tokenize", {"prompt": "counted"})[0] == 200
    assert _post(f"{local_host.base}/tokenize", {"prompt": 5})[0] == 400
    status, data = _get(f"{local_host.base}/metrics")
    after = data.decode()
    assert status == 200 and "# TYPE delta_ray_http_responses counter" in after
    ok, bad = 'delta_ray_http_responses{endpoint="tokenize",status="200"}', \
        'delta_ray_http_responses{endpoint="tokenize",status="400"}'
    assert count(after, ok) == count(before, ok) + 1 and count(after, bad) == count(before, bad) + 1
