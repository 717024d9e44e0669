"""What only the Ray Serve host does: handles, the session router over replicas, redeploys. The HTTP
cases both hosts answer alike are in test_http.py."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.ray


def test_deployment_handle(serve_service, references):
    _, handle = serve_service
    out = handle.tokenize.remote({"prompt": "composed call"}).result()
    assert out["tokens"] == references["qwen-3"].encode("composed call").ids
    assert handle.detokenize.remote({"tokens": out["tokens"]}).result()["prompt"] == "composed call"


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
def routed(serve_service, tokenizer_paths):
    """Two replicas behind the session router, no pool: every session turn runs in a replica."""
    from ray import serve

    from delta_ray import serve_app
    base, _ = serve_service
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
            texts[(sid, tenant)] += (f"\nturn {turn}: "
                                     + real_texts["code"][(i * 3 + turn) * 400:(i * 3 + turn + 1) * 400])
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


def test_sessions_moved_by_a_redeploy_reinitialize_exactly(serve_service, tokenizer_paths, references, real_texts):
    """Replicas replaced (scale-out with autoscaling): a whole transcript re-initializes on its new
    home, exact; an append to a session the new home lacks is a 409, and after the client resends
    the whole transcript, appends work again."""
    from ray import serve

    from delta_ray import serve_app
    from delta_ray.actors.serve_router import routing_headers
    base, _ = serve_service
    ref = references["qwen-3"]
    url = f"{base}/m/tokenize"
    serve.run(serve_app(tokenizer_paths["qwen-3"], num_replicas=1, replica_cpus=0.1), name="delta-ray-moves",
              route_prefix="/m")
    try:
        sessions = [f"m{i}" for i in range(6)]
        texts = {s: real_texts["multilingual"][i * 2000:(i + 1) * 2000] for i, s in enumerate(sessions)}
        versions = {}
        for s in sessions:
            got, out, h = _post_h(url, {"prompt": texts[s], "session_id": s, "cache_salt": "t"},
                                  routing_headers(s, "t"))
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
