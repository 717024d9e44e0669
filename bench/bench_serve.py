"""Serve load benchmark: delta-ray's Serve app against what a user could write instead.

Real HTTP on loopback, the same clients for everyone (``--clients`` threads in their own process,
persistent connections, orjson to parse), sessions growing by ``--append`` characters per turn:

* ``plain``: a uvicorn + FastAPI process re-encoding every request whole with fastokens (stdlib json;
  ``bench/peers/servers.py``);
* ``peer``: a Ray Serve deployment re-encoding every request whole with fastokens (orjson, numpy IDs;
  ``bench/peers/servers.py``);
* ``delta``: ``delta_ray.serve_app`` with the whole transcript sent (vLLM body, ``session_id``);
* ``append``: ``delta_ray.serve_app`` with the append API (the delta in, ``start`` + the tail out);
* ``local`` and ``append-local``: the same two on delta-ray's one-process server (``delta-ray serve
  --local``: uvicorn, no Ray), in its own process.

Ray starts only when a Serve mode is asked for (``--modes plain,local,append-local`` runs without it).

Each session's first request (its whole initial text) is a warm-up outside the timed part. Every
answer is checked: its count and the CRC-32 of its IDs (for ``append``, of the IDs spliced from
``start``) against a whole encode of the same text, and the last text of every session against the
reference ``tokenizers``. CPU per request is read from /proc for each process during the timed part
(Serve proxy, replicas, pool workers and tasks, raylet, GCS, the clients, the plain server).

``--direct-ingress`` starts Ray with ``RAY_SERVE_ENABLE_DIRECT_INGRESS=1`` (Ray 2.60): replicas then
listen for HTTP themselves, and every Serve mode is measured through the proxy (head node) and
straight to its replica (``peer-di``, ``delta-di``, ``append-di``).

    .venv/bin/python bench/bench_serve.py                 # short: 100K and 1M, one round
    .venv/bin/python bench/bench_serve.py --rounds 3 --turns 16 --direct-ingress
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import descendants, free_port, proc_stat  # noqa: E402
from bench.peers.servers import plain_server, serve_peer  # noqa: E402

SIZES = {"100k": (100_000, 32), "1m": (1_000_000, 8)}
LOCAL_MODES = ("local", "append-local")  # delta-ray's one-process server: whole transcripts, appends


# -- workload (rebuilt identically in the client process) -------------------------------------------
def workload(size: int, sessions: int, turns: int, append: int) -> tuple[list[str], list[list[str]]]:
    """Initial texts (one per session) and each session's deltas, from the corpus."""
    from delta_ray.apps.sample_text import corpus
    src = corpus("english", size + sessions * 7919 + sessions * turns * append + 10_000)
    bases, deltas = [], []
    pos = size + sessions * 7919
    for s in range(sessions):
        bases.append(f"[session {s}]\n" + src[s * 7919: s * 7919 + size])
        ds = []
        for _ in range(turns):
            ds.append(src[pos: pos + append])
            pos += append
        deltas.append(ds)
    return bases, deltas


_COUNT = re.compile(rb'"count":\s*(\d+)')


def _ids_crc(ids) -> int:
    """CRC-32 of the IDs written as compact JSON ("[1,2,3]"), whatever holds them."""
    import numpy as np
    import orjson
    return zlib.crc32(orjson.dumps(np.asarray(ids, dtype=np.int32), option=orjson.OPT_SERIALIZE_NUMPY))


# -- clients (their own process) ---------------------------------------------------------------------------
def client_main(spec_path: str) -> None:
    import http.client

    import numpy as np
    import orjson

    from delta_ray.actors.serve_router import routing_headers
    from delta_ray.scheduler.routing import rendezvous_order

    spec = json.loads(Path(spec_path).read_text())
    bases, deltas = workload(spec["size"], spec["sessions"], spec["turns"], spec["append"])
    expect = spec["expect"]  # [session][turn] -> [count, CRC of the IDs as compact JSON, CRC as int32]
    mode, nclients = spec["mode"], spec["clients"]
    host, port, path = spec["host"], spec["port"], spec["path"]
    lat: list[float] = []
    errors: list[str] = []
    counters = {"requests": 0, "resends": 0, "bytes_in": 0, "bytes_out": 0, "reinit": 0}
    replicas_seen: set = set()
    lock = threading.Lock()
    go = threading.Event()

    def post(conn, body: dict, headers: dict) -> tuple[int, bytes]:
        data = orjson.dumps(body)
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json", **headers})
        r = conn.getresponse()
        out = r.read()
        with lock:
            counters["bytes_out"] += len(data)
            counters["bytes_in"] += len(out)
            if go.is_set() and r.getheader("x-delta-ray-session") == "new":
                counters["reinit"] += 1  # a timed turn whose session was not held where it ran
            rid = r.getheader("x-delta-ray-replica")
            if rid:
                replicas_seen.add(rid)
        return r.status, out

    def run(c: int, barrier: threading.Barrier, go: threading.Event) -> None:
        conns: dict = {}

        def conn_for(s: int):
            """Direct ingress with several replicas: the client routes each session to its home, by
            the same rendezvous order the in-cluster router uses, over the replica ids."""
            target = (host, port)
            if spec.get("replicas"):
                rid = rendezvous_order(hdrs[s]["x-session-id"], list(spec["replicas"]))[0]
                target = tuple(spec["replicas"][rid])
            if target not in conns:
                conns[target] = http.client.HTTPConnection(*target, timeout=600)
            return conns[target]
        mine = [s for s in range(spec["sessions"]) if s % nclients == c]
        texts = {s: bases[s] for s in mine}
        bufs = {s: np.zeros(0, dtype="<i4") for s in mine}
        counts = {s: 0 for s in mine}
        sid = {s: f"bench-{spec['run']}-{s}" for s in mine}
        tenant = {s: f"tenant-{s % 3}" for s in mine}
        hdrs = {s: routing_headers(sid[s], tenant[s]) for s in mine}
        versions: dict[int, str] = {}  # the session_version of each session's last answer

        def whole(s: int, t: int, timed: bool) -> None:
            t0 = time.perf_counter()
            status, out = post(conn_for(s), {"prompt": texts[s], "session_id": sid[s], "cache_salt": tenant[s]},
                               hdrs[s])
            dt = time.perf_counter() - t0
            if status != 200:
                errors.append(f"session {s} turn {t}: HTTP {status} {out[:200]!r}")
                return
            n, crc, crc32 = expect[s][t]
            if mode == "append":
                ans = orjson.loads(out)
                versions[s] = ans["session_version"]
                bufs[s] = np.asarray(ans["tokens"], dtype="<i4")
                counts[s] = n
                ok = ans["count"] == n and zlib.crc32(bufs[s]) == crc32
            else:
                # Checked without building 250K Python ints (the same cheap check for every server):
                # the count, and the CRC-32 of the IDs array as compact JSON text.
                m = _COUNT.search(out, 0, 200)
                i = out.index(b'"tokens":') + 9
                arr = out[i: out.index(b"]", i) + 1].translate(None, b" \n")
                ok = m is not None and int(m.group(1)) == n and zlib.crc32(arr) == crc
            if not ok:
                errors.append(f"session {s} turn {t}: IDs differ from the reference")
            if timed:
                lat.append(dt)

        def appended(s: int, t: int) -> None:
            t0 = time.perf_counter()
            status, out = post(conn_for(s), {"append": deltas[s][t - 1], "session_id": sid[s], "cache_salt": tenant[s],
                                             "session_version": versions[s]}, hdrs[s])
            if status == 409:  # the session is not held where it landed: resend the whole transcript
                with lock:
                    counters["resends"] += 1
                whole(s, t, False)
                lat.append(time.perf_counter() - t0)
                return
            dt = time.perf_counter() - t0
            if status != 200:
                errors.append(f"session {s} turn {t}: HTTP {status} {out[:200]!r}")
                return
            ans = orjson.loads(out)
            versions[s] = ans["session_version"]
            start, tail = ans["start"], np.asarray(ans["tokens"], dtype="<i4")
            n = ans["count"]
            buf = bufs[s]
            if len(buf) < n:
                grown = np.empty(max(n, int(len(buf) * 1.25) + 4096), dtype="<i4")
                grown[:start] = buf[:start]
                bufs[s] = buf = grown
            buf[start:start + len(tail)] = tail
            counts[s] = n
            en, _, crc32 = expect[s][t]
            if n != en or start + len(tail) != n or zlib.crc32(buf[:n]) != crc32:
                errors.append(f"session {s} turn {t}: spliced IDs differ from the reference")
            lat.append(dt)

        for s in mine:  # warm-up: every session's first (whole) request, untimed
            whole(s, 0, False)
        barrier.wait()
        go.wait()
        for t in range(1, spec["turns"] + 1):
            for s in mine:
                texts[s] += deltas[s][t - 1]
                if mode == "append":
                    appended(s, t)
                else:
                    whole(s, t, True)
                with lock:
                    counters["requests"] += 1
        for c in conns.values():
            c.close()

    barrier = threading.Barrier(nclients + 1)
    threads = [threading.Thread(target=run, args=(c, barrier, go)) for c in range(nclients)]
    for t in threads:
        t.start()
    barrier.wait()
    print("WARM", flush=True)
    sys.stdin.readline()  # the orchestrator samples CPU, then says go
    t0 = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()
    res = {"wall": wall, "requests": counters["requests"], "resends": counters["resends"],
           "reinit": counters["reinit"], "replicas": len(replicas_seen),
           "p50": lat[len(lat) // 2] if lat else float("nan"),
           "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan"),
           "bytes_in": counters["bytes_in"], "bytes_out": counters["bytes_out"], "errors": errors[:20],
           "n_errors": len(errors)}
    print("RESULT " + json.dumps(res), flush=True)


# -- CPU per process from /proc --------------------------------------------------------------------------
def _classify(cmd: str, special: dict[int, str], pid: int) -> str | None:
    if pid in special:
        return special[pid]
    if cmd.startswith("ray::ServeReplica:"):
        return "replica:" + cmd.split(":")[3].split()[0] if cmd.count(":") >= 3 else "replica"
    if cmd.startswith("ray::ProxyActor"):
        return "proxy"
    if cmd.startswith("ray::ServeController"):
        return "controller"
    if cmd.startswith(("ray::TokenizerWorker", "ray::encode_chunks", "ray::warm_chunk_process", "ray::IDLE")):
        return "pool"
    if "raylet" in cmd.split(" ")[0]:
        return "raylet"
    if "gcs_server" in cmd.split(" ")[0]:
        return "gcs"
    return None


def cpu_snapshot(special: dict[int, str]) -> dict[str, float]:
    """CPU seconds so far by kind, over this process's descendants (Ray's processes included)."""
    out: dict[str, float] = {}
    for pid in descendants(os.getpid()) | set(special):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            kind = _classify(cmd, special, pid) or "other-ray"
            out[kind] = out.get(kind, 0.0) + proc_stat(pid)[1] / 1e3
        except (OSError, IndexError, ValueError):
            continue
    return out


# -- orchestration ---------------------------------------------------------------------------------------
def _wait_http(host: str, port: int, path: str = "/tokenize", timeout: float = 120,
               proc: "subprocess.Popen | None" = None) -> None:
    import urllib.request
    deadline = time.time() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server on port {port} exited with status {proc.returncode}")
        try:
            req = urllib.request.Request(f"http://{host}:{port}{path}", data=b'{"prompt": "warm"}',
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                if r.status == 200:
                    return
        except Exception:  # noqa: BLE001
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def expectations(size, sessions, turns, append, tokenizer_path) -> list[list[list[int]]]:
    """[session][turn] -> [count, CRC of the IDs as JSON, CRC of the IDs as int32] from fastokens whole; each session's
    last text also by the reference."""
    import fastokens
    import numpy as np
    from tokenizers import Tokenizer

    fast = fastokens.Tokenizer.from_file(tokenizer_path)
    fast.enable_segment_cache(0) if hasattr(fast, "enable_segment_cache") else None
    ref = Tokenizer.from_file(tokenizer_path)
    bases, deltas = workload(size, sessions, turns, append)
    out = []
    for s in range(sessions):
        text, row = bases[s], []
        for t in range(turns + 1):
            if t:
                text += deltas[s][t - 1]
            buf, _ = fast.encode_batch_flat([text], add_special_tokens=True)
            ids = np.frombuffer(buf, dtype="<u4").view("<i4")
            row.append([len(ids), _ids_crc(ids), zlib.crc32(np.ascontiguousarray(ids, dtype="<i4"))])
        ref_ids = np.asarray(ref.encode(text).ids, dtype=np.int32)
        if [len(ref_ids), _ids_crc(ref_ids), zlib.crc32(ref_ids.astype("<i4"))] != row[-1]:
            raise SystemExit(f"fastokens differs from the reference on session {s}: no trustworthy expectation")
        out.append(row)
    return out


def run_clients(spec: dict, special: dict[int, str]) -> dict:
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(spec, fh)
    proc = subprocess.Popen([sys.executable, __file__, "--client", fh.name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        if not line.startswith("WARM"):
            raise RuntimeError(f"client failed during warm-up: {line!r}")
        special = {**special, proc.pid: "clients"}
        before = cpu_snapshot(special)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = None
        for line in proc.stdout:
            if line.startswith("RESULT "):
                result = json.loads(line[7:])
        after = cpu_snapshot(special)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
        os.unlink(fh.name)
    if result is None:
        raise RuntimeError("client produced no result")
    n = max(1, result["requests"])
    result["cpu_ms"] = {k: (after.get(k, 0.0) - before.get(k, 0.0)) * 1e3 / n for k in after
                        if after.get(k, 0.0) - before.get(k, 0.0) > 0.0005}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--plain-server", nargs=2, metavar=("TOKENIZER", "PORT"), help=argparse.SUPPRESS)
    ap.add_argument("--local-server", nargs=3, metavar=("TOKENIZER", "PORT", "MODEL"), help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", default="qwen-3")
    ap.add_argument("--sizes", default="100k,1m", help="comma list of 100k, 1m")
    ap.add_argument("--modes", default="plain,local,append-local,peer,delta,append",
                    help="plain, local, append-local, peer, delta, append; delta-std and append-std: delta-ray's "
                         "Serve app with Serve's defaults")
    ap.add_argument("--turns", type=int, default=0, help="timed turns per session (default 8 at 100K, 4 at 1M)")
    ap.add_argument("--append", type=int, default=1300, help="characters appended per turn")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1, help="rounds, each mode once per round in alternating order")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0, help="pool workers per delta-ray replica (0: no pool)")
    ap.add_argument("--direct-ingress", action="store_true", help="also measure Serve without its proxy")
    ap.add_argument("--serve-env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment for the Ray this starts (e.g. RAY_SERVE_USE_GRPC_BY_DEFAULT=1)")
    ap.add_argument("--json", default=None, help="write all results here")
    args = ap.parse_args()
    if args.client:
        return client_main(args.client)
    if args.plain_server:
        return plain_server(args.plain_server[0], int(args.plain_server[1]))
    if args.local_server:
        return local_server(*args.local_server)

    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    if args.direct_ingress:
        os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "1"  # inherited by the controller and replicas
    for kv in args.serve_env:
        k, _, v = kv.partition("=")
        os.environ[k] = v
    from delta_ray.apps.bundled import BUNDLED, bundled_tokenizer_path

    path = bundled_tokenizer_path(args.tokenizer) if args.tokenizer in BUNDLED else args.tokenizer
    modes = args.modes.split(",")
    sizes = [SIZES[s] + (s,) for s in args.sizes.split(",")]
    specials: dict[int, str] = {}
    servers: dict[str, tuple[subprocess.Popen, int]] = {}  # the servers in their own process: plain, local
    try:
        for kind, wanted, extra in (("plain", {"plain"}, []), ("local", LOCAL_MODES, [args.tokenizer])):
            if set(modes) & set(wanted):
                port = free_port()
                flag = f"--{kind}-server"
                proc = subprocess.Popen([sys.executable, __file__, flag, path, str(port), *extra], cwd=ROOT,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                servers[kind] = (proc, port)
                specials[proc.pid] = kind
        _run(args, path, modes, sizes, specials, servers)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)


def local_server(tokenizer_path: str, port: str, model: str) -> None:
    """delta-ray's one-process server (what ``delta-ray serve --local`` runs), the fast tier required."""
    from delta_ray.server.local import run_local
    run_local(tokenizer_path, "127.0.0.1", int(port), model_name=model, engine="fast")


def _start_serve(args, path, modes, endpoints):
    """Start Ray and Serve with the Serve modes' applications; fills ``endpoints`` (and, under direct
    ingress, ``endpoints["_di"]``: each app's replicas by id)."""
    import ray
    from ray import serve

    from delta_ray import serve_app
    from delta_ray._core.loading import load_tokenizer
    from delta_ray.actors.local_ray import local_init_kwargs
    from delta_ray.actors.serve import replica_endpoints

    ray.init(address="local", **local_init_kwargs())
    sport = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": sport})
    if "peer" in modes:
        serve.run(serve_peer(load_tokenizer(path).config_bytes), name="peer", route_prefix="/peer")
        endpoints["peer"] = ("127.0.0.1", sport, "/peer/tokenize")
    if "delta" in modes or "append" in modes:
        serve.run(serve_app(path, model_name=args.tokenizer, num_replicas=args.replicas,
                            num_workers=args.workers or None, engine="fast"),
                  name="delta", route_prefix="/delta")
        endpoints["delta"] = endpoints["append"] = ("127.0.0.1", sport, "/delta/tokenize")
    if "delta-std" in modes or "append-std" in modes:  # the same app with Serve's per-request defaults
        serve.run(serve_app(path, model_name=args.tokenizer, num_replicas=args.replicas,
                            num_workers=args.workers or None, engine="fast", fast_replica=False),
                  name="std", route_prefix="/std")
        endpoints["delta-std"] = endpoints["append-std"] = ("127.0.0.1", sport, "/std/tokenize")
    di_replicas: dict[str, dict] = {}
    if args.direct_ingress:
        for app, ms in (("peer", ["peer"]), ("delta", ["delta", "append"])):
            eps = replica_endpoints(app) if app in serve.status().applications else []
            want = args.replicas if app == "delta" else 1
            deadline = time.time() + 60
            while eps and len(eps) < want and time.time() < deadline:  # targets follow the replicas by a tick
                time.sleep(1)
                eps = replica_endpoints(app)
            if eps:
                _, port, _ = eps[0]  # replicas bind the http_options host (loopback here)
                di_replicas[app] = {rid: ["127.0.0.1", p] for _, p, rid in eps}
                for m in ms:
                    if m in modes:
                        endpoints[m + "-di"] = ("127.0.0.1", port, f"/{app}/tokenize")
                        modes.append(m + "-di")
            else:
                print(f"# direct ingress: no replica endpoint for {app}", flush=True)
    endpoints["_di"] = di_replicas
    return ray, serve


def _run(args, path, modes, sizes, specials, servers) -> None:
    endpoints: dict[str, tuple[str, int, str]] = {}
    for kind, (proc, port) in servers.items():
        # the local server admits the fast tier first (cached after)
        _wait_http("127.0.0.1", port, timeout=900, proc=proc)
        for m in ("plain",) if kind == "plain" else LOCAL_MODES:
            endpoints[m] = ("127.0.0.1", port, "/tokenize")
    specials[os.getpid()] = "driver"
    ray = serve = None
    if set(modes) - set(endpoints):
        ray, serve = _start_serve(args, path, modes, endpoints)
    di_replicas = endpoints.pop("_di", {})
    for host, port, p in set(endpoints.values()):
        _wait_http(host, port, p)
    print(f"# bench_serve: {args.tokenizer}, {args.clients} clients, +{args.append} chars/turn, modes {modes}",
          flush=True)
    results: dict = {}
    run_id = 0
    for size, sessions, label in sizes:
        turns = args.turns or (8 if size < 1_000_000 else 4)
        t0 = time.perf_counter()
        expect = expectations(size, sessions, turns, args.append, path)
        print(f"\n## {label}: {sessions} sessions of {size:,} chars, {turns} timed turns each "
              f"(expectations in {time.perf_counter() - t0:.1f} s)", flush=True)
        for rnd in range(args.rounds):
            order = modes if rnd % 2 == 0 else list(reversed(modes))
            for mode in order:
                run_id += 1
                host, port, p = endpoints[mode]
                spec = {"size": size, "sessions": sessions, "turns": turns, "append": args.append,
                        "expect": expect, "mode": "append" if mode.startswith("append") else "whole",
                        "clients": args.clients, "host": host, "port": port, "path": p,
                        "run": f"{os.getpid()}-{run_id}",
                        "replicas": di_replicas.get("delta") if mode in ("delta-di", "append-di") else None}
                r = run_clients(spec, specials)
                rate = r["requests"] / r["wall"]
                results.setdefault(label, {}).setdefault(mode, []).append({**r, "rate": rate})
                cpu = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["cpu_ms"].items(), key=lambda kv: -kv[1]))
                print(f"{mode:>10}: {rate:8.1f} turns/s  P50 {r['p50'] * 1e3:7.1f} ms  P99 {r['p99'] * 1e3:7.1f} ms  "
                      f"resends {r['resends']}  re-inits {r['reinit']}  replicas {r['replicas']}  "
                      f"errors {r['n_errors']}  | CPU ms/request: {cpu}", flush=True)
                for e in r["errors"][:3]:
                    print("    ", e)
    # Ratios against the targets (ranges over rounds).
    print("\n## Ratios (turns/s of each round against the same round's peer; median, min-max over rounds)")
    for label, by_mode in results.items():
        for mine, peer in (("local", "plain"), ("append-local", "plain"), ("local", "delta"),
                           ("append-local", "append"), ("delta", "plain"), ("delta", "peer"), ("append", "peer"),
                           ("append", "plain"), ("delta-di", "peer"),
                           ("append-di", "peer"), ("append-di", "plain"), ("delta-di", "peer-di"),
                           ("append-di", "peer-di"), ("delta-std", "peer"), ("append", "append-std")):
            a, b = by_mode.get(mine, []), by_mode.get(peer, [])
            if not a or not b:
                continue
            ratios = [x["rate"] / y["rate"] for x, y in zip(a, b)]
            p99a = [x["p99"] * 1e3 for x in a]
            p99b = [y["p99"] * 1e3 for y in b]
            print(f"{label}: {mine} / {peer}: {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}); "
                  f"P99 {statistics.median(p99a):.0f} ({min(p99a):.0f}-{max(p99a):.0f}) ms vs "
                  f"{statistics.median(p99b):.0f} ({min(p99b):.0f}-{max(p99b):.0f}) ms")
    errors = sum(r["n_errors"] for m in results.values() for rs in m.values() for r in rs)
    print(f"\nanswers that differ from the reference: {errors}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if serve is not None:
        for app in list(serve.status().applications):
            serve.delete(app)
        serve.shutdown()
        ray.shutdown()
    if errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
