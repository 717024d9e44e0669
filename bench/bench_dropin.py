"""The transformers drop-in against what serving stacks run today, side by side in one run.

vLLM's renderer (and SGLang's) calls ``apply_chat_template(tokenize=True)`` on a transformers
tokenizer every turn, re-rendering and re-encoding the whole transcript. Here one chat grows by a
user and an assistant message a turn (about 13K characters) to 250K+ characters in 20 turns, and
each turn is timed with four tokenizers loaded from the same folder:

* ``stock``: transformers 5 as installed;
* ``fastokens``: loaded under ``fastokens.patch_transformers()``;
* ``fastokens+cache``: the same with fastokens' segment cache on (``enable_segment_cache``);
* ``delta-ray``: loaded under ``delta_ray.patch_transformers()`` (sessions and content reuse on, the defaults;
  ``--engine fast`` admits the fast tier first, about a minute the first time, cached after);
* ``dr-stock-render``: the same with ``fast_render=False``: transformers' own template render, so
  the two delta-ray columns show what the memoized sandbox (docs/dropin.md §16) adds and what the encode does.

The four are timed in rotating order on each turn (median of ``--repeats``, and the fastest
repeat, the least disturbed by other jobs on a shared machine), every result is
compared with stock's IDs, and the same is done for raw prompts (``tok(text)`` on the growing text
without a template). Targets (issue 24): delta-ray >= 1.0x fastokens' patch summed over turns 2-20,
and >= 20x stock transformers.

fastokens runs as its users run it: in a child process of this one (the ``--peer`` mode), with its
own default threading. Its intra-text parallelism is a process-wide pool sized once from
``FASTOKENS_BPE_THREADS``, which delta-ray pins to 1 at import (it cuts long texts and runs the
pieces on its own threads); timed inside delta-ray's process, fastokens' patch would run on one
thread (measured: a 260K-character encode 1.0-1.2 ms there against 0.67-0.69 ms with its default
on 2 cores). The child is driven turn by turn over its stdin/stdout (JSON lines) and times the calls
itself, so the rotation is kept and neither process runs while the other is timed.
``--fastokens-in-process`` times it in this process instead (the pinned one-thread setting).
delta-ray's patch lifts that pin in its own process by default (the drop-in's ``native_threads``
option), so both patches spread a long text over fastokens' native threads; ``--native-threads off``
times delta-ray with the pin kept.

    .venv/bin/python bench/bench_dropin.py [--tokenizer qwen-3] [--engine fast] [--repeats 5]

``--vllm-calls`` adds two tables of raw prompts in the call shapes vLLM 0.34's renderer uses:
``tok(text, truncation=True, max_length=max_input_tokens + 1)`` for every prompt, and the same with
``return_offsets_mapping=True`` for a request that asks for offsets (the drop-in serves a
conversation's offsets from its session where the tokenizer's offsets splice, docs/proof.md §17:
Qwen's NFC and llama3.2 among them; elsewhere, Phi-3's ``Prepend``, by transformers' own encode, the
stock column).

``--gc`` (issue 58): the session table and Python's cyclic collector. Two keyed drop-ins, each with
the default table (1 GiB, ``--gc-bytes``) filled with conversations of ``--gc-chars`` characters:
``untracked`` as shipped, ``tracked`` with the kept lists left in the collector's sight (the module's
``untrack_ints`` replaced by the identity while it runs: the code before the change). The startup
heap is frozen first (``gc.freeze()``, as ``vllm serve`` does), then a full ``gc.collect()`` is timed
with the tables empty, with only the untracked one full, with both, and
with only the tracked one; then warm agent turns on both, turn by turn in rotating order, IDs
compared with each other and with stock's at the last turn:

    .venv/bin/python bench/bench_dropin.py --gc [--gc-chars 1000000] [--gc-bytes 1073741824]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

# Before anything imports delta-ray (which pins it to 1): what the user's environment says.
_USER_FASTOKENS_THREADS = os.environ.get("FASTOKENS_BPE_THREADS")
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, _ROOT)

from bench.harness import repeat_ms, timed_ms  # noqa: E402 - imports no delta-ray: the fastokens child uses it too


def digest(ids) -> str:
    """A short fingerprint of a list of IDs (the child process sends this, not the IDs)."""
    return hashlib.sha256(repr(list(ids)).encode()).hexdigest()[:16]


def load_fastokens(folder: str, cache_mib: int) -> dict:
    """fastokens' patch, with and without its segment cache (empty if fastokens is missing)."""
    from transformers import AutoTokenizer
    try:
        import fastokens
    except ImportError:
        print("fastokens is not installed: its columns are skipped")
        return {}
    out = {}
    for name in ("fastokens", "fastokens+cache"):
        fastokens.patch_transformers()
        try:
            out[name] = AutoTokenizer.from_pretrained(folder)
        finally:
            fastokens.unpatch_transformers()
    out["fastokens+cache"]._tokenizer.enable_segment_cache(cache_mib << 20)
    return out


VLLM_MAX_LENGTH = 131_073  # a 128K-token model's max_input_tokens + 1: never reached by these prompts


def make_call(kind: str, item, tok):
    if kind == "chat":
        return lambda: tok.apply_chat_template(item, tokenize=True, add_generation_prompt=True)
    if kind == "agent":  # as vLLM's renderer calls it (it forces return_dict=False under transformers 5)
        return lambda: tok.apply_chat_template(item, tokenize=True, add_generation_prompt=True, return_dict=False)
    if kind == "vllm":  # vLLM 0.34's renderer: every prompt, max_length = max_input_tokens + 1
        return lambda: tok(item, truncation=True, max_length=VLLM_MAX_LENGTH, add_special_tokens=True)["input_ids"]
    if kind == "offsets":  # the same for a request that asks for token offsets: IDs and offsets digested
        def with_offsets():
            out = tok(item, truncation=True, max_length=VLLM_MAX_LENGTH, add_special_tokens=True,
                      return_offsets_mapping=True)
            return out["input_ids"] + [x for pair in out["offset_mapping"] for x in pair]
        return with_offsets
    return lambda: tok(item)["input_ids"]


def agent_item(inputs: dict, t: int) -> list:
    """Turn ``t`` of the agent runs: a prefix of one conversation's messages."""
    c, n = inputs["turns"][t]
    return inputs["convs"][c][:n]


def peer_main() -> int:
    """The child: fastokens only (no delta-ray import), timing what the parent asks for, turn by turn."""
    # The protocol keeps the original stdout; anything else printed (fastokens announces its patch)
    # goes to stderr.
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    setup = json.loads(sys.stdin.readline())
    toks = load_fastokens(setup["folder"], setup["cache_mib"])
    inputs = setup["inputs"]
    print(json.dumps({"names": list(toks), "threads": os.environ.get("FASTOKENS_BPE_THREADS", "<unset>")}),
          file=proto, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        kind = req["kind"]
        item = agent_item(inputs[kind], req["t"]) if kind == "agent" else inputs[kind][req["t"]]
        try:
            ms, ids = repeat_ms(make_call(kind, item, toks[req["name"]]), req["repeats"])
        except Exception as exc:  # noqa: BLE001 - a call the peer does not support: said, not fatal
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), file=proto, flush=True)
            continue
        print(json.dumps({"ms": ms[0], "min": ms[1], "digest": digest(ids)}), file=proto, flush=True)
    return 0


class Unsupported(RuntimeError):
    """The peer raised on a call (fastokens' patch on ``return_offsets_mapping=True``)."""


class Peer:
    """The fastokens child process, as a set of named tokenizers the parent times turn by turn."""

    def __init__(self, folder: str, cache_mib: int, inputs: dict, threads: str | None):
        env = dict(os.environ)
        env.pop("FASTOKENS_BPE_THREADS", None)
        if threads is not None:
            env["FASTOKENS_BPE_THREADS"] = threads
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--peer"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self._send({"folder": folder, "cache_mib": cache_mib, "inputs": inputs})
        hello = self._recv()
        self.names, self.threads = hello["names"], hello["threads"]

    def _send(self, obj) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def _recv(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fastokens child exited ({self.proc.wait()})")
        return json.loads(line)

    def time(self, name: str, kind: str, t: int, repeats: int) -> tuple[float, str]:
        """(median, fastest) ms and the IDs' digest; raises :class:`Unsupported` with the child's error."""
        self._send({"name": name, "kind": kind, "t": t, "repeats": repeats})
        out = self._recv()
        if "error" in out:
            raise Unsupported(out["error"])
        return (out["ms"], out["min"]), out["digest"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def load_all(folder: str, engine: str, cache_mib: int, content_reuse: bool, shadow_rate: float | None,
             fastokens_in_process: bool, native_threads: bool | None = None) -> dict:
    from transformers import AutoTokenizer

    import delta_ray
    out = {"stock": AutoTokenizer.from_pretrained(folder)}
    if fastokens_in_process:
        out.update(load_fastokens(folder, cache_mib))
    t0 = time.perf_counter()
    extra = {} if shadow_rate is None else {"shadow_rate": shadow_rate}
    extra["native_threads"] = native_threads
    delta_ray.patch_transformers(engine=engine, **extra)
    out["delta-ray"] = AutoTokenizer.from_pretrained(folder)
    delta_ray.patch_transformers(engine=engine, fast_render=False, **extra)
    out["dr-stock-render"] = AutoTokenizer.from_pretrained(folder)
    if content_reuse:
        delta_ray.patch_transformers(engine=engine, content_reuse=True, **extra)
        out["delta-ray+reuse"] = AutoTokenizer.from_pretrained(folder)
    delta_ray.unpatch_transformers()
    from delta_ray.apps.dropin.hf import STATE_ATTR, install_hooks
    install_hooks()  # the loaded objects keep their state; the hooks must stay for them
    dt = out["delta-ray"].__dict__[STATE_ATTR].current(out["delta-ray"]).tokenizer
    print(f"delta-ray patch ready in {time.perf_counter() - t0:.1f} s; admission: {dt.admission.reason}; "
          f"engine: {dt.admission.engine}")
    return out


ORDER = ("stock", "fastokens", "delta-ray", "fastokens+cache", "dr-stock-render", "delta-ray+reuse")


def run(toks: dict, peer: Peer | None, kind: str, calls: list, repeats: int, label: str) -> dict[str, list[float]]:
    """calls[t](tok) -> IDs of turn t; every tokenizer per turn, order rotated; IDs checked (the
    child's by digest)."""
    names = list(toks)
    if peer is not None:
        names[1:1] = peer.names  # the usual column order: stock, fastokens..., delta-ray
    # The order rotates each turn, so each column mostly runs right after the same neighbour, whose
    # native threads may still be spinning on these 2 cores: both delta-ray columns follow one of
    # fastokens' (the child's), not each other.
    names = sorted(names, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))
    per = {n: [] for n in names}
    fastest = {n: [] for n in names}  # per turn, the fastest of the repeats (other jobs only add time)
    mismatches = {n: 0 for n in names}
    for t, call in enumerate(calls):
        order = names[t % len(names):] + names[:t % len(names)]
        results = {}
        for n in order:
            if n in toks:
                ms, ids = repeat_ms(lambda: call(toks[n]), repeats)
                ids = digest(ids)
            else:
                try:
                    ms, ids = peer.time(n, kind, t, repeats)
                except Unsupported as exc:
                    print(f"  {n} cannot make this call: {exc}")
                    names.remove(n)
                    del per[n], fastest[n], mismatches[n]
                    continue
            per[n].append(ms[0])
            fastest[n].append(ms[1])
            results[n] = ids
        want = results["stock"]
        for n in names:
            mismatches[n] += results[n] != want
    print(f"\n{label}: ms per turn (median of {repeats}), IDs compared with stock each turn")
    print("turn  chars    " + "".join(f"{n:>17}" for n in names))
    for t in range(len(calls)):
        print(f"{t + 1:>4}  {calls[t].chars:>7}  " + "".join(f"{per[n][t]:>17.2f}" for n in names))
    summed = {n: sum(per[n][1:]) for n in names}
    print("sum 2-" + f"{len(calls)}".ljust(9) + "".join(f"{summed[n]:>17.1f}" for n in names))
    print("mismatching turns " + "".join(f"{mismatches[n]:>17}" for n in names))
    d = summed["delta-ray"]
    for n in names:
        if n != "delta-ray":
            print(f"  delta-ray vs {n}: {summed[n] / d:.2f}x (sum of turns 2-{len(calls)})")
    # On a shared machine the medians carry other jobs' time; the fastest repeat of each turn is
    # the least disturbed estimate of what each call costs.
    low = {n: sum(fastest[n][1:]) for n in names}
    print("sum 2-" + f"{len(calls)}".ljust(9) + "".join(f"{low[n]:>17.1f}" for n in names) + "  (fastest repeats)")
    for n in names:
        if n != "delta-ray":
            ratio = low[n] / low["delta-ray"]
            print(f"  delta-ray vs {n}: {ratio:.2f}x (sum of turns 2-{len(calls)}, fastest repeats)")
    return per


# -- agent traffic: a long first message, then short turns, each conversation its own session ------------
AGENT_ORDER = ("stock", "fastokens", "dr-keyed", "fastokens+cache", "dr-keyless", "dr-no-sessions")


def agent_conversations(context: int, turns: int, conversations: int, step: int, seed: int = 0) -> list[list[dict]]:
    """``conversations`` agent chats: a system prompt, a first user message bringing the context to
    about ``context`` characters, then per turn an assistant message (reasoning, content, a tool call
    every other turn) and a tool result, or a user message every third turn (about ``2 * step``
    characters a turn). Each conversation draws its own text (no peer's cache sees a turn before it
    is timed)."""
    import random

    from delta_ray.apps.sample_text import corpus
    rng = random.Random(seed)
    src = corpus("english", 4_000_000) + corpus("code", 3_000_000) + corpus("multilingual", 1_000_000)

    def take(n: int) -> str:
        at = rng.randrange(0, len(src) - n)
        return src[at:at + n]
    out = []
    for c in range(conversations):
        chat = [{"role": "system", "content": f"You are agent {c}. Use the tools; answer briefly."},
                {"role": "user", "content": take(context)}]
        for t in range(turns - 1):
            msg = {"role": "assistant", "reasoning_content": take(step // 4), "content": take(step - step // 4)}
            if t % 2 == 0:
                msg["tool_calls"] = [{"type": "function",
                                      "function": {"name": "read_file", "arguments": {"path": f"src/m{t}.py"}}}]
                chat += [msg, {"role": "tool", "content": take(step)}]
            else:
                chat += [msg, {"role": "user" if t % 3 == 2 else "tool", "content": take(step)}]
        out.append(chat)
    return out


def load_agent(folder: str, engine: str, cache_mib: int, fastokens_in_process: bool, native: bool | None) -> dict:
    """stock and three delta-ray wrappings (sessions keyed, keyless, off), each with its own state."""
    from transformers import AutoTokenizer

    from delta_ray.apps.dropin import wrap_tokenizer
    out = {"stock": AutoTokenizer.from_pretrained(folder)}
    if fastokens_in_process:
        out.update(load_fastokens(folder, cache_mib))
    t0 = time.perf_counter()
    for name, sessions in (("dr-keyed", True), ("dr-keyless", True), ("dr-no-sessions", False)):
        out[name] = wrap_tokenizer(AutoTokenizer.from_pretrained(folder), engine=engine, sessions=sessions,
                                   native_threads=native)
    from delta_ray.apps.dropin.hf import STATE_ATTR
    dt = out["dr-keyed"].__dict__[STATE_ATTR].current(out["dr-keyed"]).tokenizer
    print(f"delta-ray ready in {time.perf_counter() - t0:.1f} s; engine: {dt.admission.engine}")
    return out


def _spread(values: list[float]) -> str:
    import statistics
    return f"{statistics.median(values):8.2f} ({min(values):.2f}-{max(values):.2f})"


def run_agent(args, folder: str, native: bool | None) -> int:
    """The agent bench: every column per turn, conversations interleaved turn by turn, each column
    timed once per turn (a repeat of the same turn would be a replay); medians of the warm turns
    (3 on) per conversation, then their median and range across conversations."""
    import statistics

    from delta_ray import request_scope
    toks = load_agent(folder, args.engine, args.cache_mib, args.fastokens_in_process, native)
    convs = agent_conversations(args.context, args.turns, args.conversations, args.step)
    n_first = 2  # system + the first user message
    turns = [(c, n_first + 2 * t) for t in range(args.turns) for c in range(len(convs))]  # turn-major
    inputs = {"convs": convs, "turns": turns}
    peer = None
    if not args.fastokens_in_process:
        peer = Peer(folder, args.cache_mib, {"agent": inputs}, args.fastokens_threads)
        print(f"fastokens timed in a child process, FASTOKENS_BPE_THREADS={peer.threads} there")
    names = sorted(list(toks) + (peer.names if peer else []),
                   key=lambda n: AGENT_ORDER.index(n) if n in AGENT_ORDER else len(AGENT_ORDER))

    def call(name: str, idx: int):
        c, _ = turns[idx]
        fn = make_call("agent", agent_item(inputs, idx), toks[name])
        if name == "dr-keyed":  # the request's session key, as an engine integration binds it
            with request_scope(session=f"conversation-{c}"):
                return fn()
        return fn()
    per = {n: [[] for _ in convs] for n in names + ["render", "render-stock", "list-copy"]}
    mismatches = {n: 0 for n in names}
    chars = [[] for _ in convs]
    t_start = time.perf_counter()
    for idx, (c, n) in enumerate(turns):
        t = idx // len(convs)
        order = names[idx % len(names):] + names[:idx % len(names)]
        got = {}
        for name in order:
            time.sleep(args.gap_ms / 1e3)  # an idle before each request, as a server has: a previous
            # column's native threads (fastokens spins its pool a while after a call) are asleep again
            if name in toks:
                ids, ms = timed_ms(lambda: call(name, idx))
                got[name] = digest(ids)
                if name == "stock":
                    want_list = ids
            else:
                (ms, _), got[name] = peer.time(name, "agent", idx, 1)
            per[name][c].append(ms)
        for name in names:
            mismatches[name] += got[name] != got["stock"]
        chat = agent_item(inputs, idx)
        text, ms = timed_ms(lambda: toks["dr-keyless"].apply_chat_template(chat, tokenize=False,
                                                                            add_generation_prompt=True))
        per["render"][c].append(ms)
        per["render-stock"][c].append(timed_ms(lambda: toks["stock"].apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True))[1])
        per["list-copy"][c].append(timed_ms(want_list.copy)[1])
        chars[c].append(len(text))
        if c == 0:
            print(f"  turn {t + 1:>2}: {len(text):>8} chars, {len(want_list):>7} IDs "
                  + " ".join(f"{nm}={per[nm][0][-1]:.2f}" for nm in names) + " ms", flush=True)
    if peer is not None:
        peer.close()
    warm = {n: [statistics.median(v[2:]) for v in per[n]] for n in per}  # turns 3 on, per conversation
    floor = [r + cp for r, cp in zip(warm["render"], warm["list-copy"])]
    label = (f"agent turns through apply_chat_template(tokenize=True), {args.tokenizer}: first message to "
             f"{chars[0][0]:,} characters, then {args.turns - 1} turns of ~{2 * args.step:,}; {len(convs)} "
             f"conversations; {time.perf_counter() - t_start:.0f} s")
    print(f"\n{label}\nwarm turn (3-{args.turns}), ms: median over conversations (range)")
    for n in names:
        print(f"  {n:<16} {_spread(warm[n])}   mismatching turns: {mismatches[n]}")
    print(f"  {'floor':<16} {_spread(floor)}   (render with the memo + a copy of the list)")
    print(f"  {'render':<16} {_spread(warm['render'])}   (stock's render: {_spread(warm['render-stock'])})")
    print(f"  {'list copy':<16} {_spread(warm['list-copy'])}")
    for base in ("fastokens", "fastokens+cache", "dr-no-sessions", "stock"):
        if base in warm:
            for n in ("dr-keyed", "dr-keyless"):
                print(f"  {n} vs {base}: " + _spread([b / d for b, d in zip(warm[base], warm[n])]).strip() + "x")
    print("  dr-keyless / dr-keyed: " + _spread([a / b for a, b in zip(warm["dr-keyless"], warm["dr-keyed"])]).strip()
          + "x (1.0: keyless as fast as keyed)")
    from delta_ray.apps.dropin.hf import STATE_ATTR
    sessions = {n: toks[n].__dict__[STATE_ATTR].current(toks[n]).sessions for n in ("dr-keyed", "dr-keyless")}
    for n, table in sessions.items():
        print(f"  {n}: {table.stats} ({len(table)} held, {table.resident_bytes / 2**20:.1f} MiB counted)")
    return 1 if any(mismatches.values()) else 0


# -- the collector and the kept lists (--gc) --------------------------------------------------------------
class _Tracked:
    """While inside: the drop-in's sessions keep their lists tracked (``untrack_ints`` is the
    identity), as before issue 58. Lists made then stay tracked; the ones made outside stay not."""

    def __enter__(self):
        from delta_ray._core import keyless, sessions
        self._mods = [(m, m.untrack_ints) for m in (sessions, keyless)]  # where kept lists are made
        for m, _ in self._mods:
            m.untrack_ints = lambda ids: ids

    def __exit__(self, *exc):
        for m, was in self._mods:
            m.untrack_ints = was


def collect_ms(repeats: int = 7) -> tuple[float, float]:
    """(median, fastest) of ``repeats`` full collections, ms."""
    import gc
    import statistics
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def run_gc(args, folder: str, native: bool | None) -> int:
    import contextlib
    import gc
    import statistics

    from transformers import AutoTokenizer

    from delta_ray import request_scope
    from delta_ray.apps.dropin import wrap_tokenizer
    from delta_ray.apps.dropin.hf import STATE_ATTR
    from delta_ray.apps.dropin.patch import SESSION_BYTES
    max_bytes = args.gc_bytes or SESSION_BYTES
    variants = ("untracked", "tracked")  # as shipped; the kept lists left tracked (before issue 58)
    stock = AutoTokenizer.from_pretrained(folder)
    t0 = time.perf_counter()
    toks = {v: wrap_tokenizer(AutoTokenizer.from_pretrained(folder), engine=args.engine, native_threads=native,
                              max_session_bytes=max_bytes) for v in variants}
    tables = {v: t.__dict__[STATE_ATTR].current(t).sessions for v, t in toks.items()}
    print(f"delta-ray ready in {time.perf_counter() - t0:.1f} s; engine: "
          f"{tables['untracked'].core.admission.engine}; each table {max_bytes / 2**30:.2f} GiB")

    def call(v: str, c: int, chat: list):
        with (_Tracked() if v == "tracked" else contextlib.nullcontext()), request_scope(session=f"conversation-{c}"):
            return toks[v].apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=False)

    def kept_ids(v: str) -> int:
        return tables[v].sessions.store.kept_ids

    # As many conversations as fit in the table: its first message to --gc-chars, then --turns
    # short turns on the last --conversations of them (the warm turns timed below).
    # (an entry counts at least 8 bytes a character: 45-50 an ID, under 6 characters an ID)
    n_max = args.gc_conversations or max_bytes // (8 * args.gc_chars) + 2
    warm_turns = args.turns
    t0 = time.perf_counter()
    pool = agent_conversations(args.gc_chars, warm_turns + 1, n_max, args.step)
    gc.collect()
    gc.freeze()  # the startup heap out of the collector's sight, as `vllm serve` does before it serves
    empty = collect_ms()
    n_fill = n_max
    for v in variants:
        table = tables[v]
        for c in range(n_fill):
            call(v, c, pool[c][:2])
            if table.sessions.store.evictions:
                break  # full: the table dropped its oldest conversation for this one
        gc.collect()
        print(f"  {v}: {len(table)} conversations held, {kept_ids(v):,} IDs kept, "
              f"{table.resident_bytes / 2**20:.0f} MiB counted ({table.sessions.store.evictions} evicted); "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        if v == "untracked":
            after = collect_ms()
            n_fill = c + 1
    convs = pool[:n_fill]
    del pool
    both = collect_ms()
    n_ids = kept_ids("untracked")
    # Warm turns on the most recent conversations (held by both tables), both variants per turn in
    # rotating order; the tracked table is alive throughout, so collections during either column's
    # turns walk its lists alike: the columns compare the turns' own work.
    pauses: list[float] = []
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if info.get("generation") == 2:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                pauses.append((time.perf_counter() - started[0]) * 1e3)
    gc.callbacks.append(on_gc)
    warm_ids = list(range(len(convs) - args.conversations, len(convs)))
    per = {v: {c: [] for c in warm_ids} for v in variants}
    mismatches = 0
    try:
        for t in range(1, warm_turns + 1):
            for k, c in enumerate(warm_ids):
                chat = convs[c][:2 + 2 * t]
                order = variants if (t + k) % 2 == 0 else variants[::-1]
                got = {}
                for v in order:
                    time.sleep(args.gap_ms / 1e3)
                    got[v], ms = timed_ms(lambda: call(v, c, chat))
                    per[v][c].append(ms)
                mismatches += got["untracked"] != got["tracked"]
                if t == warm_turns:
                    want = stock.apply_chat_template(chat, tokenize=True, add_generation_prompt=True,
                                                     return_dict=False)
                    mismatches += got["untracked"] != want
    finally:
        gc.callbacks.remove(on_gc)
    chars = len(stock.apply_chat_template(convs[warm_ids[0]][:2 + 2 * warm_turns], tokenize=False,
                                          add_generation_prompt=True))
    tables["untracked"].clear()
    gc.collect()
    before = collect_ms()
    tables["tracked"].clear()
    gc.collect()
    empty2 = collect_ms()
    empty_ms = min(empty[1], empty2[1])
    print(f"\nfull gc.collect(), ms (median / fastest of 7), {n_ids:,} IDs kept in "
          f"{len(convs)} conversations of {args.gc_chars:,} characters:")
    print(f"  tables empty (at the start / the end)   {empty[0]:7.1f} / {empty[1]:.1f}   "
          f"{empty2[0]:7.1f} / {empty2[1]:.1f}")
    print(f"  untracked table full (after)            {after[0]:7.1f} / {after[1]:.1f}   "
          f"(+{after[1] - empty_ms:.1f} ms over empty)")
    print(f"  tracked table full (before)             {before[0]:7.1f} / {before[1]:.1f}   "
          f"(+{before[1] - empty_ms:.1f} ms over empty)")
    print(f"  both full                               {both[0]:7.1f} / {both[1]:.1f}")
    print(f"  the table's cost to a full collection: {before[1] - empty_ms:.1f} ms tracked (before), "
          f"{after[1] - empty_ms:.1f} ms untracked (after)")
    warm = {v: [statistics.median(per[v][c][1:] or per[v][c]) for c in warm_ids] for v in variants}
    print(f"\nwarm agent turns (keyed; turns 2-{warm_turns} on {len(warm_ids)} conversations, to {chars:,} "
          f"characters), ms: median per conversation, then median (range) over conversations")
    for v in variants:
        print(f"  {v:<10} {_spread(warm[v])}")
    print("  tracked / untracked: " + _spread([b / a for a, b in zip(warm["untracked"], warm["tracked"])]).strip()
          + "x (>= 1.0: the untracked turn is no slower)")
    if pauses:
        print(f"  full collections during the warm turns: {len(pauses)}, longest {max(pauses):.1f} ms")
    print("every ID list equal" if not mismatches else f"{mismatches} turns DIFFER")
    return 1 if mismatches else 0


class Turn:
    def __init__(self, fn, chars):
        self.fn, self.chars = fn, chars

    def __call__(self, tok):
        return self.fn(tok)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="qwen-3", help="a bundled tokenizer with a chat template")
    ap.add_argument("--engine", default="fast", choices=("auto", "reference", "fast"))
    ap.add_argument("--turns", type=int, default=None, help="turns (default 20; --agent: 12)")
    ap.add_argument("--message-chars", type=int, default=6600, help="characters per message (two a turn)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cache-mib", type=int, default=256, help="fastokens' segment cache size")
    ap.add_argument("--content-reuse", action="store_true", help="also time delta-ray with content reuse on")
    ap.add_argument("--shadow-rate", type=float, default=None,
                    help="delta-ray's shadow re-check rate (default: the library's, 1%%, off the request path)")
    ap.add_argument("--fastokens-in-process", action="store_true",
                    help="time fastokens in this process (where delta-ray pins its pool to one thread) "
                         "instead of in a child process with its own default threading")
    ap.add_argument("--fastokens-threads", default=_USER_FASTOKENS_THREADS,
                    help="FASTOKENS_BPE_THREADS for the fastokens child (default: as in the environment; "
                         "unset: fastokens' own default)")
    ap.add_argument("--native-threads", choices=("auto", "on", "off"), default="auto",
                    help="delta-ray's native_threads drop-in option: auto (the default: fastokens' own "
                         "threads unless in a Ray worker), on, or off (the one-thread pin, as before)")
    ap.add_argument("--agent", action="store_true",
                    help="agent traffic instead: a first message to --context characters, then --turns turns "
                         "of ~2x--step characters; delta-ray with sessions keyed and keyless, and without")
    ap.add_argument("--context", type=int, default=250_000, help="--agent: the first message's characters")
    ap.add_argument("--step", type=int, default=800, help="--agent: characters per message of a turn (two a turn)")
    ap.add_argument("--conversations", type=int, default=3, help="--agent: conversations (each timed once per turn)")
    ap.add_argument("--gap-ms", type=float, default=5.0, help="--agent: idle before each timed call")
    ap.add_argument("--gc", action="store_true",
                    help="a full gc.collect() with the session table full, kept lists untracked (as shipped) and "
                         "tracked (before), and warm agent turns on both side by side")
    ap.add_argument("--gc-chars", type=int, default=1_000_000, help="--gc: characters per conversation")
    ap.add_argument("--gc-bytes", type=int, default=None, help="--gc: table bytes (default: the drop-in's, 1 GiB)")
    ap.add_argument("--gc-conversations", type=int, default=None,
                    help="--gc: at most this many conversations (default: until the table is full)")
    ap.add_argument("--vllm-calls", action="store_true",
                    help="also time raw prompts in vLLM 0.34's call shapes (truncation, and with offsets)")
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer:
        return peer_main()
    if args.turns is None:
        args.turns = 8 if args.gc else 12 if args.agent else 20
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when the output is a file
    from delta_ray.apps.dropin.folders import bundled_hf_folder
    from delta_ray.apps.sample_text import corpus

    with os.popen("uptime") as fh:
        print("load:", fh.read().strip())
    folder = bundled_hf_folder(args.tokenizer, tempfile.mkdtemp(prefix="bench-dropin-"))
    native = {"auto": None, "on": True, "off": False}[args.native_threads]
    if args.gc:
        status = run_gc(args, folder, native)
        with os.popen("uptime") as fh:
            print("\nload:", fh.read().strip(), "(2 cores shared with other jobs: compare columns, not runs)")
        return status
    if args.agent:
        status = run_agent(args, folder, native)
        with os.popen("uptime") as fh:
            print("\nload:", fh.read().strip(), "(2 cores shared with other jobs: compare columns, not runs)")
        return status
    toks = load_all(folder, args.engine, args.cache_mib, args.content_reuse, args.shadow_rate,
                    args.fastokens_in_process, native)
    if toks["stock"].chat_template is None:
        print(f"{args.tokenizer} ships no chat template: raw prompts only")
    prose, code = corpus("english", 2_000_000), corpus("code", 2_000_000)
    m = args.message_chars
    chat, chats = [{"role": "system", "content": "You are a careful assistant."}], []
    for t in range(args.turns):
        chat.append({"role": "user", "content": prose[t * m:(t + 1) * m]})
        chats.append(list(chat))
        chat.append({"role": "assistant", "content": code[t * m:(t + 1) * m]})
    raw = [prose[:(t + 1) * 2 * m] for t in range(args.turns)]
    has_chat = toks["stock"].chat_template is not None
    peer = None
    if not args.fastokens_in_process:
        inputs = {"chat": chats if has_chat else [], "raw": raw, "vllm": raw, "offsets": raw}
        peer = Peer(folder, args.cache_mib, inputs, args.fastokens_threads)
        from delta_ray._engine.native import fast_engine_threads
        mine = fast_engine_threads()
        print(f"fastokens timed in a child process, FASTOKENS_BPE_THREADS={peer.threads} there; "
              f"delta-ray here: FASTOKENS_BPE_THREADS={mine['FASTOKENS_BPE_THREADS']} "
              f"(native threads: {mine['native_threads']})")
    else:
        print(f"fastokens timed in this process: FASTOKENS_BPE_THREADS={os.environ.get('FASTOKENS_BPE_THREADS')}")
    try:
        if has_chat:
            calls = []
            for c in chats:
                chars = len(toks["stock"].apply_chat_template(c, tokenize=False, add_generation_prompt=True))
                calls.append(Turn(lambda tok, c=c: make_call("chat", c, tok)(), chars))
            run(toks, peer, "chat", calls, args.repeats,
                f"apply_chat_template(tokenize=True), {args.tokenizer}, chat growing by {2 * m} characters a turn")
        run(toks, peer, "raw", [Turn(lambda tok, x=x: make_call("raw", x, tok)(), len(x)) for x in raw],
            args.repeats, f"raw prompts tok(text)['input_ids'], {args.tokenizer}, growing by {2 * m} characters a turn")
        if args.vllm_calls:
            for kind, what in (("vllm", "truncation=True, max_length=N"),
                               ("offsets", "truncation=True, max_length=N, return_offsets_mapping=True")):
                run(toks, peer, kind, [Turn(lambda tok, x=x, k=kind: make_call(k, x, tok)(), len(x)) for x in raw],
                    args.repeats, f"raw prompts as vLLM 0.34 tokenizes them, tok(text, {what}), {args.tokenizer}")
    finally:
        if peer is not None:
            peer.close()
    with os.popen("uptime") as fh:
        print("\nload:", fh.read().strip(), "(2 cores shared with other jobs: compare columns, not runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
