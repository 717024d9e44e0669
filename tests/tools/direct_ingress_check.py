"""Run by tests/serve/test_serve_direct_ingress.py in a fresh process: Serve with direct ingress (Ray 2.60).

The flag is read when Ray starts (by the controller and the replicas), so it needs its own Ray.
Two replicas each listen for HTTP; a client routes each session by rendezvous over the replica ids
(what a load balancer would do), sends whole transcripts and appends straight to the replica, and
every answer is compared with the reference. Misrouted and malformed requests must stay exact or
get a 4xx, and the replica keeps serving.
"""
import json
import os
import socket
import sys
import urllib.error
import urllib.request

os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"
os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "1"  # before Ray starts: its processes inherit it
import ray  # noqa: E402
from ray import serve  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from delta_ray import serve_app  # noqa: E402
from delta_ray.actors.local_ray import local_init_kwargs  # noqa: E402
from delta_ray.actors.serve import replica_endpoints  # noqa: E402
from delta_ray.actors.tenant_keys import routing_key  # noqa: E402
from delta_ray.apps.bundled import bundled_tokenizer_config, bundled_tokenizer_path  # noqa: E402
from delta_ray.apps.sample_text import stdlib_prose  # noqa: E402
from delta_ray.scheduler.routing import rendezvous_order  # noqa: E402


def post(port, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "qwen-3"
    path = bundled_tokenizer_path(name)
    ref = Tokenizer.from_file(path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        proxy_port = s.getsockname()[1]
    ray.init(**local_init_kwargs(num_cpus=2))
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": proxy_port})
        serve.run(serve_app(path, model_name=name, tokenizer_config=bundled_tokenizer_config(name),
                            num_replicas=2, cut_threshold=20_000, chunk_size=8192), name="di", route_prefix="/")
        ends = replica_endpoints("di")
        assert len(ends) == 2, f"expected two direct-ingress replicas, got {ends}"
        port_of = {rid: port for _, port, rid in ends}
        assert proxy_port not in port_of.values()
        text = stdlib_prose()[:60_000]
        for s in range(4):
            sid, tenant = f"chat-{s}", "acme"
            home = rendezvous_order(routing_key(sid, tenant), list(port_of))[0]
            port = port_of[home]
            t = f"[{s}]" + text[s * 5000:s * 5000 + 25_000]
            got, out = post(port, {"prompt": t, "session_id": sid, "cache_salt": tenant})
            assert got == 200 and out["tokens"] == ref.encode(t).ids, (got, out.get("error"))
            ids, version = out["tokens"], out["session_version"]
            for turn in range(3):
                delta = f"\nUser: turn {turn}?\nAssistant: " + text[turn * 700:turn * 700 + 700]
                t += delta
                if turn % 2:  # the whole transcript, as a vLLM client sends it
                    got, out = post(port, {"prompt": t, "session_id": sid, "cache_salt": tenant})
                    assert got == 200 and out["tokens"] == ref.encode(t).ids
                    ids, version = out["tokens"], out["session_version"]
                else:  # only the append: the answer is the tail from `start`
                    got, out = post(port, {"append": delta, "session_id": sid, "cache_salt": tenant,
                                           "session_version": version})
                    assert got == 200 and len(out["tokens"]) < 600, (got, out.get("error"))
                    ids, version = ids[:out["start"]] + out["tokens"], out["session_version"]
                    assert ids == ref.encode(t).ids and out["count"] == len(ids)
            # The other replica does not hold the session: an append there is a 409, a whole
            # transcript a re-initialization, exact.
            other = port_of[[r for r in port_of if r != home][0]]
            got, out = post(other, {"append": "x", "session_id": sid, "cache_salt": tenant, "session_version": version})
            assert got == 409 and "send the whole text" in out["error"]["message"]
            got, out = post(other, {"prompt": t, "session_id": sid, "cache_salt": tenant})
            assert got == 200 and out["tokens"] == ref.encode(t).ids
        for raw in (b"{not json", b"[1, 2]", json.dumps({"prompt": 5}).encode()):
            assert 400 <= post(ends[0][1], None, raw=raw)[0] < 500
        got, out = post(ends[0][1], {"prompt": "still serving"})
        assert got == 200 and out["tokens"] == ref.encode("still serving").ids
        serve.shutdown()
    finally:
        ray.shutdown()
    print("DIRECT INGRESS OK", flush=True)


if __name__ == "__main__":
    main()
