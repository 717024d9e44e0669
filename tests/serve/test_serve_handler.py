"""The Serve replica's request handling without Ray: versioned appends, tenants on the pool path, an
event loop that stays responsive. Every 200 is compared with the reference."""
from __future__ import annotations

import asyncio
import json
import time

import orjson
import pytest

from conversations import shared_prompt_conversations
from delta_ray._core.config import TokenizerConfig
from delta_ray._core.loading import load_tokenizer
from delta_ray._tokenizer_core import TokenizerCore
from delta_ray.apps.bundled import bundled_tokenizer_config
from delta_ray.server.chat_template import ChatTemplate
from delta_ray.server.http_api import BadRequest
from delta_ray.server.serve_handler import RequestHandler

NAME = "llama3.2"  # a BOS template: IDs with and without add_special_tokens differ
TOK = TokenizerConfig(chunk_size=4096, cut_threshold=12_000, threads=1, engine="reference", shadow_rate=0.0)


@pytest.fixture(scope="module")
def loaded(tokenizer_paths):
    return load_tokenizer(tokenizer_paths[NAME])


@pytest.fixture(scope="module")
def ref(references):
    return references[NAME]


class _NoMetrics:
    def __getattr__(self, name):
        return lambda *a, **k: None


def _handler(loaded, **kw) -> RequestHandler:
    return RequestHandler(loaded, TokenizerCore(loaded, TOK), served={NAME}, record=_NoMetrics(),
                          template=ChatTemplate.from_config(bundled_tokenizer_config(NAME)), **kw)


async def _chunks(raw: bytes):
    yield raw


def _post(h: RequestHandler, body: dict, endpoint: str = "tokenize") -> tuple[int, dict]:
    status, data, _ = asyncio.run(h.http(endpoint, None, _chunks(json.dumps(body).encode())))
    return status, json.loads(data)


class _Client:
    """One conversation's client: keeps the IDs and the session_version of its last answer."""

    def __init__(self, sid: str, tenant: str = "t"):
        self.sid, self.tenant, self.ids, self.version = sid, tenant, None, None

    def prompt(self, h, text: str, **extra) -> tuple[int, dict]:
        status, out = _post(h, {"prompt": text, "session_id": self.sid, "cache_salt": self.tenant, **extra})
        if status == 200:
            self.ids, self.version = out["tokens"], out["session_version"]
        return status, out

    def append(self, h, delta: str, version: str | None = None, **extra) -> tuple[int, dict]:
        body = {"append": delta, "session_id": self.sid, "cache_salt": self.tenant,
                "session_version": version or self.version, **extra}
        status, out = _post(h, body)
        if status == 200:
            assert out["count"] == out["start"] + len(out["tokens"])
            self.ids, self.version = self.ids[:out["start"]] + out["tokens"], out["session_version"]
        return status, out


@pytest.fixture()
def text(real_texts) -> str:
    return real_texts["english"][:8_000]


def test_append_extends_the_state_its_version_names(loaded, ref, text):
    h = _handler(loaded)
    c = _Client("conv")
    assert c.prompt(h, text)[0] == 200 and c.ids == ref.encode(text).ids
    for i in range(3):
        delta = f"\nUser: question {i}?\nAssistant: answer {i}."
        text += delta
        status, out = c.append(h, delta)
        assert status == 200 and c.ids == ref.encode(text).ids and 0 < out["start"]
    # The same flag given explicitly is the session's; a version is never reusable across keys.
    assert c.append(h, "!", add_special_tokens=True)[0] == 200 and c.ids == ref.encode(text + "!").ids
    assert _Client("other").append(h, "x", version=c.version)[0] == 409


def test_an_append_to_a_stale_replica_is_a_409_not_wrong_ids(loaded, ref, text):
    """A turn served by the fallback replica leaves the home's state stale: an append that reaches
    the home with the fallback's version must not extend the stale text."""
    home, fallback = _handler(loaded), _handler(loaded)
    c = _Client("moved")
    assert c.prompt(home, text)[0] == 200
    text += " first turn."
    assert c.append(home, " first turn.")[0] == 200 and c.ids == ref.encode(text).ids
    text += " second turn, served elsewhere."
    assert c.prompt(fallback, text)[0] == 200 and c.ids == ref.encode(text).ids
    status, out = c.append(home, " third.")  # home still holds the text without the second turn
    assert status == 409 and "send the whole text" in out["error"]["message"], out
    assert c.prompt(home, text + " third.")[0] == 200 and c.ids == ref.encode(text + " third.").ids


def test_a_retried_append_is_not_applied_twice(loaded, ref, text):
    h = _handler(loaded)
    c = _Client("retry")
    c.prompt(h, text)
    sent_version = c.version
    assert c.append(h, " once.")[0] == 200 and c.ids == ref.encode(text + " once.").ids
    status, out = c.append(h, " once.", version=sent_version)  # the response was lost; the client retries
    assert status == 409, out
    assert c.append(h, " twice.")[0] == 200 and c.ids == ref.encode(text + " once. twice.").ids


def test_append_flags_must_match_the_session(loaded, ref, text):
    h = _handler(loaded)
    c = _Client("flags")
    c.prompt(h, text, add_special_tokens=False)
    assert c.ids == ref.encode(text, add_special_tokens=False).ids
    status, out = c.append(h, " more", add_special_tokens=True)
    assert status == 400 and "add_special_tokens" in out["error"]["message"], out
    assert c.append(h, " more")[0] == 200  # without the flag: the session's
    assert c.ids == ref.encode(text + " more", add_special_tokens=False).ids
    assert c.prompt(h, text, add_special_tokens=True)[0] == 200 and c.ids == ref.encode(text).ids
    assert c.append(h, " on")[0] == 200 and c.ids == ref.encode(text + " on").ids


def test_append_needs_a_version_and_a_held_session(loaded):
    h = _handler(loaded)
    for body in ({"append": "x", "session_id": "s"}, {"append": "x", "session_id": "s", "session_version": 3},
                 {"prompt": "x", "session_id": "s", "session_version": "v"}):
        status, out = _post(h, body)
        assert status == 400 and "session_version" in out["error"]["message"], body
    status, out = _post(h, {"append": "x", "session_id": "never", "session_version": "00"})
    assert status == 409 and "send the whole text" in out["error"]["message"]
    status, out = _post(h, {"prompt": "keyless"})
    assert status == 200 and "session_version" not in out


class _FakePool:
    def __init__(self, delta: TokenizerCore):
        self.core, self.calls = delta, []

    async def encode_async(self, text, *, add_special_tokens=True, session=None, tenant=None):
        self.calls.append({"session": session, "tenant": tenant})
        return self.core.encode(text, add_special_tokens=add_special_tokens)


def test_keyless_prompts_sent_to_the_pool_keep_their_tenant(loaded, ref, text):
    pool = _FakePool(TokenizerCore(loaded, TOK))
    h = _handler(loaded, pool=pool, pool_min_chars=1_000)
    for tenant in ("victim", "attacker", None):
        body = {"prompt": text} if tenant is None else {"prompt": text, "cache_salt": tenant}
        status, out = _post(h, body)
        assert status == 200 and out["tokens"] == ref.encode(text).ids
    assert [c["tenant"] for c in pool.calls] == ["victim", "attacker", None]


def test_serve_app_refuses_tenantless_content_reuse(tokenizer_paths):
    from delta_ray.actors.serve import serve_app
    with pytest.raises(ValueError, match="reuse"):
        serve_app(tokenizer_paths[NAME], reuse="content")


async def _first_done(big, small) -> list[str]:
    order: list[str] = []
    tasks = [asyncio.ensure_future(big), asyncio.ensure_future(small)]
    for name, t in zip(("big", "small"), tasks):
        t.add_done_callback(lambda _, n=name: order.append(n))
    await asyncio.gather(*tasks, return_exceptions=True)
    return order


def test_a_large_detokenize_leaves_the_loop_to_other_requests(loaded):
    """The per-ID validation of 1M IDs runs in a thread: a cheap request started after it is
    answered first (on the loop it would wait for the whole validation)."""
    h = _handler(loaded)
    tokens = [1] * 1_000_000 + [h.vocab_size]  # validated to the end, then refused
    order = asyncio.run(_first_done(h.detokenize_body({"tokens": tokens}), h.tokenize_body({"prompt": "hi"})))
    assert order == ["small", "big"]
    small = _handler(loaded, max_detokenize_tokens=1_000)
    status, out = _post(small, {"tokens": [1] * 1_001}, "detokenize")
    assert status == 413 and "limit" in out["error"]["message"]
    status, out = _post(small, {"tokens": [9906, 1917]}, "detokenize")
    assert status == 200 and out["prompt"] == "Hello world"


def test_token_strs_of_a_large_answer_leave_the_loop_to_other_requests(loaded, ref, real_texts):
    h = _handler(loaded)
    text = (real_texts["code"] * 2)[:100_000]  # encoded on the loop (under the thread threshold)
    order: list[str] = []

    async def race():
        big = asyncio.ensure_future(h.tokenize_body({"prompt": text, "return_token_strs": True}))
        small = asyncio.ensure_future(h.tokenize_body({"prompt": "hi"}))
        big.add_done_callback(lambda _: order.append("big"))
        small.add_done_callback(lambda _: order.append("small"))
        return (await big)[0]
    out = asyncio.run(race())
    assert order == ["small", "big"]
    assert out["token_strs"] == [ref.id_to_token(i) for i in ref.encode(text).ids]


def test_serve_config_takes_the_config_classes_own_fields():
    """serve_app's keyword options are TokenizerConfig / PoolConfig fields, validated once into a
    frozen ServeConfig; no list of names is kept by hand, so every field reaches its process."""
    from dataclasses import fields

    from delta_ray._core.config import PoolConfig
    from delta_ray.server.serve_config import ServeConfig

    cfg = ServeConfig.from_options({"chunk_size": 8192, "cut_threshold": 20_000, "max_sessions": 7,
                                    "request_timeout_s": 9.0, "engine": "reference"}, threads=3, num_workers=2)
    assert (cfg.tokenizer.chunk_size, cfg.tokenizer.cut_threshold, cfg.tokenizer.threads) == (8192, 20_000, 3)
    assert cfg.tokenizer.max_sessions == 7 and cfg.tokenizer.engine == "reference"
    assert cfg.pool.num_workers == 2 and cfg.pool.request_timeout_s == 9.0
    assert cfg.pool.tokenizer.chunk_size == 8192 and cfg.pool.tokenizer.engine == "reference"
    assert cfg.pool.tokenizer.max_sessions == PoolConfig().tokenizer.max_sessions  # the replica's bound only
    for f in fields(TokenizerConfig):  # every tokenizer field is accepted (threads is serve_app's own)
        if f.name not in ("threads", "reuse"):
            ServeConfig.from_options({f.name: getattr(TokenizerConfig(), f.name)})
    assert ServeConfig.from_options({}).pool is None
    with pytest.raises(TypeError, match="unknown"):
        ServeConfig.from_options({"chunk_sise": 1})
    with pytest.raises(TypeError, match="num_workers"):
        ServeConfig.from_options({"request_timeout_s": 1.0})  # a pool option without a pool
    with pytest.raises(ValueError, match="reuse"):
        ServeConfig.from_options({"reuse": "content"})
    with pytest.raises(ValueError):
        ServeConfig(max_body_bytes=0)
    assert "ab" * 16 not in repr(ServeConfig(pool_name="p", pool_secret="ab" * 16))  # never in logs


def test_a_409_names_the_session_never_its_tenants_salt(loaded, ref, text):
    """A session's store key carries its tenant's cache_salt: no answer may show it, however the
    append is refused (not held, another state, evicted while it ran)."""
    from delta_ray._core.session_store import SessionNotFound

    salt = "tenant-secret-salt-0042"
    h = _handler(loaded)
    c = _Client("conv-9", tenant=salt)
    answers = [c.append(h, "x", version="00")]  # never held here
    assert c.prompt(h, text)[0] == 200
    answers.append(c.append(h, "x", version="ff" * 16))  # held, but another state
    real = h.sessions.encode_session_delta

    def evicted(key, *a, **k):  # the core names the key it was given, salt and all
        raise SessionNotFound(f"session {key!r} is not held (unknown or evicted)")
    h.sessions.encode_session_delta = evicted
    answers.append(c.append(h, "x"))
    h.sessions.encode_session_delta = real
    for status, out in answers:
        message = out["error"]["message"]
        assert status == 409 and salt not in message and "'conv-9'" in message, message
    assert c.append(h, " on")[0] == 200 and c.ids == ref.encode(text + " on").ids


async def _longest_stall(request, tick: float = 0.005):
    """(the longest stall of a coroutine sleeping ``tick`` on this loop while ``request()`` runs,
    its answer).

    A stall is a gap between the coroutine's turns, counted only as far as this process used the
    CPU meanwhile: a thread holding the GIL burns CPU for as long as it holds the loop, while a VM
    shared with other processes also deschedules the whole process now and then, which is not the
    handler's doing."""
    stalls: list[float] = []
    done = asyncio.Event()

    async def ticker():
        last, last_cpu = time.perf_counter(), time.process_time()
        while not done.is_set():
            await asyncio.sleep(tick)
            now, cpu = time.perf_counter(), time.process_time()
            stalls.append(min(now - last, cpu - last_cpu))
            last, last_cpu = now, cpu
    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(4 * tick)
    try:
        out = await request()
    finally:
        done.set()
        await task
    return max(stalls), out


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _streamed(raw: bytes, read: list, size: int = 64 * 1024):
    for i in range(0, len(raw), size):
        read.append(min(size, len(raw) - i))
        yield raw[i:i + size]


def test_hostile_bodies_do_not_stall_the_event_loop(loaded, ref):
    """Work that holds the GIL stalls the replica's loop even in a thread. A coroutine ticking
    every 5 ms on the handler's loop records its longest gap while each hostile request runs; it
    must stay near the gap a well-behaved busy thread causes (measured first, on this machine)."""
    h = _handler(loaded)
    ids = [9906, 1917, 13] * 333_333  # 999,999 IDs: a million-ID decode, under the 1,048,576 limit
    decoded = ref.decode(ids)
    over = json.dumps({"tokens": [1] * 8_000_000}).encode()  # 24 MB: past the /detokenize body limit
    dense = orjson.dumps({"tokens": [1] * 8_000_000})  # 16 MB, under it: 8M IDs refused by count
    chat = {"messages": [{"role": "user", "content": "x"}] * 2_000_000}
    chat_raw = orjson.dumps({"messages": chat["messages"][:1_000_000]})  # 34 MB: under the body limit
    read: list[int] = []
    unread: list[int] = []  # what a body refused by its Content-Length had read: nothing

    async def handle_api_chat():
        try:
            return await h.tokenize(chat)  # validated (all 2,000,000), then: no chat template here
        except BadRequest as exc:
            return exc.status, str(exc).encode(), {}

    cases = {
        "/detokenize past its limit, by Content-Length": (
            lambda: h.http("detokenize", str(len(over)), _streamed(over, unread)), 413),
        "/detokenize past its limit, streamed without a length": (
            lambda: h.http("detokenize", None, _streamed(over, read)), 413),
        "/detokenize of 8M one-digit IDs under the byte limit": (
            lambda: h.http("detokenize", str(len(dense)), _chunks(dense)), 413),
        "/detokenize of a million IDs": (
            lambda: h.http("detokenize", None, _chunks(orjson.dumps({"tokens": ids}))), 200),
        "/tokenize of a million chat messages": (lambda: h.http("tokenize", None, _chunks(chat_raw)), 413),
        "2M chat messages through the handle API": (handle_api_chat, 400),
    }

    async def run():
        baseline, _ = await _longest_stall(lambda: asyncio.to_thread(_spin, 0.3))
        bound = max(0.05, 3 * baseline)
        stalls, answers = {}, {}
        for name, (request, _) in cases.items():
            best = None
            for _ in range(3):  # the least of three runs: a stall that is the request's comes back
                stall, (got, data, _) = await _longest_stall(request)
                best = stall if best is None else min(best, stall)
            stalls[name], answers[name] = round(best * 1000, 1), (got, data)
        return baseline, bound, stalls, answers
    baseline, bound, stalls, answers = asyncio.run(run())
    assert all(ms < bound * 1000 for ms in stalls.values()), (f"baseline {baseline * 1000:.1f} ms", stalls)
    for name, (_, status) in cases.items():
        assert answers[name][0] == status, (name, answers[name][1][:300])
    assert json.loads(answers["/detokenize of a million IDs"][1])["prompt"] == decoded
    # The streamed body (sent three times) was refused as it passed the limit, not read to its end.
    assert sum(read) <= 3 * (h.max_detokenize_bytes + 64 * 1024) < 3 * len(over) and unread == []


def test_the_reference_encodes_long_texts_off_the_loop(loaded, ref, real_texts):
    """The fast engine encodes 128K characters in about a millisecond, the reference in 40-70 ms:
    where the reference encodes (this handler's configuration), a prompt or append of 20,000
    characters is encoded in a thread, not on the event loop."""
    import threading

    h = _handler(loaded)
    assert not h.core.uses_fast_engine
    on_loop: list[str] = []
    real_encode, real_delta = h.core.encode_routed, h.sessions.encode_session_delta

    def where(name, fn):
        def run(*a, **k):
            if threading.current_thread() is threading.main_thread():  # asyncio.run's loop
                on_loop.append(name)
            return fn(*a, **k)
        return run
    h.core.encode_routed = where("encode", real_encode)
    h.sessions.encode_session_delta = where("append", real_delta)
    text = (real_texts["english"] * 2)[:20_000]
    assert _post(h, {"prompt": text})[1]["tokens"] == ref.encode(text).ids
    c = _Client("long")
    assert c.prompt(h, text)[0] == 200 and c.append(h, text)[0] == 200 and c.ids == ref.encode(text + text).ids
    assert on_loop == []
    assert _post(h, {"prompt": text[:2_000]})[0] == 200 and on_loop == ["encode"]  # short ones stay on the loop


def test_the_warm_up_leaves_no_session_behind(loaded, ref):
    """build_handler warms both paths before the first request (their lazy imports cost the first
    client 0.2-0.3 s); the session it used is dropped, and no client's name can reach it."""
    h = _handler(loaded)
    h.warm()
    assert len(h.sessions.store) == 0
    assert _post(h, {"prompt": "warm-up", "session_id": "warm-up"})[1]["tokens"] == ref.encode("warm-up").ids


def test_interleaved_keyless_conversations_sharing_a_system_prompt_are_each_held(loaded, ref, real_texts):
    """Keyless prompts of three agents behind one 50K-character system prompt, interleaved, in one
    tenant: each conversation is held under its own key (the core's keyless policy), so its next
    turn continues it; every answer is the reference's. With the first 4 KB as the key, one entry
    held them all and each turn re-encoded from the shared prompt on."""
    h = _handler(loaded)
    convs = shared_prompt_conversations(real_texts, turns=3)
    for t in range(3):
        for c, renders in enumerate(convs):
            out, where = asyncio.run(h.tokenize_body({"prompt": renders[t], "cache_salt": "team"}))
            assert out["tokens"].tolist() == ref.encode(renders[t]).ids
            # the first is new; the others' first turns fork from a held one's prompt
            assert where == ("new" if t == c == 0 else "held") and "session_version" not in out
    assert len(h.sessions.store) == len(convs)
    for renders in convs:
        choice = h.sessions.choose_keyless(renders[-1] + " next", "team")
        assert choice is not None and not choice.new
    assert h.core.stats["repair"] >= 2 * len(convs) and h.core.stats["reencode"] == 0
