"""How a vLLM request's identity reaches the tokenizer under ``tokenizer_mode="delta_ray"``.

vLLM's OpenAI layer hands its renderer the messages and ``prompt_extras``, where the request's
``cache_salt`` is (vLLM 0.33: ``OnlineRenderer.preprocess_chat``/``preprocess_cmpl`` ->
``render_chat_async``/``render_cmpl_async``); no header, ``session_id`` or ``vllm_xargs`` field reaches
it (vLLM reads the session id after rendering, for the engine). So the mode's renderer
(``DeltaRayRenderer(ScopedRenderer, HfRenderer)``, ``vllm_renderer.py``) binds, through
:func:`~delta_ray.apps.dropin.binding.engine_scope`: tenant = the request's ``cache_salt`` (the
namespace vLLM's prefix cache keeps it in), else the tenant of a scope bound around the call; session
key = a scope bound around the call (:class:`~delta_ray.apps.dropin.binding.SessionHeader` binds the
``x-session-id`` header under ``vllm serve --middleware``), else the Ray Serve request's session id
(Ray Serve LLM: Serve carries the ``x-session-id`` header to the replica); with no key the wrapped
tokenizer looks the text up by content inside the tenant.

The renderer renders and tokenizes on its thread pools (``BaseRenderer._executor`` and
``_mm_executor`` in vLLM 0.33: its ``make_async`` is ``loop.run_in_executor``, which copies no context
variables), so it makes both pools run each function in the scope of the request that submitted it
(:func:`~delta_ray.apps.dropin.binding.carry_scope`), and refuses to start where a pool is missing
rather than let a request tokenize outside its tenant. Nothing here imports vLLM: the default tier
tests it over a stand-in with the same structure.
"""
from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

from .binding import carry_scope, engine_scope, is_carrying
from .vllm_plugin import MODE

# The renderer's thread pools (vLLM 0.33's BaseRenderer): tokenization and chat rendering run on
# `_executor`, the multimodal processor (which may call the same tokenizer) on `_mm_executor`.
POOLS = ("_executor", "_mm_executor")
__all__ = ["POOLS", "ScopedRenderer", "request_tenant"]


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
