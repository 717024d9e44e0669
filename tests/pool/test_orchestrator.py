"""The pool's orchestrator on a fake transport: routing, splicing, and every failure policy, without Ray.

The fake runs each call on an in-process ``WorkerService`` (the worker's own code, its own session
store) and injects the transport's failures: a dead worker, a hung one, a connection lost mid-call.
Every answer is compared with the reference.
"""
from __future__ import annotations

import asyncio
import json

import pyarrow as pa
import pytest

from conversations import shared_prompt_conversations
from delta_ray import SessionNotFound
from delta_ray._core.config import PoolConfig, TokenizerConfig
from delta_ray._core.keys import session_key
from delta_ray._core.loading import load_tokenizer
from delta_ray._core.plan import CHUNKED, HERE, POOL
from delta_ray._tokenizer_core import TokenizerCore
from delta_ray.actors.calls import EXTEND
from delta_ray.actors.orchestrator import PoolOrchestrator
from delta_ray.actors.transport import ConnectionLost, WorkerDead
from delta_ray.actors.worker import WorkerService

SECRET = b"s" * 32
TOK = TokenizerConfig(chunk_size=4096, cut_threshold=12_000, threads=1, engine="reference", shadow_rate=0.0)


class _NoMetrics:
    def __getattr__(self, name):
        return lambda *a, **k: None


class FakeTransport:
    """Calls run on in-process worker services; failures are injected per worker."""

    def __init__(self, services: dict[str, WorkerService], shared: WorkerService):
        self.services, self.shared = services, shared
        self.dead: set[str] = set()
        self.hung: set[str] = set()
        self.drop_connection: set[str] = set()  # the next call's answer is lost after it was applied
        self.calls: list[tuple[str | None, str]] = []
        self.retired: list[tuple[str, bool]] = []
        self.gates: dict[str | None, asyncio.Event] = {}  # a gated worker answers once its event is set

    async def call(self, wid, call):
        self.calls.append((wid, call.kind.method))
        await asyncio.sleep(0)  # a real transport answers on a later loop turn
        if wid in self.gates:
            await self.gates[wid].wait()
        if wid in self.dead:
            raise WorkerDead(wid)
        if wid in self.hung:
            await asyncio.Event().wait()
        svc = self.shared if wid is None else self.services[wid]
        out = getattr(svc, call.kind.method)(*call.args)
        if wid in self.drop_connection:
            self.drop_connection.discard(wid)
            if not call.kind.idempotent:
                raise ConnectionLost(wid)
        return out

    def retire(self, wid, *, kill):
        self.retired.append((wid, kill))

    def close(self):
        pass


@pytest.fixture(scope="module")
def loaded(tokenizer_paths):
    return load_tokenizer(tokenizer_paths["llama3.2"])


def _orchestrator(loaded, n_workers=2, **pool):
    services = {f"w{i}": WorkerService(TokenizerCore(loaded, TOK), SECRET) for i in range(n_workers)}
    transport = FakeTransport(services, WorkerService(TokenizerCore(loaded, TOK), SECRET))
    cfg = PoolConfig(tokenizer=TOK, **{"placement": False, "request_timeout_s": 5.0, **pool}).resolved(2)
    loop = asyncio.new_event_loop()
    local = TokenizerCore(loaded, TOK)
    orch = PoolOrchestrator(local, transport, list(services), cfg, loop, SECRET, record=_NoMetrics())
    return orch, transport, loop


def _ids(arr) -> list[int]:
    return arr.to_pylist()


@pytest.fixture()
def text(real_texts):
    return real_texts["english"][:6_000]


def test_sessions_extends_and_chunks_are_exact(loaded, references, real_texts, text):
    ref = references["llama3.2"]
    orch, transport, loop = _orchestrator(loaded)
    run = loop.run_until_complete
    got = run(orch.encode(text, "a", True))
    assert type(got) is pa.ChunkedArray and _ids(got) == ref.encode(text).ids
    grown = text + " and one more turn"
    assert _ids(run(orch.encode(grown, "a", True))) == ref.encode(grown).ids
    assert orch.stats["session_delta"] == 1  # only the suffix travelled
    assert _ids(run(orch.extend("a", "!", False))) == ref.encode(grown + "!", add_special_tokens=False).ids
    start, count, tail = run(orch.extend_tail("a", " And more.", True))
    full = ref.encode(grown + "! And more.").ids
    assert count == len(full) and list(tail) == full[start:] and 0 < start
    long_text = real_texts["code"][:40_000]
    assert _ids(run(orch.encode(long_text, None, True))) == ref.encode(long_text).ids
    assert orch.stats["chunked"] == 1 and any(w is None for w, _ in transport.calls)
    long_session = real_texts["multilingual"][:30_000]
    assert _ids(run(orch.encode(long_session, "b", True))) == ref.encode(long_session).ids
    assert orch.stats["chunked_init"] == 1  # pieces in parallel, then the home worker adopts the state
    assert _ids(run(orch.extend("b", " x", True))) == ref.encode(long_session + " x").ids
    # a splice's IDs are counted from its lengths (k + tail), not walked: the same bytes
    from delta_ray.actors.session_table import ids_bytes
    table = orch.sessions
    assert all(r.ids_nbytes == ids_bytes(r.ids[1]) for r in table._data.values() if r.ids is not None)
    assert table.resident_bytes == sum(r.nbytes for r in table._data.values())
    loop.close()


def test_dead_worker_is_retired_and_its_session_moves(loaded, references, text):
    ref = references["llama3.2"]
    orch, transport, loop = _orchestrator(loaded)
    run = loop.run_until_complete
    assert _ids(run(orch.encode(text, "s", True))) == ref.encode(text).ids
    home = orch.home_of("s")
    transport.dead.add(home)
    grown = text + " after the crash"
    assert _ids(run(orch.encode(grown, "s", True))) == ref.encode(grown).ids
    assert home not in orch.dispatcher.workers and (home, False) in transport.retired
    assert orch.stats["worker_retired"] == 1
    assert orch.home_of("s") != home
    # The suffix-only turn found no session on the new home, so the whole text went there.
    assert _ids(run(orch.extend("s", "!", True))) == ref.encode(grown + "!").ids
    loop.close()


def test_hung_worker_times_out_to_in_process_and_is_killed(loaded, references, text):
    ref = references["llama3.2"]
    orch, transport, loop = _orchestrator(loaded, request_timeout_s=0.05)
    run = loop.run_until_complete
    assert _ids(run(orch.encode(text, "h", True))) == ref.encode(text).ids
    home = orch.home_of("h")
    transport.hung.add(home)
    grown = text + " while it hangs"
    assert _ids(run(orch.encode(grown, "h", True))) == ref.encode(grown).ids  # encoded in process
    assert orch.stats["timeout_fallback"] == 1
    assert (home, True) in transport.retired and home not in orch.dispatcher.workers
    other = orch.home_of("h")
    transport.hung.add(other)
    with pytest.raises(SessionNotFound, match="timed out"):  # an extend has no text to fall back on
        run(orch.extend("h", "!", True))
    assert not orch.dispatcher.workers  # both hung: every request is now encoded in process
    assert _ids(run(orch.encode(grown + " on", "h", True))) == ref.encode(grown + " on").ids
    assert orch.stats["no_workers_fallback"] >= 1
    loop.close()


def test_connection_lost_mid_extend_refuses_instead_of_guessing(loaded, references, text):
    ref = references["llama3.2"]
    orch, transport, loop = _orchestrator(loaded)
    run = loop.run_until_complete
    run(orch.encode(text, "c", True))
    home = orch.home_of("c")
    transport.drop_connection.add(home)
    with pytest.raises(SessionNotFound, match="connection"):
        run(orch.extend("c", " applied or not?", True))
    assert not transport.services[home].has_session(session_key("c"))  # dropped on the worker, not half-known
    assert home in orch.dispatcher.workers  # alive: not retired
    assert _ids(run(orch.encode(text + " again", "c", True))) == ref.encode(text + " again").ids
    # An idempotent call whose connection dropped is simply answered (the transport re-runs it).
    transport.drop_connection.add(home)
    assert _ids(run(orch.encode(text + " again!", "c", True))) == ref.encode(text + " again!").ids
    loop.close()


def test_hung_chunk_task_is_abandoned_and_encoded_here(loaded, references, real_texts):
    ref = references["llama3.2"]
    orch, transport, loop = _orchestrator(loaded, request_timeout_s=0.05)
    transport.hung.add(None)
    long_text = real_texts["code"][:30_000]
    assert _ids(loop.run_until_complete(orch.encode(long_text, None, True))) == ref.encode(long_text).ids
    assert orch.stats["timeout_fallback"] >= 1 and not transport.retired  # tasks are not workers
    assert orch.dispatcher.workers == ("w0", "w1") or set(orch.dispatcher.workers) == {"w0", "w1"}
    loop.close()


def test_unadmitted_configuration_encodes_once_with_the_reference_template(tokenizer_paths, references, real_texts):
    ref = references["llama3.2"]
    cfg = json.loads(open(tokenizer_paths["llama3.2"], encoding="utf-8").read())
    cfg["normalizer"] = {"type": "Lowercase"}  # not covered by the exactness argument
    from delta_ray._core.reference_api import tokenizer_from_str
    lowered_ref = tokenizer_from_str(json.dumps(cfg))
    loaded = load_tokenizer(lowered_ref)
    orch, transport, loop = _orchestrator(loaded)
    assert not orch.router.admitted
    run = loop.run_until_complete
    text = real_texts["english"][:9_000]
    got = run(orch.encode(text, "u", True))
    assert type(got) is pa.ChunkedArray and _ids(got) == lowered_ref.encode(text).ids  # a session answer's type
    assert [m for _, m in transport.calls] == ["encode_whole"]  # one encode, template by the reference
    got = run(orch.extend("u", " MORE", False))
    assert type(got) is pa.ChunkedArray
    assert _ids(got) == lowered_ref.encode(text + " MORE", add_special_tokens=False).ids
    with pytest.raises(SessionNotFound):
        run(orch.extend("never-seen", "x", True))
    assert ref is not None
    loop.close()


def test_placement_runs_a_text_where_it_finishes_first(loaded, real_texts):
    orch, _, loop = _orchestrator(loaded, placement=True)
    text = (real_texts["english"] * 3)[:200_000]
    orch.placement.local_chars_per_ms = 200_000.0  # a fast engine in the caller: stay here
    assert orch.router.decide(text) is CHUNKED  # in the caller, on its threads
    orch.placement.local_chars_per_ms = 100.0  # a slow caller: the pool's chunks win
    assert orch.router.decide(text) is POOL
    assert orch.router.decide("short text") is HERE  # under 4,096 bytes: always here
    loop.close()


def test_placement_counts_the_chunks_a_text_is_cut_into_not_the_slots(loaded, real_texts):
    # A slow caller and slow chunks (the reference engine's rate) on a pool of 256 task slots: a
    # 500K text runs as the planner's 8 chunks, and their fixed cost (8 x chunk_ms) leaves the pool
    # far ahead; charged per slot (256 x chunk_ms) it would have kept the text here.
    orch, _, loop = _orchestrator(loaded, placement=True, max_inflight_tasks=256)
    text = (real_texts["english"] * 10)[:500_000]
    orch.placement.local_chars_per_ms = orch.placement.remote_chars_per_ms = 1500.0
    assert orch._chunks(text) < orch._slots() and orch.router.decide(text) is POOL
    loop.close()


def test_extend_calls_are_declared_not_idempotent():
    assert not EXTEND.idempotent and EXTEND.session_delta and EXTEND.channel


def test_keyless_content_reuse_stays_inside_its_tenant(loaded, references, real_texts):
    """A keyless prompt sticky by content on a worker (Serve's overflow to the pool) is reused only
    by its own tenant: the second tenant's identical prompt finds no state (no replay, no repair)."""
    ref = references["llama3.2"]
    orch, transport, loop = _orchestrator(loaded)
    run = loop.run_until_complete
    text = real_texts["multilingual"][:5_000]  # over 4,096 bytes, under cut_threshold: content path
    reuse = ("replay", "repair")

    def reused() -> int:
        return sum(svc.core.stats[k] for svc in transport.services.values() for k in reuse)

    got = run(orch.encode(text, None, True, tenant="victim"))
    assert type(got) is pa.Int32Array and _ids(got) == ref.encode(text).ids  # keyless: one array
    assert _ids(run(orch.encode(text, None, True, tenant="attacker"))) == ref.encode(text).ids
    assert reused() == 0  # the attacker's request was a first encode, as slow as the victim's
    assert _ids(run(orch.encode(text, None, False, tenant="victim"))) == ref.encode(text, add_special_tokens=False).ids
    assert reused() == 1  # inside one tenant, content reuse still works
    assert _ids(run(orch.encode(text, None, True))) == ref.encode(text).ids  # no tenant: its own namespace
    assert reused() == 1
    loop.close()


def test_keyless_answer_is_copied_by_the_c_allocator(loaded, references, real_texts):
    """A keyless prompt's one array is not allocated from pyarrow's default pool (mimalloc's huge-page
    arena faulted fresh 2 MB pages, 5-9 ms each here: design §15), and is the reference's IDs."""
    orch, _, loop = _orchestrator(loaded)
    text = real_texts["multilingual"][:5_000]
    got = loop.run_until_complete(orch.encode(text, None, True, tenant="t"))
    assert type(got) is pa.Int32Array and _ids(got) == references["llama3.2"].encode(text).ids
    default = pa.default_memory_pool()
    held = default.bytes_allocated()
    del got  # the answer's buffer is its own copy: freeing it frees nothing of the default pool
    assert default.bytes_allocated() == held
    loop.close()


def test_session_records_are_bounded_and_evicted_whole(loaded, references, real_texts, monkeypatch):
    """Every per-session table of the orchestrator is bounded: past the limit the oldest session is
    forgotten entirely (its start included), and a forgotten session still answers exactly."""
    from delta_ray._core import constants as C
    ref = references["llama3.2"]
    monkeypatch.setattr(C, "KNOWN_SESSIONS", 8)
    orch, transport, loop = _orchestrator(loaded)
    run = loop.run_until_complete
    base = real_texts["english"][:2_000]
    for i in range(40):
        text = f"{i}: {base}"
        assert _ids(run(orch.encode(text, f"s{i}", True))) == ref.encode(text).ids
        assert _ids(run(orch.extend(f"s{i}", " more", True))) == ref.encode(text + " more").ids
    assert len(orch.sessions) == 8
    for name, value in vars(orch).items():  # no per-session table outside the one record table
        if isinstance(value, dict) and name != "stats":
            assert len(value) <= 8, name
    # The first session was forgotten here but is held by its worker: its next turn is exact.
    grown = f"0: {base} more and more"
    assert _ids(run(orch.encode(grown, "s0", True))) == ref.encode(grown).ids
    start, count, tail = run(orch.extend_tail("s0", "!", True))
    full = ref.encode(grown + "!").ids
    assert count == len(full) and list(tail) == full[start:]
    loop.close()


def test_session_table_bounds_bytes_and_drops_values_too_large_to_keep():
    import numpy as np

    from delta_ray.actors.session_table import SessionTable
    table = SessionTable(max_bytes=100_000, max_items=1_000)

    def field(key, name):
        rec = table.get(key)
        return None if rec is None else getattr(rec, name)
    for i in range(50):
        table.set(f"k{i}", "ids", (i, (np.zeros(2_500, np.int32),)))  # 10 KB each
    assert table.resident_bytes <= 100_000 and len(table) < 10
    assert field("k49", "ids")[0] == 49 and field("k0", "ids") is None
    table.set("huge", "ids", (1, (np.zeros(20_000, np.int32),)))  # over half the bound: not kept
    assert field("huge", "ids") is None and table.resident_bytes <= 100_000
    table.set("k49", "text", (3, ("abc",)))
    table.forget("k49")
    assert field("k49", "ids") is None and field("k49", "text") is None
    assert (table.set("never", "start", None) or 0) == 0 and len(table) == len(table._data)


def test_session_table_counts_every_byte_it_holds_across_updates():
    """A request writes its record in one call (answered / sent / sent_now): whatever the order of
    writes, clears and evictions, the byte count is the sum of the records' sizes and stays bounded."""
    import random

    import numpy as np

    from delta_ray.actors.session_table import SessionTable
    table = SessionTable(max_bytes=60_000, max_items=12)
    rnd = random.Random(7)
    for step in range(2_000):
        key, op = f"k{rnd.randrange(30)}", rnd.randrange(6)
        if op == 0:
            table.answered(key, "w1", step, (np.zeros(rnd.randrange(0, 9_000), np.int32),), rnd.randrange(5))
        elif op == 1:
            table.sent(key, step, ("x" * rnd.randrange(0, 20_000),))
        elif op == 2:
            table.sent_now(key, ("y" * rnd.randrange(0, 3_000),))
        elif op == 3:
            table.sent(key, None, None)
        elif op == 4:
            table.set(key, "start", None)
        else:
            table.forget(key)
        assert table.resident_bytes == sum(r.nbytes for r in table._data.values())
        assert len(table) <= 12 and (table.resident_bytes <= 60_000 or len(table) == 1)


def test_key_digests_do_not_keep_large_keys_alive():
    """The digest cache bounds the keys it holds by length: 64 keys of 256K characters, used once,
    must not stay resident (a count-bounded cache kept the last 256 keys whatever their size)."""
    import gc
    import tracemalloc

    from delta_ray.actors.session_table import key_id
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(64):
            key = f"{i}:" + "k" * 262_144
            assert key_id(key) == key_id(key)
            del key
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 4 * 1024 * 1024, held  # 64 x 256 KB = 16 MB if the keys were kept
def test_a_timed_out_request_never_runs_late_nor_is_spliced(loaded, references, real_texts, text):
    """Session q's request goes to H, which dies; it is re-queued on O behind a slow request and
    times out there, so its caller gets the in-process answer and q is forgotten. When O frees up,
    the stale task must not run, and no late answer may enter the pool's tables (it would record a
    state version and IDs the caller never received)."""
    import dataclasses
    ref = references["llama3.2"]
    orch, transport, loop = _orchestrator(loaded)
    h = orch.home_of("q")
    o = next(w for w in orch.dispatcher.workers if w != h)
    b_key = next(k for k in (f"b{i}" for i in range(1000)) if orch.home_of(k) == o)
    b_text = real_texts["code"][:5_000]

    async def scenario():
        gate_h, gate_o = asyncio.Event(), asyncio.Event()
        transport.gates.update({h: gate_h, o: gate_o})
        transport.dead.add(h)
        orch.calls.config = dataclasses.replace(orch.config, request_timeout_s=0.3)  # q's timer
        q = asyncio.ensure_future(orch.encode(text, "q", True))
        while (h, "encode_session") not in transport.calls:
            await asyncio.sleep(0.001)
        orch.calls.config = dataclasses.replace(orch.config, request_timeout_s=60.0)  # b's: it only waits
        b = asyncio.ensure_future(orch.encode(b_text, b_key, True))
        while (o, "encode_session") not in transport.calls:
            await asyncio.sleep(0.001)
        gate_h.set()  # H answers "dead": q is re-queued on O, behind b, and times out there
        got_q = await q
        gate_o.set()  # O finishes b and would take q's stale task next
        got_b = await b
        for _ in range(10):
            await asyncio.sleep(0.01)
        return got_q, got_b

    got_q, got_b = loop.run_until_complete(scenario())
    assert _ids(got_q) == ref.encode(text).ids and _ids(got_b) == ref.encode(b_text).ids
    assert orch.stats["timeout_fallback"] == 1 and o in orch.dispatcher.workers
    assert transport.calls.count((o, "encode_session")) == 1  # b's only: q's stale task never ran
    assert not transport.services[o].has_session(session_key("q"))
    rec = orch.sessions.get("q")
    assert rec is None or (rec.version is None and rec.ids is None)  # nothing spliced
    assert orch.dispatcher.queued_count() == 0 and orch.calls.waiting() == 0
    grown = text + " later"
    assert _ids(loop.run_until_complete(orch.encode(grown, "q", True))) == ref.encode(grown).ids
    loop.close()


def test_a_late_answer_is_not_spliced(loaded, references, text):
    """The answer arrives after its caller's timer fired (the transport could not be stopped in
    time): it is dropped, not recorded as the session's state."""
    ref = references["llama3.2"]
    orch, transport, loop = _orchestrator(loaded, request_timeout_s=0.2)
    home = orch.home_of("late")
    orig = transport.call

    async def slow_but_uncancellable(wid, call):
        out = asyncio.ensure_future(orig(wid, call))
        await asyncio.sleep(0.4)  # past the timeout; cancelling this awaits the shielded call
        return await asyncio.shield(out)
    transport.call = slow_but_uncancellable
    orch.calls._free_hung = lambda task, req: None  # e.g. a worker this process may not kill
    assert _ids(loop.run_until_complete(orch.encode(text, "late", True))) == ref.encode(text).ids
    loop.run_until_complete(asyncio.sleep(0.5))
    assert orch.stats["timeout_fallback"] == 1 and transport.services[home].has_session(session_key("late"))
    rec = orch.sessions.get("late")
    assert rec is None or (rec.version is None and rec.ids is None)
    loop.close()


def test_an_answer_keeping_more_ids_than_held_is_refused(loaded, references, text):
    """A worker's delta that claims to keep more IDs than this pool holds for the session cannot be
    spliced: the caller is told to send the whole text (the session forgotten), never handed IDs
    kept short; the next whole text is exact again."""
    ref = references["llama3.2"]
    orch, transport, loop = _orchestrator(loaded)
    run = loop.run_until_complete
    run(orch.encode(text, "k", True))
    real_call = transport.call

    async def overclaiming(wid, call):
        out = await real_call(wid, call)
        if call.kind.method == "extend":
            version, k, tail = out
            return version, k + 10_000, tail
        return out
    transport.call = overclaiming
    with pytest.raises(SessionNotFound, match="does not match"):
        run(orch.extend("k", " more", True))
    transport.call = real_call
    assert orch.sessions.get("k") is None or orch.sessions.get("k").ids is None
    assert _ids(run(orch.encode(text + " more", "k", True))) == ref.encode(text + " more").ids
    loop.close()


def test_a_session_named_after_a_content_key_reads_and_replaces_nothing(loaded, references, real_texts):
    """Keyless texts were kept on the workers under "t-|c:<blake2b of the first 4 KB>" and caller-
    chosen session names under themselves, in one string space: a session named after another
    caller's content key extended that caller's whole last text (its secret tail included) or
    replaced it. Now a session's key and a content key never meet, and the digest is keyed."""
    import hashlib

    from delta_ray._core.keys import ContentDigest, content_key

    ref = references["llama3.2"]
    orch, transport, loop = _orchestrator(loaded, n_workers=1)
    run = loop.run_until_complete
    victim = real_texts["english"][:5_000] + " My account number is 4242-1717-9999."
    assert _ids(run(orch.encode(victim, None, True, tenant="bank"))) == ref.encode(victim).ids
    head = victim.encode()[:4096]
    spellings = [f"t4:bank|c:{hashlib.blake2b(head, digest_size=16).hexdigest()}",  # the old, unkeyed key
                 content_key(ContentDigest.derived(SECRET, b"delta-ray pool content keys").of(victim), "bank")]
    svc = transport.services["w0"]
    for spelled in spellings:
        for tenant in (None, "bank"):
            with pytest.raises(SessionNotFound):
                run(orch.extend(spelled, "", True, tenant=tenant))
        other = "Attacker text. " * 400
        assert _ids(run(orch.encode(other, spelled, True))) == ref.encode(other).ids
    replays = svc.core.stats["replay"]
    assert _ids(run(orch.encode(victim, None, True, tenant="bank"))) == ref.encode(victim).ids
    assert svc.core.stats["replay"] == replays + 1  # the victim's state was left as it was
    loop.close()


def test_interleaved_keyless_conversations_are_each_continued_on_their_worker(loaded, references, real_texts):
    """Keyless prompts of three conversations behind one system prompt, interleaved, under the cut
    threshold (the pool's content path): the head's worker holds each conversation under its own key
    (the core's keyless policy), so every turn after a conversation's first continues it; every
    answer is the reference's. With the head as the key, one state held them all."""
    ref = references["llama3.2"]
    orch, transport, loop = _orchestrator(loaded)
    run = loop.run_until_complete
    convs = shared_prompt_conversations(real_texts, n=3, turns=4, system_chars=5_000, turn_chars=1_500)
    for t in range(4):
        for renders in convs:
            got = run(orch.encode(renders[t], None, True, tenant="team"))
            assert type(got) is pa.Int32Array and _ids(got) == ref.encode(renders[t]).ids
    cores = [svc.sessions for svc in transport.services.values()]
    assert sum(len(s.store) for s in cores) == 3  # one head, one worker, three conversations
    assert sum(core.stats["init"] for core in cores) == 3 and sum(core.stats["repair"] for core in cores) == 9
    loop.close()
