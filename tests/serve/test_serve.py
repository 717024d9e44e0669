"""The Serve deployment over real HTTP on loopback, and through a DeploymentHandle."""
from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request

import pytest
from tokenizers import Tokenizer

from delta_ray.apps.bundled import bundled_tokenizer_config
from delta_ray.apps.chat_template import ChatTemplate

pytestmark = pytest.mark.ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def service(ray_session, tokenizer_paths):
    from ray import serve

    from delta_ray import serve_app

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = serve_app(tokenizer_paths["qwen-3"], model_name="qwen-3", num_workers=2, max_body_bytes=200_000,
                    tokenizer_config=bundled_tokenizer_config("qwen-3"), chunk_size=8192, cut_threshold=20_000)
    handle = serve.run(app, name="delta-ray-test", route_prefix="/")
    yield f"http://127.0.0.1:{port}", handle
    serve.delete("delta-ray-test")
    serve.shutdown()


def _post(url, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_tokenize_prompt_messages_sessions(service, references, real_texts):
    base, _ = service
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
    with urllib.request.urlopen(f"{base}/health", timeout=30) as r:
        assert r.status == 200


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
])
def test_bad_requests_are_4xx_and_service_keeps_serving(service, references, body, raw, status):
    base, _ = service
    got, out = _post(f"{base}/tokenize", body, raw)
    assert got == status and out["error"]["message"]
    got, out = _post(f"{base}/tokenize", {"prompt": "still serving"})
    assert got == 200 and out["tokens"] == references["qwen-3"].encode("still serving").ids


def test_detokenize_rejects_bad_ids(service):
    base, _ = service
    assert _post(f"{base}/detokenize", {"tokens": [1, -5]})[0] == 400
    assert _post(f"{base}/detokenize", {"tokens": "abc"})[0] == 400


def test_concurrent_clients(service, references, real_texts):
    base, _ = service
    ref = references["qwen-3"]
    errors = []

    def client(i):
        conv = real_texts["multilingual"][i * 3000:(i + 1) * 3000]
        for turn in range(4):
            conv += f" turn {turn} " + real_texts["english"][turn * 500:(turn + 1) * 500]
            status, out = _post(f"{base}/tokenize", {"prompt": conv, "session_id": f"cc{i}"})
            if status != 200 or out["tokens"] != ref.encode(conv).ids:
                errors.append((i, turn, status))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_deployment_handle(service, references):
    _, handle = service
    out = handle.tokenize.remote({"prompt": "composed call"}).result()
    assert out["tokens"] == references["qwen-3"].encode("composed call").ids
    assert handle.detokenize.remote({"tokens": out["tokens"]}).result()["prompt"] == "composed call"


def test_nested_json_is_a_400_without_internals(service):
    base, _ = service
    got, out = _post(f"{base}/tokenize", None, b'{"prompt": "x", "tools": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")
    assert got == 400 and "Traceback" not in out["error"]["message"] and len(out["error"]["message"]) < 300


def test_a_chunked_upload_is_refused_while_it_streams(service):
    """No Content-Length: the body limit still holds while the body streams in."""
    import http.client
    base, _ = service
    host, port = base.rsplit("/", 1)[-1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    sent = 0

    def chunks():
        nonlocal sent
        yield b'{"prompt": "'
        for _ in range(200):  # 200 x 64 KiB = 12.5 MiB against a 200 KB limit
            sent += 65536
            yield b"x" * 65536
        yield b'"}'
    try:
        conn.request("POST", "/tokenize", body=chunks(), headers={"Content-Type": "application/json"},
                     encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server hung up mid-upload: refused while streaming
    finally:
        conn.close()
    got, _ = _post(f"{base}/tokenize", {"prompt": "still serving"})
    assert got == 200


def test_keyless_long_prompts_never_share_state_across_tenants(service, references):
    """A keyless non-ASCII prompt of >= 4 KB is reused only inside its tenant (no timing oracle)."""
    from delta_ray.core.keys import ContentDigest, content_key
    base, _ = service
    text = "é" * 3000  # 3,000 characters, 6,000 UTF-8 bytes
    for tenant in ("victim", "attacker"):
        got, out = _post(f"{base}/tokenize", {"prompt": text, "cache_salt": tenant})
        assert got == 200 and out["tokens"] == references["qwen-3"].encode(text).ids
    digest = ContentDigest().of(text)
    assert content_key(digest, "victim") != content_key(digest, "attacker")


def test_append_over_http_sends_and_receives_only_the_change(service, references, real_texts):
    """A client appends a delta to its session and receives the IDs from the first one that changed;
    its previous IDs cut at `start` plus the tail are exactly the reference's IDs of the whole text."""
    base, _ = service
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


def test_require_tenant_refuses_requests_without_one(service, tokenizer_paths, references):
    """With require_tenant, a session id is never a name shared by every caller."""
    from ray import serve

    from delta_ray import serve_app
    base, _ = service
    app = serve_app(tokenizer_paths["qwen-3"], model_name="qwen-3", num_workers=1, require_tenant=True)
    serve.run(app, name="delta-ray-tenant", route_prefix="/t")
    try:
        got, out = _post(f"{base}/t/tokenize", {"prompt": "hello", "session_id": "shared-name"})
        assert got == 400 and "cache_salt" in out["error"]["message"]
        got, out = _post(f"{base}/t/tokenize", {"prompt": "hello", "session_id": "s", "cache_salt": "acme"})
        assert got == 200 and out["tokens"] == references["qwen-3"].encode("hello").ids
    finally:
        serve.delete("delta-ray-tenant")


# -- session routing: sessions served where they arrive ------------------------------------------------------
def test_session_router_ranks_replicas_by_rendezvous_over_crc32():
    """Ray-free: a keyed request ranks the home first, then its fallbacks; a keyless one gets two random."""
    import asyncio
    from types import SimpleNamespace

    from delta_ray.actors.serve_router import SessionRouter, routing_headers
    from delta_ray.scheduler.routing import rendezvous_order

    replicas = [SimpleNamespace(replica_id=SimpleNamespace(unique_id=u)) for u in ("r1ab", "x9cd", "q0ef", "zz12")]
    ids = [r.replica_id.unique_id for r in replicas]

    def pending(key):
        return SimpleNamespace(metadata=SimpleNamespace(session_id=key), routing_context=SimpleNamespace(
            should_backoff=False))

    router = SessionRouter.__new__(SessionRouter)
    router.initialize_state(num_fallback_replicas=1)
    homes = set()
    for i in range(64):
        key = routing_headers(f"conv-{i}", "acme")["x-session-id"]
        ranks = asyncio.run(router.choose_replicas(replicas, pending(key)))
        assert [r[0].replica_id.unique_id for r in ranks] == rendezvous_order(key, ids)[:2]
        homes.add(ranks[0][0].replica_id.unique_id)
    assert homes == set(ids)  # 64 sessions reach every replica
    ranks = asyncio.run(router.choose_replicas(replicas, pending("")))
    assert len(ranks) == 1 and len(ranks[0]) == 2 and len({r.replica_id.unique_id for r in ranks[0]}) == 2
    router.initialize_state(num_fallback_replicas=0)
    assert len(asyncio.run(router.choose_replicas(replicas, pending("k")))) == 1
    with pytest.raises(ValueError):
        router.initialize_state(num_fallback_replicas=-1)
    # The routing key is a digest of the tenant-namespaced session key: one name, two tenants, two keys.
    assert routing_headers("c", "a") != routing_headers("c", "b") != routing_headers("c", None)
    assert routing_headers(None, "a") == {}


@pytest.fixture(scope="module")
def routed(service, tokenizer_paths):
    """Two replicas behind the session router, no pool: every session turn runs in a replica."""
    from ray import serve

    from delta_ray import serve_app
    base, _ = service
    app = serve_app(tokenizer_paths["qwen-3"], model_name="qwen-3", num_replicas=2, replica_cpus=0.1)
    serve.run(app, name="delta-ray-routed", route_prefix="/r")
    yield f"{base}/r"
    serve.delete("delta-ray-routed")


def _post_h(url, body, headers):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), e.headers


def test_sessions_run_on_their_rendezvous_home_without_a_second_hop(routed, references, real_texts):
    """Every turn of a session lands on one replica, the rendezvous home of its tenant-namespaced key
    over the running replicas, which holds its state after the first turn; every answer exact."""
    from delta_ray.actors.serve_router import routing_headers
    from delta_ray.scheduler.routing import rendezvous_order
    ref = references["qwen-3"]
    sessions = [(f"s{i}", ("acme", "globex")[i % 2]) for i in range(12)]
    texts = {s: real_texts["english"][i * 1000: i * 1000 + 6000] for i, s in enumerate(sessions)}
    where: dict = {}
    versions: dict = {}
    for turn in range(3):
        for i, (sid, tenant) in enumerate(sessions):
            texts[(sid, tenant)] += f"\nturn {turn}: " + real_texts["code"][(i * 3 + turn) * 400:(i * 3 + turn + 1) * 400]
            got, out, h = _post_h(f"{routed}/tokenize", {"prompt": texts[(sid, tenant)], "session_id": sid,
                                                         "cache_salt": tenant}, routing_headers(sid, tenant))
            assert got == 200 and out["tokens"] == ref.encode(texts[(sid, tenant)]).ids
            versions[(sid, tenant)] = out["session_version"]
            where.setdefault((sid, tenant), []).append((h["x-delta-ray-replica"], h["x-delta-ray-session"]))
    replicas = {r for turns in where.values() for r, _ in turns}
    assert len(replicas) == 2  # both replicas serve sessions
    for (sid, tenant), turns in where.items():
        assert len({r for r, _ in turns}) == 1, turns  # one replica for all of a session's turns
        assert [w for _, w in turns] == ["new", "held", "held"]
        key = routing_headers(sid, tenant)["x-session-id"]
        assert turns[0][0] == rendezvous_order(key, replicas)[0]
    # Append on the home: only the tail comes back, spliced it is the reference's IDs.
    sid, tenant = sessions[0]
    ids = ref.encode(texts[(sid, tenant)]).ids
    delta = "\nUser: and then?"
    got, out, h = _post_h(f"{routed}/tokenize", {"append": delta, "session_id": sid, "cache_salt": tenant,
                                                 "session_version": versions[(sid, tenant)]},
                          routing_headers(sid, tenant))
    assert got == 200 and h["x-delta-ray-replica"] == where[(sid, tenant)][0][0]
    texts[(sid, tenant)] += delta
    assert ids[:out["start"]] + out["tokens"] == ref.encode(texts[(sid, tenant)]).ids


def test_a_forged_routing_header_reaches_a_replica_never_a_state(routed, references):
    """The header only routes: another tenant sending the victim's routing key gets its own session
    (none: 409 on append), and the victim's state is untouched."""
    from delta_ray.actors.serve_router import routing_headers
    ref = references["qwen-3"]
    victim = routing_headers("chat", "victim")
    text = "secret plans " * 200
    got, out, _ = _post_h(f"{routed}/tokenize", {"prompt": text, "session_id": "chat", "cache_salt": "victim"}, victim)
    assert got == 200
    version = out["session_version"]
    got, out, h = _post_h(f"{routed}/tokenize", {"append": " leaked?", "session_id": "chat", "cache_salt": "evil",
                                                 "session_version": version}, victim)
    assert got == 409 and "secret" not in json.dumps(out)
    got, out, h = _post_h(f"{routed}/tokenize", {"prompt": "mine", "session_id": "chat", "cache_salt": "evil"}, victim)
    assert got == 200 and out["tokens"] == ref.encode("mine").ids and h["x-delta-ray-session"] == "new"
    got, out, _ = _post_h(f"{routed}/tokenize", {"append": " more", "session_id": "chat", "cache_salt": "victim",
                                                 "session_version": version}, victim)
    full = ref.encode(text + " more").ids
    assert got == 200 and ref.encode(text).ids[:out["start"]] + out["tokens"] == full


def test_sessions_moved_by_a_redeploy_reinitialize_exactly(service, tokenizer_paths, references, real_texts):
    """Replicas replaced (scale-out with autoscaling): a whole transcript re-initializes on its new
    home, exact; an append to a session the new home lacks is a 409, and after the client resends
    the whole transcript, appends work again."""
    from ray import serve

    from delta_ray import serve_app
    from delta_ray.actors.serve_router import routing_headers
    base, _ = service
    ref = references["qwen-3"]
    url = f"{base}/m/tokenize"
    serve.run(serve_app(tokenizer_paths["qwen-3"], num_replicas=1, replica_cpus=0.1), name="delta-ray-moves",
              route_prefix="/m")
    try:
        sessions = [f"m{i}" for i in range(6)]
        texts = {s: real_texts["multilingual"][i * 2000:(i + 1) * 2000] for i, s in enumerate(sessions)}
        versions = {}
        for s in sessions:
            got, out, h = _post_h(url, {"prompt": texts[s], "session_id": s, "cache_salt": "t"}, routing_headers(s, "t"))
            assert got == 200 and out["tokens"] == ref.encode(texts[s]).ids
            versions[s] = out["session_version"]
        before = h["x-delta-ray-replica"]
        app = serve_app(tokenizer_paths["qwen-3"], replica_cpus=0.1,
                        autoscaling_config={"min_replicas": 2, "max_replicas": 3, "target_ongoing_requests": 4})
        serve.run(app, name="delta-ray-moves", route_prefix="/m")
        resent = 0
        for s in sessions:
            delta = f"\nnext {s}"
            got, out, h = _post_h(url, {"append": delta, "session_id": s, "cache_salt": "t",
                                        "session_version": versions[s]}, routing_headers(s, "t"))
            assert h["x-delta-ray-replica"] != before
            if got == 409:  # not held on its new home: resend the whole transcript
                resent += 1
                texts[s] += delta
                got, out, h = _post_h(url, {"prompt": texts[s], "session_id": s, "cache_salt": "t"},
                                      routing_headers(s, "t"))
                assert got == 200 and h["x-delta-ray-session"] == "new"
                assert out["tokens"] == ref.encode(texts[s]).ids
                versions[s] = out["session_version"]
            else:
                pytest.fail(f"append answered {got} on a replica that never held {s}")
            got, out, h = _post_h(url, {"append": "!", "session_id": s, "cache_salt": "t",
                                        "session_version": versions[s]}, routing_headers(s, "t"))
            ids = ref.encode(texts[s]).ids
            texts[s] += "!"
            assert got == 200 and ids[:out["start"]] + out["tokens"] == ref.encode(texts[s]).ids
        assert resent == len(sessions)
        replicas = {_post_h(url, {"prompt": "x", "session_id": s}, routing_headers(s, None))[2]["x-delta-ray-replica"]
                    for s in sessions * 2}
        assert len(replicas) >= 2  # autoscaling's minimum is running and routed to
    finally:
        serve.delete("delta-ray-moves")
