"""SGLang: the drop-in under SGLang's tokenizer manager, each request's identity bound where it tokenizes.

SGLang loads ``register`` through its ``sglang.srt.plugins`` entry point (pyproject) in each of its
processes. Installed is not enabled: it acts only with ``DELTA_RAY_SGLANG=1`` in the server's
environment (an installed package must not change every SGLang on the machine); then it registers,
through SGLang's documented hook registry (``sglang.srt.plugins.hook_registry.HookRegistry``), four
hooks on SGLang 0.5.23's request path:

- after ``TokenizerManager.init_tokenizer_and_processor``: the manager's tokenizer (the one its
  OpenAI layer, ``_tokenize_texts`` and the dynamic batch tokenizer share) is wrapped
  (:func:`~delta_ray.apps.dropin.wrap_tokenizer`, options from the environment as for vLLM);
  other processes' tokenizers stay stock;
- around ``OpenAIServingChat._convert_to_internal_request``, which renders and encodes a chat on an
  executor thread (``serving_base.handle_request`` runs it through ``loop.run_in_executor``): the
  request's scope is bound inside that thread;
- around ``TokenizerManager._tokenize_one_request`` (``/generate`` and completions with text): the
  request's scope is bound in the request's task, where ``_tokenize_texts`` encodes;
- around ``AsyncDynamicbatchTokenizer.encode`` (``--enable-dynamic-batch-tokenizer``): a request
  with a scope is encoded on its own in a thread that carries its scope (``asyncio.to_thread``)
  instead of joining a batch whose thread would carry none, so no request is encoded outside its
  tenant; requests without a scope are batched as before. A request that names no session and no
  tenant binds no scope at all (the hooks above bind nothing for it), so it joins the batch: the
  batch's thread, which carries no scope, encodes it exactly as its own scope would.

What a request binds (:func:`sglang_scope`): tenant = its ``extra_key`` and ``cache_salt`` (the pair
SGLang's radix cache keys its namespaces by; ``None`` for both is the shared namespace); session key =
its ``session_id`` (SGLang's stable session identity), else the ``x-session-id`` header of an OpenAI
request, else the part of its ``rid`` before ``DELTA_RAY_SGLANG_RID_SEPARATOR`` when that is set
(a request-id prefix naming the conversation), else a scope bound around the call or Ray Serve's
session id. A request with ``session_params`` binds no session key: it sends only its new turn
(SGLang's session holds the context), which is no transcript a tokenizer session could extend.

SGLang's ``parallel_prompt_encode`` (long chats) encodes with the backend directly only for a stock
``TokenizersBackend``; a wrapped tokenizer's class hooks make it call ``tokenizer.encode``, which the
drop-in serves.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
from typing import Any

from .binding import engine_scope, session_or_none
from .patch import wrap_tokenizer
from .scope import Scope, current_scope
from .vllm_plugin import env_options

ENABLE = "DELTA_RAY_SGLANG"
RID_SEPARATOR = "DELTA_RAY_SGLANG_RID_SEPARATOR"
_MANAGER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
TARGETS = {
    "wrap": f"{_MANAGER}.init_tokenizer_and_processor",
    "chat": "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._convert_to_internal_request",
    "tokenize": f"{_MANAGER}._tokenize_one_request",
    "batcher": "sglang.srt.managers.async_dynamic_batch_tokenizer.AsyncDynamicbatchTokenizer.encode",
}
__all__ = ["ENABLE", "RID_SEPARATOR", "TARGETS", "hooks", "register", "sglang_scope", "sglang_session",
           "sglang_tenant"]


def enabled() -> bool:
    """Whether ``DELTA_RAY_SGLANG`` asks for the integration (``1``; ``0`` or unset: no)."""
    value = os.environ.get(ENABLE, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{ENABLE} must be 0 or 1, got {value!r}")
    return value == "1"


def sglang_tenant(request: Any) -> str | None:
    """The namespace of SGLang's radix cache a request names: its ``(extra_key, cache_salt)``, as one
    injective string (the JSON of the pair, so ``extra_key="a"`` and ``cache_salt="a"`` differ);
    None when it names neither (SGLang turns an empty string into None too)."""
    extra = getattr(request, "extra_key", None) or None
    salt = getattr(request, "cache_salt", None) or None
    if extra is None and salt is None:
        return None
    return json.dumps([extra, salt], ensure_ascii=False)


def sglang_session(request: Any, raw_request: Any = None, rid_separator: str | None = None) -> str | None:
    """The session key a request carries: ``session_id``, else the ``x-session-id`` header of
    ``raw_request``, else ``rid``'s prefix before ``rid_separator``; None with ``session_params``."""
    if getattr(request, "session_params", None):
        return None  # only the new turn's text reaches the tokenizer; SGLang's session holds the rest
    key = session_or_none(getattr(request, "session_id", None))
    if key is None and raw_request is not None:
        headers = getattr(raw_request, "headers", None)
        key = session_or_none(headers.get("x-session-id")) if headers is not None else None
    if key is None and rid_separator:
        rid = getattr(request, "rid", None)
        if isinstance(rid, str) and rid_separator in rid:
            key = session_or_none(rid.split(rid_separator, 1)[0])
    return key


def sglang_scope(request: Any, raw_request: Any = None):
    """The :func:`~delta_ray.request_scope` a SGLang request binds (see the module's docstring); a
    request that names neither a session nor a tenant (nor finds one around it) binds none (a
    ``nullcontext``, whose ``with`` gives None): it is encoded as without delta-ray's hooks, by the
    dynamic batch tokenizer too."""
    separator = os.environ.get(RID_SEPARATOR) or None
    scope = engine_scope(tenant=sglang_tenant(request),
                         session=sglang_session(request, raw_request, separator))
    return scope if _has_identity(scope.scope) else _UNSCOPED


_UNSCOPED = contextlib.nullcontext()  # reusable and re-entrant: it binds nothing


def _has_identity(scope: Scope | None) -> bool:
    """Whether ``scope`` names a session or a tenant (``Scope(None, None)`` reads as no scope: the
    wrapped tokenizer's keyless lookup in the shared namespace, which every thread gets anyway)."""
    return scope is not None and (scope.session is not None or scope.tenant is not None)


def hooks(options: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """target name -> (SGLang hook type, hook): what :func:`register` registers."""
    def wrap_after_init(result, manager, *args, **kwargs):
        tok = getattr(manager, "tokenizer", None)
        if tok is not None:
            wrap_tokenizer(tok, **options)  # in place: every holder of the object sees it
        return result

    def around_chat(original, serving, request, *args, **kwargs):
        raw_request = args[0] if args else kwargs.get("raw_request")
        with sglang_scope(request, raw_request):
            return original(serving, request, *args, **kwargs)

    async def around_tokenize(original, manager, obj, *args, **kwargs):
        with sglang_scope(obj):
            return await original(manager, obj, *args, **kwargs)

    async def around_batcher(original, batcher, prompt, **kwargs):
        if not _has_identity(current_scope()):  # SGLang's own batch, as without the hooks
            return await original(batcher, prompt, **kwargs)
        # The batch runs on the batcher's thread, which carries no request's scope: encode this one
        # on its own, in a thread that carries it (to_thread copies the context).
        return await asyncio.to_thread(batcher.tokenizer, prompt, **kwargs)

    return {"wrap": ("AFTER", wrap_after_init), "chat": ("AROUND", around_chat),
            "tokenize": ("AROUND", around_tokenize), "batcher": ("AROUND", around_batcher)}


def register() -> None:
    """SGLang general plugin (``sglang.srt.plugins``): with ``DELTA_RAY_SGLANG=1``, register the hooks."""
    if not enabled():
        return
    # SGLang calls this; importing it at the top would make the module need SGLang to be imported
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    for name, (kind, hook) in hooks(env_options()).items():
        HookRegistry.register(TARGETS[name], hook, HookType[kind])
