"""A serving front end's tokenizer stage, replayed through vLLM's own request path.

Agent traffic as a vLLM server sees it: ``--sessions`` conversations whose first request brings a
``--chars``-character context (100K by default; ``--chars 1000000`` for the 1M run), each later
request the same chat grown by an assistant message and a user message (``--append``, about 1.3K
characters together), and a share of stateless documents (``--docs``, 2.5%: one message of the same
size, seen once). Requests arrive as a Poisson process at each rate of ``--rates`` (requests per
second, rising), each to a random conversation, at most one request in flight per conversation (a
turn that arrives while its conversation's previous one is still tokenizing waits, and its wait
counts). Every conversation's first request is served once before the clock starts (the replay
measures a server whose conversations are under way); four tenants, by ``cache_salt``. Before the
rates, ``--serial`` requests are served one at a time in each process (the service time, wall and
CPU, without queueing: on a shared machine the steadier comparison).

Each request goes through vLLM 0.33's OpenAI chat front end, in full: ``OpenAIServingChat`` ->
``OnlineRenderer`` -> the tokenizer mode's renderer (template render and encode on the renderer's
thread pool) -> the engine client, a stub that records the prompt IDs and the moment they arrive
(``bench/peers/vllm_front.py``). Latency = from the request's arrival to its prompt IDs reaching the
engine. Side by side, each in its own process, driven one at a time by this one:

* ``vllm``: vLLM's default (``tokenizer_mode="auto"``: transformers over HF tokenizers);
* ``fastokens``: the same, loaded under ``fastokens.patch_transformers()`` (its own threads), which
  is what ``VLLM_USE_FASTOKENS=1`` does;
* ``dr-stateless``: ``DELTA_RAY_VLLM=1`` with ``DELTA_RAY_SESSIONS=0`` (every encode whole);
* ``dr-keyless``: ``DELTA_RAY_VLLM=1`` as it is deployed; no request carries a key;
* ``dr-keyed``: the same, each request's conversation bound as its ``x-session-id`` header binds it
  (``delta_ray.apps.dropin.binding.SessionHeader``, or Ray Serve's session id);
* ``dr-keyed-tracked`` (only when named in ``--variants``): ``dr-keyed`` with the session lists left
  in the collector's sight, as before issue 58 (its longest collector pause is what that cost).

Where the installed delta-ray's drop-in has no sessions, the three delta-ray rows are the same path
(the output says so). Every request's prompt IDs are checked as an engine client would: a digest of
the list when it reaches the engine (on the loop, after its latency is taken), the list then
dropped; the digests are compared with the ``vllm`` row's for the same request after each rate.
Reported per rate and row: P50/P99 (ms) and the longest pause of Python's cyclic collector in that
rate's run (``gc.callbacks``: a collection stops every thread of the process); per row, the highest
rate with P99 <= ``--slo-ms`` (50), the process's CPU time per request (all its threads: fastokens'
native threads count) and how late the event loop started an arrival at most (large values mean the
process was descheduled: on a shared machine the P99s then measure the machine). Each process
freezes its startup heap out of the collector's sight before it serves, as ``vllm serve`` does, and
nothing after: whatever the tokenizer keeps while serving (the drop-in's session lists) is in the
heap the collector sees, as in a server. Targets (issues 50 and 58): delta-ray with sessions has a
lower P99 than fastokens at every rate, and a sustainable rate >= 1.5x fastokens' at 1M-character
conversations.

Needs the vLLM tier's environment (``python3 tests/tools/vllm_tier.py`` builds ``.venv-vllm``):

    .venv-vllm/bin/python bench/bench_frontend.py --quick
    .venv-vllm/bin/python bench/bench_frontend.py [--chars 100000] [--sessions 64] [--rates 10,20,40,80,160]
    .venv-vllm/bin/python bench/bench_frontend.py --chars 1000000 --rates 2,4,8,16,32 --requests 80
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from array import array

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, _ROOT)

VARIANTS = {  # name -> (tokenizer mode, fastokens' patch, keyed, extra environment)
    "vllm": ("auto", False, False, {}),
    "fastokens": ("auto", True, False, {}),  # what VLLM_USE_FASTOKENS=1 does in vLLM's get_tokenizer
    "dr-stateless": ("auto", False, False, {"DELTA_RAY_VLLM": "1", "DELTA_RAY_SESSIONS": "0"}),
    "dr-keyless": ("auto", False, False, {"DELTA_RAY_VLLM": "1"}),
    "dr-keyed": ("auto", False, True, {"DELTA_RAY_VLLM": "1"}),
    # not run unless named (--variants): dr-keyed with its kept lists left in the collector's sight,
    # as before issue 58 (the bench replaces the drop-in's untrack_ints by the identity in its process)
    "dr-keyed-tracked": ("auto", False, True, {"DELTA_RAY_VLLM": "1", "BENCH_DROPIN_TRACKED": "1"}),
}
DEFAULT_VARIANTS = ("vllm", "fastokens", "dr-stateless", "dr-keyless", "dr-keyed")
TENANTS = 4


class Workload:
    """The replay's conversations and documents, the same in every process (seeded)."""

    def __init__(self, sessions: int, chars: int, append: int, docs: float, seed: int = 0):
        from delta_ray.apps.sample_text import corpus
        self.src = corpus("english", 3_000_000) + corpus("code", 3_000_000) + corpus("multilingual", 2_000_000)
        self.rng = random.Random(seed)
        self.chars, self.append, self.docs = chars, append, docs
        self.chats = [self._first(i) for i in range(sessions)]
        self.n_docs = 0

    def _slice(self, n: int) -> str:
        at = self.rng.randrange(0, len(self.src) - n) if n < len(self.src) else 0
        text = self.src[at:at + n]
        while len(text) < n:
            text += "\n" + self.src[:n - len(text) - 1]
        return text

    def _first(self, i: int) -> list[dict]:
        return [{"role": "system", "content": f"You are agent {i}. Work through the task below."},
                {"role": "user", "content": f"[conversation {i}]\n" + self._slice(self.chars)}]

    def next_requests(self, n: int, rate: float) -> list[tuple[float, int, list[dict]]]:
        """``n`` arrivals at ``rate``/s: (arrival offset s, conversation or -1 for a document, messages)."""
        out, t = [], 0.0
        for _ in range(n):
            t += self.rng.expovariate(rate)
            if self.rng.random() < self.docs:
                self.n_docs += 1
                doc = f"[document {self.n_docs}]\n" + self._slice(self.chars)
                out.append((t, -1, [{"role": "user", "content": doc}]))
                continue
            i = self.rng.randrange(len(self.chats))
            k = max(100, int(self.append * self.rng.uniform(0.35, 0.65)))
            self.chats[i] = self.chats[i] + [{"role": "assistant", "content": self._slice(k)},
                                             {"role": "user", "content": self._slice(self.append - k)}]
            out.append((t, i, self.chats[i]))
        return out


def digest(ids: list[int]) -> str:
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=12).hexdigest()


# -- the child: one variant's front end ---------------------------------------------------------------
def child_main() -> int:
    proto = os.fdopen(os.dup(1), "w")  # the protocol keeps stdout; everything printed goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    setup = json.loads(sys.stdin.readline())
    mode, use_fastokens, keyed, _ = VARIANTS[setup["variant"]]
    from bench.peers.vllm_front import FrontEnd

    if os.environ.get("BENCH_DROPIN_TRACKED") == "1":
        from delta_ray.apps.dropin import sessions as dropin_sessions
        dropin_sessions.untrack_ints = lambda ids: ids

    from delta_ray._engine.native import allow_native_threads
    from delta_ray.apps.dropin.scope import request_scope
    allow_native_threads()  # delta-ray's import pinned fastokens to one thread; users of its patch run its default
    if use_fastokens:
        import fastokens
        fastokens.patch_transformers()
    front = FrontEnd(setup["folder"], mode)
    from vllm.utils.gc_utils import freeze_gc_heap
    freeze_gc_heap()  # as `vllm serve` does once its app is built, before it serves (server_utils.py)
    pauses = GCPauses()
    work = Workload(setup["sessions"], setup["chars"], setup["append"], setup["docs"], setup["seed"])
    sessions = _has_sessions(front.renderer.tokenizer) if setup["variant"].startswith("dr-") else None

    async def serve(i: int, messages: list[dict], salt: str):
        request = front.request(messages, cache_salt=salt)
        if keyed and i >= 0:
            with request_scope(session=f"conversation-{i}"):  # what SessionHeader binds from x-session-id
                return await front.chat(request)
        return await front.chat(request)

    async def warm():
        t = time.perf_counter()
        await serve(-1, [{"role": "user", "content": "warm up"}], "tenant0")
        for i, chat in enumerate(work.chats):
            await serve(i, chat, f"tenant{i % TENANTS}")
        # vLLM's tokenizer pool deep-copies the tokenizer when more calls overlap than it holds copies
        # (and keeps the copy): a burst grows it now, as a server's first busy second would.
        await asyncio.gather(*(serve(-1, [{"role": "user", "content": f"warm up {k}"}], "tenant0") for k in range(16)))
        return time.perf_counter() - t
    warm_s = asyncio.run(warm())
    print(json.dumps({"ready": True, "warm_s": warm_s, "sessions": sessions}), file=proto, flush=True)

    for line in sys.stdin:
        cmd = json.loads(line)
        if "serial" in cmd:  # one request at a time: the service time, without queueing
            walls, cpus = [], []
            for _, conv, messages in work.next_requests(cmd["serial"], 1.0):
                w, c = time.perf_counter(), time.process_time()
                _, at = asyncio.run(serve(conv, messages, f"tenant{max(conv, 0) % TENANTS}"))
                walls.append((at - w) * 1000.0)
                cpus.append((time.process_time() - c) * 1000.0)
            print(json.dumps({"wall_ms": walls, "cpu_ms": cpus}), file=proto, flush=True)
            continue
        plan = work.next_requests(cmd["n"], cmd["rate"])
        cpu = time.process_time()
        pauses.reset()
        lat, got, late = asyncio.run(_replay(plan, serve))
        cpu_ms = (time.process_time() - cpu) * 1000.0 / len(plan)
        answer = {"lat_ms": lat, "cpu_ms": cpu_ms, "late_ms": late, "gc_ms": pauses.longest * 1000.0,
                  "gc_full": pauses.full, "table": _table_stats(front), "digests": got}
        print(json.dumps(answer), file=proto, flush=True)
    return 0


class GCPauses:
    """The longest pause of Python's cyclic collector since :meth:`reset` (``gc.callbacks``), and how
    many of the collections were full ones (generation 2, the only ones that walk what a process
    keeps long): a collection stops every thread of the process, whatever its tokenizer."""

    def __init__(self):
        self.longest, self.full, self._start = 0.0, 0, 0.0
        gc.callbacks.append(self._on)

    def reset(self) -> None:
        self.longest, self.full = 0.0, 0

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.longest = max(self.longest, time.perf_counter() - self._start)
            self.full += info.get("generation") == 2


def _has_sessions(tok) -> bool | None:
    """Whether the drop-in state on ``tok`` keeps sessions (None: this delta-ray's drop-in has none)."""
    import importlib.util
    if importlib.util.find_spec("delta_ray.apps.dropin.sessions") is None:
        return None
    from delta_ray.apps.dropin.hf import STATE_ATTR
    snap = tok.__dict__[STATE_ATTR].current(tok)
    return getattr(snap, "sessions", None) is not None


def _table_stats(front) -> dict | None:
    """The drop-in's session table counters (new, continued, evicted...), where it has one."""
    from delta_ray.apps.dropin.hf import STATE_ATTR
    state = front.renderer.tokenizer.__dict__.get(STATE_ATTR)
    table = getattr(state.current(front.renderer.tokenizer), "sessions", None) if state is not None else None
    return dict(table.stats) if table is not None and hasattr(table, "stats") else None


async def _replay(plan, serve) -> tuple[list[float], list[str], float]:
    """Start each request at its arrival; one in flight per conversation (FIFO); latency = arrival
    to prompt IDs at the engine; each prompt's digest, made on arrival. Also returns how late (ms)
    the loop started the latest-started arrival: the process was busy or descheduled then, which its
    own work cannot explain at low rates."""
    loop = asyncio.get_running_loop()
    locks: dict[int, asyncio.Lock] = {}
    lat: list[float] = [0.0] * len(plan)
    got: list[str] = [""] * len(plan)
    start = loop.time() + 0.05
    tasks = []

    async def one(k: int, conv: int, messages: list[dict], due: float):
        arrived = time.perf_counter() - (loop.time() - due)  # the arrival, even if the loop was late
        salt = f"tenant{(conv if conv >= 0 else k) % TENANTS}"
        if conv >= 0:
            lock = locks.setdefault(conv, asyncio.Lock())
            async with lock:
                ids, at = await serve(conv, messages, salt)
        else:
            ids, at = await serve(conv, messages, salt)
        lat[k] = (at - arrived) * 1000.0
        # As an engine client: the prompt is serialized (here digested, on the loop) once it
        # arrives, then dropped. Nothing is frozen: the collector sees what a server's sees.
        got[k] = digest(ids)
        del ids

    late = [0.0]

    def launch(k, conv, messages, due):
        late[0] = max(late[0], (loop.time() - due) * 1000.0)
        tasks.append(loop.create_task(one(k, conv, messages, due)))

    for k, (offset, conv, messages) in enumerate(plan):
        loop.call_at(start + offset, launch, k, conv, messages, start + offset)
    await asyncio.sleep(start + plan[-1][0] - loop.time() + 0.01)
    while len(tasks) < len(plan):
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    return lat, got, late[0]


class Child:
    """One variant's process, driven over stdin/stdout (JSON lines)."""

    def __init__(self, variant: str, setup: dict):
        env = {k: v for k, v in os.environ.items() if k != "DELTA_RAY_VLLM"}  # only the delta-ray rows set it
        env.update(DELTA_RAY_FAST_BACKGROUND="0", VLLM_TARGET_DEVICE="cpu", **VARIANTS[variant][3])
        self.variant, self.last = variant, {}
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=_ROOT)
        self.send({**setup, "variant": variant})

    def send(self, obj) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def recv(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.variant} child exited ({self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _sustained(rates: list[float], p99: list[float], slo: float) -> float:
    """The highest tested rate up to which every tested rate met the SLO (0: not even the first)."""
    best = 0.0
    for rate, p in zip(rates, p99):
        if p > slo:
            break
        best = rate
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 conversations of 20K characters, two rates")
    ap.add_argument("--chars", type=int, default=100_000, help="first-turn context per conversation")
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--append", type=int, default=1300, help="characters a later turn adds")
    ap.add_argument("--docs", type=float, default=0.025, help="share of stateless documents")
    ap.add_argument("--rates", default="10,20,40,80,160", help="requests per second, rising")
    ap.add_argument("--requests", type=int, default=200, help="requests per rate")
    ap.add_argument("--serial", type=int, default=20, help="requests served one at a time first (service time)")
    ap.add_argument("--slo-ms", type=float, default=50.0)
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"rows, vllm first (also: {', '.join(v for v in VARIANTS if v not in DEFAULT_VARIANTS)})")
    ap.add_argument("--engine", default="fast", help="DELTA_RAY_ENGINE for the delta-ray rows")
    ap.add_argument("--tokenizer", default="qwen-3")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child_main()
    if args.quick:
        args.chars, args.sessions, args.rates, args.requests = 20_000, 16, "20,80", 60
    from bench.peers.vllm_front import model_folder
    rates = [float(r) for r in args.rates.split(",")]
    variants = args.variants.split(",")
    assert variants[0] == "vllm", "the vllm row is the reference the others are checked against"
    os.environ.setdefault("DELTA_RAY_ENGINE", args.engine)
    with tempfile.TemporaryDirectory() as tmp:
        setup = {"folder": model_folder(args.tokenizer, tmp), "sessions": args.sessions, "chars": args.chars,
                 "append": args.append, "docs": args.docs, "seed": 0}
        t0 = time.perf_counter()
        children = [Child(v, setup) for v in variants]  # they start (and warm up) side by side
        hello = {c.variant: c.recv() for c in children}
        print(f"{args.sessions} conversations of {args.chars:,} characters, +{args.append} a turn, "
              f"{args.docs:.1%} documents; {args.requests} requests a rate; ready in "
              f"{time.perf_counter() - t0:.0f} s (warm-up "
              + ", ".join(f"{v} {h['warm_s']:.1f} s" for v, h in hello.items()) + ")")
        has = {h["sessions"] for v, h in hello.items() if v.startswith("dr-") and v != "dr-stateless"}
        if has == {None}:
            print("note: this delta-ray's drop-in has no sessions: the dr-* rows are the same path")
        serial = {}
        for c in children:  # one child at a time, one request at a time
            c.send({"serial": args.serial})
            serial[c.variant] = c.recv()
        print("service time, one request at a time (median ms, wall / CPU): " + ", ".join(
            f"{v} {pct(o['wall_ms'], .5):.1f} / {pct(o['cpu_ms'], .5):.1f}" for v, o in serial.items()), flush=True)
        results: dict[str, dict[float, list[float]]] = {v: {} for v in variants}
        cpu: dict[str, dict[float, float]] = {v: {} for v in variants}
        late: dict[str, dict[float, float]] = {v: {} for v in variants}
        gc_ms: dict[str, dict[float, float]] = {v: {} for v in variants}
        gc_full: dict[str, dict[float, int]] = {v: {} for v in variants}
        mismatches = 0
        for r_i, rate in enumerate(rates):
            order = children[r_i % len(children):] + children[:r_i % len(children)]  # rotate who goes first
            digests = {}
            for c in order:
                c.send({"rate": rate, "n": args.requests})
                out = c.last = c.recv()
                results[c.variant][rate] = out["lat_ms"]
                cpu[c.variant][rate], late[c.variant][rate] = out["cpu_ms"], out["late_ms"]
                gc_ms[c.variant][rate], gc_full[c.variant][rate] = out["gc_ms"], out.get("gc_full", 0)
                digests[c.variant] = out["digests"]
            for v in variants[1:]:
                bad = sum(a != b for a, b in zip(digests[v], digests["vllm"]))
                mismatches += bad
                if bad:
                    print(f"MISMATCH: {v} at {rate:g}/s: {bad} of {args.requests} prompts differ from vLLM's")
            tables = {c.variant: c.last.get("table") for c in children if c.last.get("table")}
            if tables:
                print("   session tables: " + "; ".join(f"{v} {t}" for v, t in tables.items()))
            print(f"{rate:7g}/s  " + "  ".join(
                f"{v} {pct(results[v][rate], .5):7.1f}/{pct(results[v][rate], .99):7.1f}"
                f" gc {gc_ms[v][rate]:.1f} ({gc_full[v][rate]} full)" for v in variants), flush=True)
        for c in children:
            c.close()
    print(f"\nP50/P99 ms from arrival to prompt IDs, the longest collector pause of the rate's run (ms) and "
          f"how many full collections it had (vLLM's chat front end, {args.tokenizer}):")
    print("| one at a time (median wall / CPU) | " + " | ".join(
        f"{pct(serial[v]['wall_ms'], .5):.1f} / {pct(serial[v]['cpu_ms'], .5):.1f}" for v in variants) + " |")
    print("| rate/s | " + " | ".join(variants) + " |")
    print("| --- |" + " --- |" * len(variants))
    for rate in rates:
        cells = (f"{pct(results[v][rate], .5):.1f} / {pct(results[v][rate], .99):.1f}"
                 f" (gc {gc_ms[v][rate]:.1f}, {gc_full[v][rate]} full)" for v in variants)
        print(f"| {rate:g} | " + " | ".join(cells) + " |")
    print("| CPU ms a request (median over rates) | " + " | ".join(
        f"{sorted(cpu[v].values())[len(rates) // 2]:.1f}" for v in variants) + " |")
    print("| loop started an arrival late by, at most (ms) | " + " | ".join(
        f"{max(late[v].values()):.0f}" for v in variants) + " |")
    print("| longest pause of Python's collector, all rates (ms) | " + " | ".join(
        f"{max(gc_ms[v].values()):.1f}" for v in variants) + " |")
    sustain = {v: _sustained(rates, [pct(results[v][r], .99) for r in rates], args.slo_ms) for v in variants}
    up_to = (f"{sustain[v]:g}/s" if sustain[v] else f"< {rates[0]:g}/s" for v in variants)
    print(f"| P99 <= {args.slo_ms:g} ms at every rate up to | " + " | ".join(up_to) + " |")
    if "fastokens" in variants:
        for v in (x for x in variants if x.startswith("dr-")):
            lower = all(pct(results[v][r], .99) < pct(results["fastokens"][r], .99) for r in rates)
            if sustain["fastokens"]:
                rel = f"{sustain[v] / sustain['fastokens']:.2f}x fastokens'"
            else:
                rel = f"{sustain[v]:g}/s, fastokens' below the lowest rate" if sustain[v] else "neither met the SLO"
            cost = pct(list(cpu["fastokens"].values()), .5) / max(pct(list(cpu[v].values()), .5), 1e-9)
            print(f"{v}: P99 below fastokens' at every rate: {'yes' if lower else 'no'}; sustainable rate: {rel}; "
                  f"fastokens' CPU per request / this row's: {cost:.2f}")
    print("every prompt equal to vLLM's default mode" if not mismatches else f"{mismatches} prompts DIFFER")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
