"""The engines' request identity (``apps/dropin/binding.py``, ``vllm_scope.ScopedRenderer``), default tier:
which tenant and session key a request binds, the thread pools that carry it into the tokenizing
thread, the ``x-session-id`` middleware, and vLLM's renderer entry points over a stand-in with vLLM
0.33's structure (the real renderer is tested in the vLLM tier, ``test_dropin_vllm.py``)."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest

from delta_ray.apps.dropin import binding
from delta_ray.apps.dropin.binding import (
    MAX_SESSION_CHARS,
    SessionHeader,
    carry_scope,
    engine_scope,
    serve_session_id,
    session_or_none,
)
from delta_ray.apps.dropin.scope import Scope, current_scope, request_scope
from delta_ray.apps.dropin.vllm_scope import ScopedRenderer, request_tenant


def test_session_keys_are_bounded_strings():
    assert session_or_none("abc") == "abc"
    assert session_or_none("x" * MAX_SESSION_CHARS) == "x" * MAX_SESSION_CHARS
    for no in (None, "", "x" * (MAX_SESSION_CHARS + 1), 7, b"abc", ["a"]):
        assert session_or_none(no) is None


def test_the_request_tenant_wins_and_the_outer_scope_fills_in():
    with engine_scope(tenant="salt") as s:
        assert s == Scope(None, "salt")
    with request_scope(session="hdr", tenant="outer"):
        with engine_scope(tenant="salt") as s:
            assert s == Scope("hdr", "salt")  # a request never leaves its own namespace
        with engine_scope() as s:
            assert s == Scope("hdr", "outer")
        with engine_scope(session="own") as s:
            assert s == Scope("own", "outer")
        with engine_scope(session="x" * (MAX_SESSION_CHARS + 1)) as s:
            assert s == Scope("hdr", "outer")  # an unusable key is no key
    with engine_scope() as s:
        assert s == Scope(None, None)
    assert current_scope() is None


def test_ray_serve_session_id_is_read_from_the_request_context():
    """Ray Serve LLM: Serve's replica sets the request's context (its x-session-id) on the task that
    runs the engine; outside a request there is none, and nothing is created."""
    context = pytest.importorskip("ray.serve.context")
    assert serve_session_id() is None
    token = context._serve_request_context.set(context._RequestContext(session_id="conv-7"))
    try:
        assert serve_session_id() == "conv-7"
        with engine_scope(tenant="t") as s:
            assert s == Scope("conv-7", "t")
        with request_scope(session="explicit"):
            with engine_scope() as s:
                assert s.session == "explicit"  # a scope bound around the call comes first
    finally:
        context._serve_request_context.reset(token)
    token = context._serve_request_context.set(context._RequestContext())  # no header: ""
    try:
        assert serve_session_id() is None
    finally:
        context._serve_request_context.reset(token)
    assert context._serve_request_context.get() is None


def test_carry_scope_reaches_wrappers_captured_before_it():
    """vLLM's make_async captures the executor when the renderer is built: the scope must travel
    through that same object, each request's to its own call, under concurrency."""
    with ThreadPoolExecutor(3) as pool:
        def make_async(fn, executor):
            def wrapper(*args):
                return asyncio.get_running_loop().run_in_executor(executor, partial(fn, *args))
            return wrapper

        def seen(_):
            return current_scope()
        seen_async = make_async(seen, pool)  # captured first, as vLLM does

        async def requests():
            async def one(i):
                with request_scope(session=f"s{i}", tenant=f"t{i % 2}"):
                    await asyncio.sleep(0)
                    return await seen_async(i)
            return await asyncio.gather(*(one(i) for i in range(24)))

        assert asyncio.run(requests()) == [None] * 24  # nothing carried: the threads see no scope
        assert carry_scope(pool) is pool and binding.is_carrying(pool)
        assert asyncio.run(requests()) == [Scope(f"s{i}", f"t{i % 2}") for i in range(24)]
        assert pool.submit(current_scope).result() is None  # submitted outside any scope: none
        # the pool's threads keep no scope between calls
        assert [pool.submit(threading.get_ident).result() for _ in range(3)] and \
            pool.submit(lambda: current_scope()).result() is None


def _asgi_run(app, headers, kind="http"):
    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        pass
    asyncio.run(app({"type": kind, "headers": headers}, receive, send))


def test_session_header_middleware_binds_the_header_only():
    seen = []

    async def inner(scope, receive, send):
        seen.append(current_scope())
    app = SessionHeader(inner)
    _asgi_run(app, [(b"content-type", b"application/json"), (b"x-session-id", b"conv-1")])
    _asgi_run(app, [(b"X-Session-ID", b"conv-2")])
    _asgi_run(app, [])
    _asgi_run(app, [(b"x-session-id", b"")])
    _asgi_run(app, [(b"x-session-id", b"k" * (MAX_SESSION_CHARS + 1))])
    _asgi_run(app, [(b"x-session-id", b"conv-3")], kind="lifespan")
    assert seen == [Scope("conv-1", None), Scope("conv-2", None), None, None, None, None]
    assert current_scope() is None


def test_request_tenant_is_the_cache_salt():
    assert request_tenant({"cache_salt": "abc", "mm_processor_kwargs": {}}) == "abc"
    for no in (None, {}, {"cache_salt": ""}, {"cache_salt": None}, {"cache_salt": 3}, ["cache_salt"]):
        assert request_tenant(no) is None


class _StandInHfRenderer:
    """vLLM 0.33's renderer as far as identity goes (vllm/renderers/base.py, hf.py): two pools,
    ``make_async`` wrappers bound in ``__init__``, ``render_chat_async`` rendering each conversation
    on ``_executor`` (apply_chat_template) and tokenizing the text there too, the multimodal
    processor on ``_mm_executor``; the cache salt reaches it in ``prompt_extras`` only."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._executor = ThreadPoolExecutor(2)
        self._mm_executor = ThreadPoolExecutor(1)

        def make_async(fn, executor):
            def wrapper(*args, **kwargs):
                return asyncio.get_event_loop().run_in_executor(executor, partial(fn, *args, **kwargs))
            return wrapper
        self._apply_chat_template_async = make_async(tokenizer.render, self._executor)
        self._tokenize_prompt_async = make_async(tokenizer.encode, self._executor)
        self._process_multimodal_async = make_async(tokenizer.encode, self._mm_executor)

    async def render_chat_async(self, conversations, chat_params, tok_params=None, *, prompt_extras=None,
                                skip_mm_cache=False):
        texts = await asyncio.gather(*(self._apply_chat_template_async(c) for c in conversations))
        ids = await asyncio.gather(*(self._tokenize_prompt_async(t) for t in texts))
        await self._process_multimodal_async("image placeholder")
        return conversations, [{"prompt_token_ids": i, **(prompt_extras or {})} for i in ids]

    async def render_cmpl_async(self, prompts, tok_params=None, *, prompt_extras=None, skip_mm_cache=False):
        return [{"prompt_token_ids": await self._tokenize_prompt_async(p)} for p in prompts]

    def render_chat(self, conversations, chat_params, tok_params=None, *, prompt_extras=None, skip_mm_cache=False):
        return conversations, [{"prompt_token_ids": self.tokenizer.encode(self.tokenizer.render(c))}
                               for c in conversations]

    def render_cmpl(self, prompts, tok_params=None, *, prompt_extras=None, skip_mm_cache=False):
        return [{"prompt_token_ids": self.tokenizer.encode(p)} for p in prompts]


class _SpyTokenizer:
    """Records, per call, the text and the scope the calling thread sees (what the wrapped
    tokenizer would read)."""

    def __init__(self):
        self.calls: list[tuple[str, str, Scope | None]] = []
        self._lock = threading.Lock()

    def render(self, conversation):
        with self._lock:
            self.calls.append(("render", conversation[-1], current_scope()))
        return "|".join(conversation)

    def encode(self, text):
        with self._lock:
            self.calls.append(("encode", text, current_scope()))
        return [len(text)]


class _Renderer(ScopedRenderer, _StandInHfRenderer):
    pass


def test_scoped_renderer_binds_each_request_in_the_threads_that_tokenize():
    """Two tenants' requests interleaved: every render and encode, on whichever pool thread,
    sees its own request's salt (and the header's key); a request without a salt sees no tenant.
    Fails if the pools do not carry the scope (the threads would see None: the shared namespace)."""
    spy = _SpyTokenizer()
    renderer = _Renderer(spy)

    async def requests():
        async def one(i):
            salt = ("alpha", "beta", None)[i % 3]
            extras = {"cache_salt": salt} if salt else {}
            with request_scope(session=f"conv{i}"):  # as SessionHeader binds it
                await renderer.render_chat_async([[f"m{i}", f"turn{i}"]], None, prompt_extras=extras)
            await renderer.render_cmpl_async([f"plain{i}"], prompt_extras=extras)
        await asyncio.gather(*(one(i) for i in range(12)))
    asyncio.run(requests())
    by_request: dict[int, list] = {}
    for kind, text, scope in spy.calls:
        if text == "image placeholder":
            assert scope is not None and scope.session is not None
            continue
        i = int(text.rsplit("n", 1)[-1]) if text.startswith("plain") else int(text.split("turn")[-1])
        by_request.setdefault(i, []).append((kind, text, scope))
    assert sorted(by_request) == list(range(12))
    for i, calls in by_request.items():
        salt = ("alpha", "beta", None)[i % 3]
        for kind, text, scope in calls:
            session = None if text.startswith("plain") else f"conv{i}"
            assert scope == Scope(session, salt), (i, kind, text, scope)
    assert current_scope() is None


def test_scoped_renderer_sync_entry_points_bind_in_thread():
    spy = _SpyTokenizer()
    renderer = _Renderer(spy)
    renderer.render_chat([["a", "b"]], None, prompt_extras={"cache_salt": "s1"})
    renderer.render_cmpl(["c"], prompt_extras={"cache_salt": "s2"})
    renderer.render_cmpl(["d"])
    assert [c[2] for c in spy.calls] == [Scope(None, "s1"), Scope(None, "s1"), Scope(None, "s2"), Scope(None, None)]


def test_scoped_renderer_refuses_a_renderer_without_its_pools():
    class NoPools:
        def __init__(self, tokenizer):
            self.tokenizer = tokenizer

    class Broken(ScopedRenderer, NoPools):
        pass
    with pytest.raises(RuntimeError, match="_executor"):
        Broken(_SpyTokenizer())


def test_the_switch_scopes_every_registered_renderer_but_mistrals(monkeypatch):
    """``DELTA_RAY_VLLM=1``: every entry of vLLM's renderer registry (mode -> module, class) points
    at a subclass of the renderer vLLM registered, with ``ScopedRenderer`` first and everything
    else the original's; the ``mistral`` mode (not a transformers tokenizer) is left; idempotent.
    vLLM resolves the names by attribute lookup on the module (``vllm_renderer``'s ``__getattr__``,
    which only vLLM imports; the lookup is :func:`scoped_renderer`)."""
    import sys
    import types

    from delta_ray.apps.dropin import vllm_scope
    stand_in = types.ModuleType("stand_in_renderers")
    stand_in.StandIn = _StandInHfRenderer
    monkeypatch.setitem(sys.modules, "stand_in_renderers", stand_in)
    monkeypatch.setattr(vllm_scope, "_BASES", {})  # this process's registry state, restored after
    monkeypatch.setattr(vllm_scope, "_SCOPED", {})
    registry = {"hf": ("stand_in_renderers", "StandIn"), "deepseek_v4": ("stand_in_renderers", "StandIn"),
                "mistral": ("vllm.renderers.mistral", "MistralRenderer"),
                "delta_ray": ("delta_ray.apps.dropin.vllm_renderer", "DeltaRayRenderer")}
    module = "delta_ray.apps.dropin.vllm_renderer"
    vllm_scope.scope_renderers(registry, module)
    once = dict(registry)
    vllm_scope.scope_renderers(registry, module)
    assert registry == once
    assert registry["mistral"] == ("vllm.renderers.mistral", "MistralRenderer")
    assert registry["delta_ray"] == (module, "DeltaRayRenderer")
    for mode in ("hf", "deepseek_v4"):
        where, name = registry[mode]
        assert where == module
        cls = vllm_scope.scoped_renderer(name)
        assert cls.__mro__[1:3] == (ScopedRenderer, _StandInHfRenderer) and cls is vllm_scope.scoped_renderer(name)
        spy = _SpyTokenizer()
        cls(spy).render_cmpl(["x"], prompt_extras={"cache_salt": "t"})
        assert spy.calls == [("encode", "x", Scope(None, "t"))]
    with pytest.raises(AttributeError):
        vllm_scope.scoped_renderer("NotAScopedRenderer")


def test_the_switch_reads_zero_or_one(monkeypatch):
    from delta_ray.apps.dropin.vllm_plugin import SWITCH, switched_on
    monkeypatch.delenv(SWITCH, raising=False)
    assert switched_on() is False
    monkeypatch.setenv(SWITCH, "1")
    assert switched_on() is True
    monkeypatch.setenv(SWITCH, "yes")
    with pytest.raises(ValueError, match=SWITCH):
        switched_on()
    monkeypatch.setenv(SWITCH, "1")
    monkeypatch.setenv("VLLM_USE_FASTOKENS", "1")  # both under transformers: one must give way, so refused
    with pytest.raises(ValueError, match="VLLM_USE_FASTOKENS"):
        switched_on()
    monkeypatch.setenv("VLLM_USE_FASTOKENS", "0")
    assert switched_on() is True
