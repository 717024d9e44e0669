"""The sections on Ray: the pool, and the Serve append API over HTTP.

Ray is started quietly: ``log_to_driver=False`` (workers' output stays in the session's log
files, whose folder the demo names), Ray's driver-side loggers go to the demo's log file, and no
Ray Data pipeline runs (the corpus section uses ``delta-ray tokenize``'s local path), so none of
its progress bars or actor-restart warnings appear. Every result is compared with the reference.
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
from delta_ray.apps.sample_text import chat_transcript, corpus
from delta_ray.core.loading import LoadedTokenizer

from .baselines import Engines, chat_calls
from .report import (Steps, Table, best, median, ms, out, progress, quiet_ray_loggers, ratio, size_label, timed,
                     verdict)

CHAT_SIZES = (100_000, 1_000_000)


class RayDidNotStart(RuntimeError):
    """Ray or the pool's workers did not start in time (an overloaded machine): the sections on
    Ray did not run, which the demo reports as incomplete, not as a failed check."""


def start_ray(tries: int = 3) -> tuple[bool, str]:
    """Join ``RAY_ADDRESS`` or start a local Ray with its logs in files; (started here, logs dir)."""
    import ray
    from ray import serve  # noqa: F401 - its import installs console handlers too: quiet them now
    quiet_ray_loggers()  # after `import ray`, which installs its stderr handler
    started = False
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        else:
            from delta_ray.actors.local_ray import local_init_kwargs
            with progress("starting a local Ray"):
                for attempt in range(1, tries + 1):
                    try:
                        ray.init(**local_init_kwargs())
                        break
                    except Exception as exc:  # noqa: BLE001 - Ray gives its raylet 30 s to register
                        if "timed out during startup" not in str(exc):
                            raise
                        ray.shutdown()
                        if attempt == tries:
                            raise RayDidNotStart(f"Ray's node missed its 30 s start-up deadline {tries} times "
                                                 "(is the machine overloaded? see `uptime`)") from None
                        out("  Ray's node missed its 30 s start-up deadline (a busy machine?): starting it again")
            started = True
    quiet_ray_loggers()
    try:
        logs = ray._private.worker._global_node.get_logs_dir_path()
    except Exception:  # noqa: BLE001 - a private API: the folder is only named for the reader
        logs = "/tmp/ray/session_latest/logs"
    return started, logs


def ray_sections(eng: Engines, loaded: LoadedTokenizer, sizes, log_path: str) -> bool:
    """Start Ray (or join one), run the pool and Serve sections, shut down what was started."""
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    import ray
    started, logs = start_ray()  # RayDidNotStart: the caller reports the sections as not run
    out(f"  Ray: {int(ray.cluster_resources().get('CPU', 0))} CPUs; its logs: {logs}")
    ok = True
    try:
        from delta_ray.core.errors import PoolStartupError
        try:
            ok &= pool_section(eng, loaded, sizes.pool_turns)
        except PoolStartupError as exc:
            raise RayDidNotStart(f"the pool's workers did not start: {exc}") from None
        ok &= serve_section(eng, loaded, sizes.serve_turns, log_path, own_ray=started)
    finally:
        if started:
            ray.shutdown()
    return ok


def _chat(n: int, turns: int) -> tuple[str, list[str]]:
    # The same transcripts as the in-process chat section (same seed): the reference runs once.
    return chat_transcript(n, turns + 1, seed=n)


def pool_section(eng: Engines, loaded: LoadedTokenizer, turns: int) -> bool:
    """Sessions and a long text through ``TokenizerPool`` (workers on Ray, sessions on their home
    worker), against fastokens re-encoding in the caller."""
    from delta_ray.actors.pool import TokenizerPool
    with progress("starting the pool (one worker per CPU, each loads the tokenizer)", 15):
        pool = TokenizerPool(loaded)
    t = Table(f"Pool on Ray: {pool.num_workers} workers (median of {turns} turns or calls, warm; "
              "fastokens runs in the caller)",
              ["use", "reference", "fastokens", "fastokens+seg.cache", "delta-ray pool", "vs best fastokens", "exact"])
    ok = True
    last = None
    try:
        for n in CHAT_SIZES:
            initial, deltas = _chat(n, turns)
            fast, cached = eng.fastokens, eng.segment_cached()
            a, b = f"pool-{n}-turn", f"pool-{n}-extend"
            pool.encode(initial, session=a)  # each session's first call initializes it on its home worker
            pool.encode(initial, session=b)
            if cached is not None:
                cached.ids(initial)
            times = {"turn": [], "extend": [], "fast": [], "cached": []}
            results = []
            text = initial
            bar = Steps(f"pool {size_label(n)}: turns", len(deltas))
            for i, delta in enumerate(deltas):
                text = text + delta
                calls = chat_calls(pool, text, delta, a, b, fast, cached)
                for name, fn in calls:
                    got, s = timed(fn)
                    if i >= 1:  # the first turn warms the paths
                        times[name].append(s)
                    results.append((name, text, got))
                bar.step()
            good = eng.check_all(results, "pool ")
            ref_s = median([eng.ref_seconds[txt] for txt in {txt for _, txt, _ in results[len(calls):]}])
            exact = all(good["turn"]) and all(good["extend"])
            ok &= exact
            n_all, n_good = sum(len(v) for v in good.values()), sum(sum(v) for v in good.values())
            f, c = median(times["fast"]), median(times["cached"])
            for op in ("turn", "extend"):
                d = median(times[op])
                what = "whole transcript sent" if op == "turn" else "extend: the new message only"
                t.add(f"chat {size_label(n)}, {what}", ms(ref_s), ms(f) if fast else "n/a",
                      ms(c) if cached else "n/a", ms(d), ratio(best(f, c), d) if fast else "-",
                      f"{n_good}/{n_all}" if op == "turn" else "")
            last = (n, best(f, c), median(times["turn"]), median(times["extend"]))
        # A long stateless text: cut at safe cuts, chunks on the workers (or the caller: placement).
        src = corpus("english", 1_000_000 + 6 * 37_000)
        texts = [src[k * 37_000:k * 37_000 + 1_000_000] for k in range(4)]
        pool.encode(texts[0])
        d_s, f_s, res = [], [], []
        for text in texts[1:]:
            got, s = timed(lambda: pool.encode(text))
            d_s.append(s)
            res.append(("pool stateless", text, got))
            if eng.fastokens is not None:
                got, s = timed(lambda: eng.fastokens.ids(text))
                f_s.append(s)
                res.append(("fastokens", text, got))
        by_engine = eng.check_all(res)
        good = [g for v in by_engine.values() for g in v]
        ok &= all(by_engine["pool stateless"])
        r_s = median([eng.ref_seconds[x] for x in texts[1:]])
        t.add("stateless 1M chars", ms(r_s), ms(median(f_s)) if f_s else "n/a", "",
              ms(median(d_s)), ratio(median(f_s), median(d_s)) if f_s else "-", f"{sum(good)}/{len(good)}")
    finally:
        pool.close()
    t.print()
    n, f, turn, ext = last
    if f:
        verdict(f"a {size_label(n)}-character session on the pool: {ms(turn)} a turn, {ms(ext)} an extend (a hop to the "
                f"session's worker and back) vs fastokens in the caller {ms(f)} (best of whole and segment cache; "
                f"{ratio(f, turn)}); "
                f"{'all exact' if ok else 'MISMATCH against the reference'}")
    return ok


def _wait_port(port: int, proc: subprocess.Popen | None, timeout: float = 60) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the plain server exited with status {proc.returncode}")
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


def serve_section(eng: Engines, loaded: LoadedTokenizer, turns: int, log_path: str, own_ray: bool) -> bool:
    """A chat session over HTTP: delta-ray's Serve app (whole transcript sent, or the append API)
    against a plain uvicorn + FastAPI + fastokens server re-encoding every request whole."""
    from ray import serve

    from delta_ray.actors.serve import serve_app
    from delta_ray.actors.serve_router import routing_headers

    plain_port, serve_port = free_port(), free_port()
    log = open(log_path, "ab")
    script = plain_server_script.__file__
    env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"}  # the user's defaults
    plain = subprocess.Popen([sys.executable, str(script), eng.path, str(plain_port)],
                             stdout=log, stderr=log, env=env)
    ok = True
    try:
        with progress("starting Ray Serve (delta-ray app) and a plain FastAPI + fastokens server", 20):
            serve.start(http_options={"host": "127.0.0.1", "port": serve_port})
            quiet_ray_loggers()
            serve.run(serve_app(loaded), name="delta-ray-demo", route_prefix="/")
            _wait_port(plain_port, plain)
            _wait_port(serve_port, None)
        pc, dc = _Client(plain_port), _Client(serve_port)
        t = Table(f"Ray Serve over HTTP: a chat session turn by turn (median of {turns} turns, warm; "
                  "client latency, IDs parsed)",
                  ["context", f"plain FastAPI + {'fastokens' if eng.fastokens else 'tokenizers'}",
                   "delta-ray, whole transcript", "delta-ray, append", "vs plain",
                   "exact"])
        last = None
        for n in CHAT_SIZES:
            initial, deltas = _chat(n, turns)
            a, b = f"serve-{n}-turn", f"serve-{n}-append"
            ha, hb = routing_headers(a), routing_headers(b)
            pc.post({"prompt": initial})
            dc.post({"prompt": initial, "session_id": a}, ha)
            first = dc.post({"prompt": initial, "session_id": b}, hb)
            # An append names the state it extends (the last answer's session_version): a stale or
            # retried append is refused (409) instead of extending the wrong text.
            held, version = first["tokens"], first["session_version"]
            times = {"plain": [], "whole": [], "append": []}
            results = []
            text = initial
            bar = Steps(f"serve {size_label(n)}: turns", len(deltas))
            for i, delta in enumerate(deltas):
                text = text + delta

                def append():
                    nonlocal version
                    doc = dc.post({"append": delta, "session_id": b, "session_version": version}, hb)
                    version = doc["session_version"]
                    return np.concatenate([held[:doc["start"]], doc["tokens"]])
                calls = [("plain", lambda: pc.post({"prompt": text})["tokens"]),
                         ("whole", lambda: dc.post({"prompt": text, "session_id": a}, ha)["tokens"]),
                         ("append", append)]
                for name, fn in calls:
                    got, s = timed(fn)
                    if name == "append":
                        held = got
                    if i >= 1:
                        times[name].append(s)
                    results.append((name, text, got))
                bar.step()
            good = eng.check_all(results, "serve ")
            ok &= all(good["whole"]) and all(good["append"])
            p, w, ap = median(times["plain"]), median(times["whole"]), median(times["append"])
            t.add(size_label(n), ms(p), ms(w), ms(ap), ratio(p, ap),
                  f"{sum(sum(v) for v in good.values())}/{sum(len(v) for v in good.values())}")
            last = (n, p, w, ap)
        pc.close()
        dc.close()
        t.print()
        n, p, w, ap = last
        verdict(f"a {size_label(n)}-character chat over HTTP: delta-ray's append API {ms(ap)} a turn, the whole "
                f"transcript {ms(w)}, vs a plain server re-encoding with fastokens {ms(p)} ({ratio(p, ap)}); "
                f"{'all exact' if ok else 'MISMATCH against the reference'}")
    finally:
        plain.terminate()
        try:
            plain.wait(timeout=10)
        except subprocess.TimeoutExpired:
            plain.kill()
            plain.wait()
        log.close()
        # A Ray started here goes down with everything on it. serve.shutdown() would make the
        # controller kill itself, and Ray prints that task's failure on the driver's stdout.
        if not own_ray:
            try:
                serve.delete("delta-ray-demo")
            except Exception:  # noqa: BLE001 - the cluster's Serve keeps running either way
                pass
    return ok
