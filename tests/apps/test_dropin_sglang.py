"""SGLang (``apps/dropin/sglang_plugin.py``): what a request binds, and the four hooks on SGLang 0.5.23's
request path. The default tier runs them over stand-ins with SGLang's structure and its hook
registry's semantics; where SGLang imports (``python3 tests/tools/sglang_tier.py``: an environment of its
own on SGLang's pins, transformers 5.19.0 and tokenizers 0.23.2; its server needs CUDA kernels
and cannot start on these machines), the same
hooks go through SGLang's own ``HookRegistry`` onto its real classes, with its real request objects
and its real dynamic batch tokenizer."""
from __future__ import annotations

import asyncio
import json
import sys
import threading
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

from delta_ray.apps.dropin import sglang_plugin
from delta_ray.apps.dropin.binding import MAX_SESSION_CHARS
from delta_ray.apps.dropin.scope import Scope, current_scope, request_scope
from delta_ray.apps.dropin.sglang_plugin import TARGETS, hooks, sglang_scope, sglang_session, sglang_tenant


def req(**fields):
    base = {"rid": None, "session_id": None, "session_params": None, "extra_key": None, "cache_salt": None}
    return types.SimpleNamespace(**{**base, **fields})


def test_the_tenant_is_the_radix_caches_namespace():
    assert sglang_tenant(req()) is None
    assert sglang_tenant(req(extra_key="", cache_salt="")) is None  # SGLang reads "" as none
    a, b = sglang_tenant(req(extra_key="a")), sglang_tenant(req(cache_salt="a"))
    assert a and b and a != b  # the pair, not the values run together
    assert sglang_tenant(req(extra_key="a", cache_salt="b")) == json.dumps(["a", "b"])
    assert sglang_tenant(req(extra_key='["a", null]')) != sglang_tenant(req(extra_key="a"))


def test_the_session_key(monkeypatch):
    assert sglang_session(req(session_id="s1")) == "s1"
    headers = types.SimpleNamespace(headers={"x-session-id": "h1"})
    assert sglang_session(req(), headers) == "h1"
    assert sglang_session(req(session_id="s1"), headers) == "s1"
    assert sglang_session(req(rid="conv9:turn3"), None, ":") == "conv9"
    assert sglang_session(req(rid="conv9"), None, ":") is None
    assert sglang_session(req(rid="conv9:turn3")) is None  # no separator configured
    # SGLang's own session sends only the new turn: no tokenizer session for it
    assert sglang_session(req(session_id="s1", session_params={"id": "x"}), headers, ":") is None
    assert sglang_session(req(session_id="k" * (MAX_SESSION_CHARS + 1))) is None
    monkeypatch.setenv(sglang_plugin.RID_SEPARATOR, "/")
    with sglang_scope(req(rid="c7/2", cache_salt="s")) as s:
        assert s == Scope("c7", json.dumps([None, "s"]))


def test_enabled_only_by_the_variable(monkeypatch):
    monkeypatch.delenv(sglang_plugin.ENABLE, raising=False)
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", None)  # importing it would fail
    sglang_plugin.register()  # installed is not enabled: nothing happens, SGLang is not touched
    monkeypatch.setenv(sglang_plugin.ENABLE, "yes")
    with pytest.raises(ValueError, match="DELTA_RAY_SGLANG"):
        sglang_plugin.register()


class _Registry:
    """SGLang 0.5.23's HookRegistry semantics (plugins/hook_registry.py ``_wrap_fn``): AROUND calls
    ``hook(original, *args, **kwargs)``; AFTER calls the original then ``hook(result, *args, **kwargs)``,
    keeping the result when the hook returns None."""

    registered: list = []

    @classmethod
    def register(cls, target, hook, hook_type):
        cls.registered.append((target, hook, hook_type))

    @staticmethod
    def wrap(original, hook, kind):
        if kind == "AROUND":
            return lambda *a, **k: hook(original, *a, **k)

        def after(*a, **k):
            result = original(*a, **k)
            out = hook(result, *a, **k)
            return result if out is None else out
        return after


def test_register_registers_the_four_hooks(monkeypatch):
    import enum
    module = types.ModuleType("sglang.srt.plugins.hook_registry")
    module.HookRegistry = _Registry
    module.HookType = enum.Enum("HookType", ["BEFORE", "AFTER", "AROUND", "REPLACE"])
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", module)
    monkeypatch.setenv(sglang_plugin.ENABLE, "1")
    _Registry.registered = []
    sglang_plugin.register()
    got = {t: k.name for t, _, k in _Registry.registered}
    assert got == {TARGETS["wrap"]: "AFTER", TARGETS["chat"]: "AROUND", TARGETS["tokenize"]: "AROUND",
                   TARGETS["batcher"]: "AROUND"}


class _SpyTokenizer:
    def __init__(self):
        self.seen: list[tuple[str, Scope | None]] = []
        self.lock = threading.Lock()

    def __call__(self, text, **kwargs):
        with self.lock:
            self.seen.append((text, current_scope()))
        return {"input_ids": [len(text)]}


def _stand_ins(tokenizer):
    """SGLang's shapes: the serving layer renders on an executor thread, the manager tokenizes in
    the request's task, the dynamic batcher encodes queued prompts on its own thread."""
    class Serving:
        def _convert_to_internal_request(self, request, raw_request=None):
            return tokenizer(request.text)

        async def handle(self, request, raw_request=None):  # serving_base.handle_request
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, self._convert_to_internal_request, request, raw_request)

    class Batcher:
        def __init__(self):
            self.tokenizer, self.queue, self.pool = tokenizer, None, ThreadPoolExecutor(1)

        async def encode(self, prompt, **kwargs):
            if self.queue is None:
                self.queue = asyncio.Queue()
                asyncio.get_running_loop().create_task(self._loop())  # started once, outside any request
            future = asyncio.get_running_loop().create_future()
            await self.queue.put((prompt, future))
            return await future

        async def _loop(self):
            while True:
                prompt, future = await self.queue.get()
                result = await asyncio.get_running_loop().run_in_executor(self.pool, self.tokenizer, prompt)
                future.set_result(result)

    class Manager:
        def __init__(self, use_batcher=False):
            self.batcher = Batcher() if use_batcher else None

        async def _tokenize_one_request(self, obj):
            if self.batcher is not None:
                return await self.batcher.encode(obj.text)
            return tokenizer(obj.text)
    return Serving, Batcher, Manager


def test_the_hooks_bind_each_request_where_it_tokenizes():
    """Over stand-ins with SGLang's threading: the chat conversion on an executor thread, the
    manager's encode in the request's task, the dynamic batcher on its own thread. Every encode sees
    its own request's tenant and key; a request without identity is still batched. Fails without the
    hooks (the executor and batcher threads would see no scope)."""
    spy = _SpyTokenizer()
    Serving, Batcher, Manager = _stand_ins(spy)
    made = hooks({})
    Serving._convert_to_internal_request = _Registry.wrap(Serving._convert_to_internal_request, made["chat"][1],
                                                          "AROUND")
    Manager._tokenize_one_request = _Registry.wrap(Manager._tokenize_one_request, made["tokenize"][1], "AROUND")
    Batcher.encode = _Registry.wrap(Batcher.encode, made["batcher"][1], "AROUND")

    requests = [req(text=f"chat{i}", session_id=f"s{i}" if i % 2 else None, cache_salt=("a", "b", None)[i % 3])
                for i in range(9)]
    gens = [req(text=f"gen{i}", session_id=f"g{i}" if i % 2 else None, extra_key=("x", None)[i % 2])
            for i in range(8)]

    async def main():
        serving, plain, batched = Serving(), Manager(), Manager(use_batcher=True)
        await asyncio.gather(*(serving.handle(r) for r in requests),
                             *(plain._tokenize_one_request(g) for g in gens[:4]),
                             *(batched._tokenize_one_request(g) for g in gens[4:]))
    asyncio.run(main())
    seen = dict(spy.seen)
    for r in requests + gens:
        tenant, key = sglang_tenant(r), r.session_id
        want = Scope(key, tenant) if tenant is not None or key is not None else None  # none bound
        assert seen[r.text] == want, (r.text, seen[r.text])


def test_an_unscoped_request_still_goes_through_the_batch():
    spy = _SpyTokenizer()
    _, Batcher, _ = _stand_ins(spy)
    around = hooks({})["batcher"][1]
    calls = []

    async def original(batcher, prompt, **kwargs):
        calls.append(prompt)
        return {"input_ids": [0]}

    async def main():
        b = Batcher()
        await around(original, b, "unscoped")
        with request_scope(tenant="t"):
            await around(original, b, "scoped")
    asyncio.run(main())
    assert calls == ["unscoped"] and spy.seen == [("scoped", Scope(None, "t"))]


def test_a_request_without_identity_binds_no_scope_and_is_batched():
    """A request naming neither a session nor a tenant binds no scope (not ``Scope(None, None)``), so
    through the manager's hook it reaches SGLang's dynamic batch tokenizer as without delta-ray; one
    with a tenant or a key is encoded on its own in its scope. Fails when such a request binds an
    empty scope (the batcher hook then sends every request to a thread of its own)."""
    assert sglang_tenant(req()) is None and sglang_session(req()) is None
    with sglang_scope(req()) as s:
        assert s is None and current_scope() is None
    with request_scope(session="outer", tenant="t"):  # a scope around the call still fills it in
        with sglang_scope(req()) as s:
            assert s == Scope("outer", "t")
    with request_scope():  # an outer scope with no identity is no identity either
        with sglang_scope(req()) as s:
            assert current_scope() == Scope(None, None)

    spy = _SpyTokenizer()
    _, Batcher, Manager = _stand_ins(spy)
    made = hooks({})
    batched: list[str] = []
    batcher_encode = Batcher.encode

    async def counting_encode(self, prompt, **kwargs):  # SGLang's own batching path
        batched.append(prompt)
        return await batcher_encode(self, prompt, **kwargs)
    Batcher.encode = _Registry.wrap(counting_encode, made["batcher"][1], "AROUND")
    Manager._tokenize_one_request = _Registry.wrap(Manager._tokenize_one_request, made["tokenize"][1], "AROUND")
    plain = [req(text=f"plain{i}") for i in range(4)] + [req(text="empty", extra_key="", cache_salt="")]
    named = [req(text="keyed", session_id="s"), req(text="salted", cache_salt="a"), req(text="extra", extra_key="x")]

    async def main():
        manager = Manager(use_batcher=True)
        await asyncio.gather(*(manager._tokenize_one_request(r) for r in plain + named))
        with request_scope():  # an empty outer scope: still batched
            await manager._tokenize_one_request(req(text="in-empty-scope"))
    asyncio.run(main())
    assert sorted(batched) == sorted([r.text for r in plain] + ["in-empty-scope"])
    seen = dict(spy.seen)
    for r in plain:
        assert seen[r.text] is None, r.text
    assert seen["in-empty-scope"] is None  # the batch's thread carries no scope: equivalent to (None, None)
    for r in named:
        assert seen[r.text] == Scope(sglang_session(r), sglang_tenant(r)), r.text


def test_the_manager_tokenizer_is_wrapped_after_init(tmp_path):
    transformers = pytest.importorskip("transformers")
    from delta_ray.apps.dropin import is_wrapped
    from delta_ray.apps.dropin.folders import bundled_hf_folder
    folder = bundled_hf_folder("qwen-3", tmp_path)

    class Manager:
        def init_tokenizer_and_processor(self):
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder)

    wrap = hooks({"engine": "reference"})["wrap"][1]
    Manager.init_tokenizer_and_processor = _Registry.wrap(Manager.init_tokenizer_and_processor, wrap, "AFTER")
    m = Manager()
    m.init_tokenizer_and_processor()
    stock = transformers.AutoTokenizer.from_pretrained(folder)
    assert is_wrapped(m.tokenizer) and not is_wrapped(stock)
    text = "SGLang's tokenizer manager, wrapped in place. " * 50
    with sglang_scope(req(session_id="s", cache_salt="t")):
        assert m.tokenizer(text)["input_ids"] == stock(text)["input_ids"]


# -- SGLang itself (the SGLang tier): its HookRegistry, classes, request objects and batcher ----------
def _sglang():
    return pytest.importorskip("sglang.srt.managers.tokenizer_manager",
                               reason="SGLang tier: python3 tests/tools/sglang_tier.py")


def test_sglang_targets_exist_with_the_shapes_the_hooks_call():
    _sglang()
    import importlib
    import inspect
    shapes = {"wrap": ["self"], "chat": ["self", "request", "raw_request"], "tokenize": ["self", "obj"],
              "batcher": ["self", "prompt", "kwargs"]}
    for name, target in TARGETS.items():
        module, cls, attr = target.rsplit(".", 2)
        fn = getattr(getattr(importlib.import_module(module), cls), attr)
        fn = inspect.unwrap(fn)
        assert list(inspect.signature(fn).parameters) == shapes[name], target
        assert inspect.iscoroutinefunction(fn) == (name in ("tokenize", "batcher")), target


def test_sglang_request_objects_bind_their_identity():
    _sglang()
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.managers.io_struct import GenerateReqInput
    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], session_id="s1",
                                 cache_salt="salt", extra_key="ek", rid="r1")
    with sglang_scope(chat) as s:
        assert s == Scope("s1", json.dumps(["ek", "salt"]))
    gen = GenerateReqInput(text="hello", cache_salt="salt", session_id="s2")
    gen.normalize_batch_and_arguments()
    with sglang_scope(gen) as s:
        assert s == Scope("s2", json.dumps([None, "salt"]))
    cont = GenerateReqInput(text="next turn", session_params={"id": "sess"})
    cont.normalize_batch_and_arguments()
    with sglang_scope(cont) as s:
        assert s is None and current_scope() is None  # no identity: no scope bound


def test_sglang_registry_applies_the_hooks_and_its_batcher_keeps_tenants(tmp_path, monkeypatch):
    """SGLang's own HookRegistry applies the four hooks; its real AsyncDynamicbatchTokenizer over a
    wrapped qwen-3 answers stock's IDs, scoped requests each in their own scope, unscoped ones batched."""
    _sglang()
    import transformers
    from sglang.srt.managers.async_dynamic_batch_tokenizer import AsyncDynamicbatchTokenizer
    from sglang.srt.plugins.hook_registry import HookRegistry

    from delta_ray.apps.dropin import wrap_tokenizer
    from delta_ray.apps.dropin.folders import bundled_hf_folder
    monkeypatch.setenv(sglang_plugin.ENABLE, "1")
    monkeypatch.setenv("DELTA_RAY_ENGINE", "reference")
    HookRegistry.reset()
    sglang_plugin.register()
    HookRegistry.apply_hooks()
    folder = bundled_hf_folder("qwen-3", tmp_path)
    stock = transformers.AutoTokenizer.from_pretrained(folder)
    tok = wrap_tokenizer(transformers.AutoTokenizer.from_pretrained(folder), engine="reference")
    seen = []
    original_call = type(tok).__call__

    class Spy(type(tok)):
        def __call__(self, *args, **kwargs):
            seen.append((args[0] if isinstance(args[0], str) else tuple(args[0]), current_scope()))
            return original_call(self, *args, **kwargs)
    tok.__class__ = Spy
    texts = [f"request {i}: " + "words and more words " * (50 + i) for i in range(8)]

    async def main():
        batcher = AsyncDynamicbatchTokenizer(tok, max_batch_size=8, batch_wait_timeout_s=0.01)

        async def one(i):
            if i % 2:
                with request_scope(session=f"s{i}", tenant=f"t{i % 4}"):
                    return await batcher.encode(texts[i])
            return await batcher.encode(texts[i])
        return await asyncio.gather(*(one(i) for i in range(8)))
    out = asyncio.run(main())
    assert [o["input_ids"] for o in out] == [stock(t)["input_ids"] for t in texts]
    for i, t in enumerate(texts):
        scopes = [s for text, s in seen if text == t or (isinstance(text, tuple) and t in text)]
        assert scopes == ([Scope(f"s{i}", f"t{i % 4}")] if i % 2 else [None]), (i, scopes)
    HookRegistry.reset()
