"""vLLM tokenizer mode ``delta_ray``: vLLM's own HF tokenizer, encoding through delta-ray.

vLLM loads ``register`` through the ``vllm.general_plugins`` entry point (pyproject) in every
process it starts, Ray Serve LLM's router included, so ``vllm serve --tokenizer-mode delta_ray``
and ``engine_kwargs={"tokenizer_mode": "delta_ray"}`` both find the mode. The tokenizer is vLLM's
``CachedHfTokenizer`` loaded with the drop-in attached to the transformers object BEFORE vLLM
wraps it: vLLM's cached tokenizer (and its thread pool) pickles by rebuilding its subclass around
that original object (``__reduce__``), and deep-copies it, so the drop-in state must live on the
original, where both carry it along. The renderer is vLLM's ``HfRenderer`` with the request's
identity bound around its tokenization (:class:`ScopedRenderer`, ``delta_ray.apps.dropin.vllm_renderer``).

Request identity. vLLM's OpenAI layer hands its renderer the messages and ``prompt_extras``, where the
request's ``cache_salt`` is (``OnlineRenderer.preprocess_chat``/``preprocess_cmpl`` ->
``render_chat_async``/``render_cmpl_async``); no header, ``session_id`` or ``vllm_xargs`` field reaches
it (vLLM reads the session id after rendering, for the engine). So the renderer binds
(:func:`~delta_ray.apps.dropin.binding.engine_scope`): tenant = the request's ``cache_salt`` (the
namespace vLLM's prefix cache keeps it in), else the tenant of a scope bound around the call; session
key = a scope bound around the call (``delta_ray.apps.dropin.binding.SessionHeader`` binds the
``x-session-id`` header under ``vllm serve --middleware``), else the Ray Serve request's session id
(Ray Serve LLM: the ``x-session-id`` header, carried by Serve to the replica); with no key the
wrapped tokenizer looks the text up by content inside the tenant. The renderer renders and tokenizes
on its thread pools (``BaseRenderer._executor`` and ``_mm_executor`` in vLLM 0.33: ``make_async``
wraps ``loop.run_in_executor``, which copies no context variables), so it makes both pools run each
function in the scope of the request that submitted it (:func:`~delta_ray.apps.dropin.binding.carry_scope`),
and refuses to start where a pool is missing rather than let a request tokenize outside its tenant.

Options come from the environment, since vLLM passes none to a tokenizer mode:
``DELTA_RAY_CONTENT_REUSE=1`` turns keyless content reuse on (off by default: one server holds
many tenants), ``DELTA_RAY_ENGINE`` picks the engine (``auto`` by default),
``DELTA_RAY_FAST_RENDER=0`` renders chat templates as transformers does (the memoized sandbox,
``delta_ray.apps.dropin.render``, is on by default).
"""
from __future__ import annotations

import os
from concurrent.futures import Executor
from typing import Any

from .binding import carry_scope, engine_scope, is_carrying

MODE = "delta_ray"
RENDERER = ("delta_ray.apps.dropin.vllm_renderer", "DeltaRayRenderer")
# The renderer's thread pools (vLLM 0.33's BaseRenderer): tokenization and chat rendering run on
# `_executor`, the multimodal processor (which may call the same tokenizer) on `_mm_executor`.
POOLS = ("_executor", "_mm_executor")
__all__ = ["MODE", "POOLS", "DeltaRayTokenizer", "ScopedRenderer", "register", "request_tenant"]


def _flag(name: str, default: str) -> bool:
    value = os.environ.get(name, default)
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def _options() -> dict:
    return {"content_reuse": _flag("DELTA_RAY_CONTENT_REUSE", "0"),
            "engine": os.environ.get("DELTA_RAY_ENGINE", "auto"),
            "fast_render": _flag("DELTA_RAY_FAST_RENDER", "1")}


def register() -> None:
    """vLLM general plugin: register the ``delta_ray`` tokenizer mode and its renderer."""
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry

    if MODE not in TokenizerRegistry.tokenizers:
        TokenizerRegistry.register(MODE, __name__, "DeltaRayTokenizer")
    if RENDERER_REGISTRY.renderers.get(MODE) != RENDERER:
        RENDERER_REGISTRY.register(MODE, *RENDERER)


class DeltaRayTokenizer:
    """vLLM ``TokenizerLike`` factory for ``tokenizer_mode="delta_ray"``: ``from_pretrained`` returns
    vLLM's cached HF tokenizer whose transformers object encodes through delta-ray."""

    @classmethod
    def from_pretrained(cls, path_or_repo_id, *args, **kwargs):
        from vllm.tokenizers.hf import CachedHfTokenizer

        from .patch import loading_wrapped

        kwargs.pop("mistral_format", None)  # set by vLLM for its "hf" mode only
        with loading_wrapped(**_options()):
            return CachedHfTokenizer.from_pretrained(path_or_repo_id, *args, **kwargs)


def request_tenant(prompt_extras: Any) -> str | None:
    """The tenant a vLLM request names: its ``cache_salt`` from the ``prompt_extras`` vLLM's
    OpenAI layer passes its renderer (vLLM validated it: a non-empty str); None without one."""
    if not isinstance(prompt_extras, dict):
        return None
    salt = prompt_extras.get("cache_salt")
    return salt if isinstance(salt, str) and salt else None


class ScopedRenderer:
    """Mixin over vLLM's ``HfRenderer`` (``DeltaRayRenderer(ScopedRenderer, HfRenderer)``): the four
    entry points through which vLLM renders and tokenizes a request run inside the request's
    :func:`~delta_ray.request_scope`, and the renderer's thread pools carry that scope into the
    threads that tokenize. Everything else is vLLM's own."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        for name in POOLS:
            pool = getattr(self, name, None)
            if not isinstance(pool, Executor):
                # A vLLM whose renderer tokenizes elsewhere would tokenize outside the request's tenant.
                raise RuntimeError(f"tokenizer_mode={MODE!r}: this vLLM's renderer has no thread pool at "
                                   f"{name!r}, where delta-ray carries each request's tenant; use "
                                   f"tokenizer_mode='hf' or a delta-ray that supports this vLLM")
            if not is_carrying(pool):
                carry_scope(pool)

    async def render_chat_async(self, *args: Any, **kwargs: Any):
        with engine_scope(tenant=request_tenant(kwargs.get("prompt_extras"))):
            return await super().render_chat_async(*args, **kwargs)

    async def render_cmpl_async(self, *args: Any, **kwargs: Any):
        with engine_scope(tenant=request_tenant(kwargs.get("prompt_extras"))):
            return await super().render_cmpl_async(*args, **kwargs)

    def render_chat(self, *args: Any, **kwargs: Any):
        with engine_scope(tenant=request_tenant(kwargs.get("prompt_extras"))):
            return super().render_chat(*args, **kwargs)

    def render_cmpl(self, *args: Any, **kwargs: Any):
        with engine_scope(tenant=request_tenant(kwargs.get("prompt_extras"))):
            return super().render_cmpl(*args, **kwargs)
