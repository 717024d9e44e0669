"""The HTTP section: delta-ray's servers beside a plain FastAPI + fastokens server, a chat turn by turn.

Side by side, each on loopback with one persistent connection: the plain server (uvicorn +
FastAPI, fastokens with its segment cache, the whole transcript re-encoded every request), delta-ray's
one-process server (``delta-ray serve --local``: uvicorn, no Ray), and delta-ray's Ray Serve app
through Serve's proxy and, where the demo's Ray runs direct ingress, straight to its replica.
Each delta-ray server gets the whole transcript every turn in one session and only the new
message (``append``) in another. Every answer is compared with the reference.
"""
from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time

import numpy as np

from bench.harness import free_port
from bench.peers import plain_server as plain_server_script
from delta_ray._core.loading import LoadedTokenizer
from delta_ray.apps.sample_text import chat_transcript

from .baselines import Engines
from .report import Steps, Table, median, ms, progress, quiet_ray_loggers, ratio, size_label, verdict

CHAT_SIZES = (100_000, 1_000_000)
APP = "delta-ray-demo"


def _wait_port(port: int, proc: subprocess.Popen | None, timeout: float = 60) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"a server exited with status {proc.returncode} (its output: the demo's log)")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port} after {timeout:.0f} s")


class _Client:
    """One persistent HTTP/1.1 connection, orjson both ways; IDs back as numpy."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def post(self, body: dict, headers: dict | None = None) -> dict:
        import orjson
        self.conn.request("POST", "/tokenize", body=orjson.dumps(body),
                          headers={"Content-Type": "application/json", **(headers or {})})
        r = self.conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
        doc = orjson.loads(data)
        doc["tokens"] = np.asarray(doc["tokens"], dtype=np.int32)
        return doc

    def close(self) -> None:
        self.conn.close()


class _Server:
    """A delta-ray server's two sessions of one chat: one sent whole every turn, one appended to."""

    def __init__(self, label: str, port: int, tag: str):
        from delta_ray.actors.tenant_keys import routing_key
        self.label, self.client, self.routing_key, self.tag = label, _Client(port), routing_key, tag

    def start(self, n: int, initial: str) -> None:
        # Sessions named per server: the proxy and direct ingress reach the same replica.
        self.a, self.b = f"{self.tag}-{n}-whole", f"{self.tag}-{n}-append"
        self.ha = {"x-session-id": self.routing_key(self.a, None)}  # Serve's router; the local server ignores it
        self.hb = {"x-session-id": self.routing_key(self.b, None)}
        self.client.post({"prompt": initial, "session_id": self.a}, self.ha)
        first = self.client.post({"prompt": initial, "session_id": self.b}, self.hb)
        # An append names the state it extends (the last answer's session_version): a stale or
        # retried append is refused (409) instead of extending the wrong text.
        self.held, self.version = first["tokens"], first["session_version"]

    def whole(self, text: str) -> np.ndarray:
        return self.client.post({"prompt": text, "session_id": self.a}, self.ha)["tokens"]

    def append(self, delta: str) -> np.ndarray:
        doc = self.client.post({"append": delta, "session_id": self.b, "session_version": self.version}, self.hb)
        self.version = doc["session_version"]
        self.held = np.concatenate([self.held[:doc["start"]], doc["tokens"]])
        return self.held


def _direct_ingress_port() -> int | None:
    """The replica's own port when the demo's Ray runs Serve with direct ingress, else None."""
    if os.environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS") != "1":
        return None
    from delta_ray.actors.serve import replica_endpoints
    try:
        ends = replica_endpoints(APP, timeout_s=15)
    except Exception:  # noqa: BLE001 - an experimental Serve internal: the column is left out
        return None
    return ends[0][1] if ends else None


def http_section(eng: Engines, loaded: LoadedTokenizer, turns: int, log_path: str, own_ray: bool) -> bool:
    """A chat session over HTTP on each server, turn by turn; every answer checked."""
    from ray import serve

    from delta_ray.actors.serve import serve_app

    plain_port, local_port, serve_port = free_port(), free_port(), free_port()
    log = open(log_path, "ab")
    env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"}  # the user's defaults
    procs = [subprocess.Popen([sys.executable, str(plain_server_script.__file__), eng.path, str(plain_port)],
                              stdout=log, stderr=log, env=env),
             subprocess.Popen([sys.executable, "-m", "delta_ray.apps.cli", "serve", "--local", "--tokenizer", eng.path,
                               "--port", str(local_port)], stdout=log, stderr=log)]
    ok = True
    servers: list[_Server] = []
    try:
        with progress("starting Ray Serve (delta-ray app), delta-ray's local server and a plain FastAPI + fastokens "
                      "server", 20):
            serve.start(http_options={"host": "127.0.0.1", "port": serve_port})
            quiet_ray_loggers()
            serve.run(serve_app(loaded), name=APP, route_prefix="/")
            for port, proc in ((plain_port, procs[0]), (local_port, procs[1]), (serve_port, None)):
                _wait_port(port, proc)
            di_port = _direct_ingress_port()
        plain = _Client(plain_port)
        servers = [_Server("delta-ray local server (one process, no Ray)", local_port, "local"),
                   _Server("delta-ray on Ray Serve, through its proxy", serve_port, "proxy")]
        if di_port is not None:
            servers.append(_Server("delta-ray on Ray Serve, direct ingress", di_port, "direct"))
        cols = [f"{size_label(n)} {what}" for n in CHAT_SIZES for what in ("whole", "append")]
        t = Table(f"HTTP: a chat session turn by turn (median of {turns} turns, warm; one client, latency with "
                  "the IDs parsed; whole: the transcript sent every turn, append: the new message only)",
                  ["server", *cols, "exact"])
        times: dict = {}
        good_by: dict = {}
        for n in CHAT_SIZES:
            initial, deltas = chat_transcript(n, turns + 1, seed=n)  # the in-process chat's transcripts
            plain.post({"prompt": initial})
            for s in servers:
                s.start(n, initial)
            results = []
            text = initial
            bar = Steps(f"HTTP {size_label(n)}: turns", len(deltas))
            for i, delta in enumerate(deltas):
                text = text + delta
                calls = [("plain", "whole", lambda: plain.post({"prompt": text})["tokens"])]
                for k, s in enumerate(servers):
                    calls += [(k, "whole", lambda s=s: s.whole(text)), (k, "append", lambda s=s, d=delta: s.append(d))]
                for who, what, fn in calls:
                    t0 = time.perf_counter()
                    got = fn()
                    if i >= 1:  # the first turn warms the paths
                        times.setdefault((who, n, what), []).append(time.perf_counter() - t0)
                    results.append((f"{who}/{what}", text, got))
                bar.step()
            for name, flags in eng.check_all(results, "http ").items():
                good_by.setdefault(name.split("/")[0], []).extend(flags)
        plain.close()
        t.add(f"plain FastAPI + {'fastokens' if eng.fastokens else 'tokenizers'}",
              *[ms(median(times.get(("plain", n, what), []))) for n in CHAT_SIZES for what in ("whole", "append")],
              f"{sum(good_by['plain'])}/{len(good_by['plain'])}")
        for k, s in enumerate(servers):
            good = good_by[str(k)]
            ok &= all(good)
            t.add(s.label, *[ms(median(times[(k, n, what)])) for n in CHAT_SIZES for what in ("whole", "append")],
                  f"{sum(good)}/{len(good)}")
        t.print()
        n = CHAT_SIZES[-1]
        p = median(times[("plain", n, "whole")])
        notes = ["one machine: no Ray, no hop", "the proxy's and the replica's hops on every request; replicas "
                 "on many nodes, autoscaling, the session router", "no proxy; the client routes sessions to replicas"]
        for k, s in enumerate(servers):
            w, ap = median(times[(k, n, "whole")]), median(times[(k, n, "append")])
            verdict(f"{s.label}: a {size_label(n)}-character chat {ms(w)} a turn whole ({ratio(p, w)} the plain "
                    f"server's {ms(p)}), {ms(ap)} appended ({ratio(p, ap)}); {notes[k]}; "
                    f"{'all exact' if all(good_by[str(k)]) else 'MISMATCH against the reference'}")
    finally:
        for s in servers:
            s.client.close()
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        # A Ray started here goes down with everything on it. serve.shutdown() would make the
        # controller kill itself, and Ray prints that task's failure on the driver's stdout.
        if not own_ray:
            try:
                serve.delete(APP)
            except Exception:  # noqa: BLE001 - the cluster's Serve keeps running either way
                pass
    return ok
