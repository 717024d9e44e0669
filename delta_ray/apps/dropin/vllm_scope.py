"""How a vLLM request's identity reaches the tokenizer, in every renderer delta-ray serves.

Under ``DELTA_RAY_VLLM=1`` every renderer vLLM has registered, except the ``mistral`` mode's (its
tokenizer is not a transformers one), is replaced in vLLM's registry by a subclass of itself with
:class:`ScopedRenderer` first (:func:`scope_renderers`; the class is built when vLLM first loads it,
``vllm_renderer.py``), so the renderer vLLM picks for a model still renders as it does without
delta-ray; ``tokenizer_mode="delta_ray"`` uses ``DeltaRayRenderer(ScopedRenderer, HfRenderer)``.

vLLM's OpenAI layer hands its renderer the messages and ``prompt_extras``, where the request's
``cache_salt`` is (vLLM 0.33 and 0.34: ``OnlineRenderer.preprocess_chat``/``preprocess_cmpl`` ->
``render_chat_async``/``render_cmpl_async``); no header, ``session_id`` or ``vllm_xargs`` field reaches
it (vLLM reads the session id after rendering, for the engine). So the scoped renderer binds, through
:func:`~delta_ray.apps.dropin.binding.engine_scope`: tenant = the request's ``cache_salt`` (the
namespace vLLM's prefix cache keeps it in), else the tenant of a scope bound around the call; session
key = a scope bound around the call (:class:`~delta_ray.apps.dropin.binding.SessionHeader` binds the
``x-session-id`` header under ``vllm serve --middleware``), else the Ray Serve request's session id
(Ray Serve LLM: Serve carries the ``x-session-id`` header to the replica); with no key the wrapped
tokenizer looks the text up by content inside the tenant.

The renderer renders and tokenizes on its thread pools (``BaseRenderer._executor`` and
``_mm_executor`` in vLLM 0.33 and 0.34: its ``make_async`` is ``loop.run_in_executor``, which copies no context
variables), so it makes both pools run each function in the scope of the request that submitted it
(:func:`~delta_ray.apps.dropin.binding.carry_scope`), and refuses to start where a pool is missing
rather than let a request tokenize outside its tenant. Nothing here imports vLLM: the default tier
tests it over a stand-in with the same structure.
"""
from __future__ import annotations

import importlib
from concurrent.futures import Executor
from typing import Any

from .binding import carry_scope, engine_scope, is_carrying

# The renderer's thread pools (vLLM 0.33's and 0.34's BaseRenderer): tokenization and chat rendering
# run on `_executor`, the multimodal processor (which may call the same tokenizer) on `_mm_executor`.
POOLS = ("_executor", "_mm_executor")
# Renderer modes whose tokenizer is not a transformers tokenizer: the drop-in never wraps it, so the
# renderer stays vLLM's own, untouched.
NOT_TRANSFORMERS = frozenset({"mistral"})
# mode -> the (module, class) vLLM registered for it before `scope_renderers` replaced the entry
_BASES: dict[str, tuple[str, str]] = {}
_SCOPED: dict[str, type] = {}
__all__ = ["NOT_TRANSFORMERS", "POOLS", "ScopedRenderer", "request_tenant", "scope_renderers", "scoped_renderer"]


def request_tenant(prompt_extras: Any) -> str | None:
    """The tenant a vLLM request names: its ``cache_salt`` from the ``prompt_extras`` vLLM's
    OpenAI layer passes its renderer (vLLM validated it: a non-empty str); None without one."""
    if not isinstance(prompt_extras, dict):
        return None
    salt = prompt_extras.get("cache_salt")
    return salt if isinstance(salt, str) and salt else None


class ScopedRenderer:
    """Mixin over a vLLM renderer (``DeltaRayRenderer(ScopedRenderer, HfRenderer)``, ``scoped_renderer``): the four
    entry points through which vLLM renders and tokenizes a request run inside the request's
    :func:`~delta_ray.request_scope`, and the renderer's thread pools carry that scope into the
    threads that tokenize. Everything else is vLLM's own."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        for name in POOLS:
            pool = getattr(self, name, None)
            if not isinstance(pool, Executor):
                # A vLLM whose renderer tokenizes elsewhere would tokenize outside the request's tenant.
                raise RuntimeError(f"delta-ray cannot bind each request's tenant in vLLM's {type(self).__name__}: "
                                   f"it has no thread pool at {name!r}; serve it without delta-ray, or "
                                   f"with a delta-ray that supports this vLLM")
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


def _scoped_name(mode: str) -> str:
    return f"Scoped_{mode}"


def scope_renderers(renderers: dict[str, tuple[str, str]], module: str) -> None:
    """Point every mode of vLLM's renderer registry (``RENDERER_REGISTRY.renderers``: mode ->
    (module, class)) at its scoped subclass in ``module``, except :data:`NOT_TRANSFORMERS` and
    entries already there; idempotent. Nothing is imported here: vLLM imports a renderer's module
    when a model uses it, and some need optional packages."""
    for mode, entry in list(renderers.items()):
        if mode in NOT_TRANSFORMERS or entry[0] == module:
            continue
        _BASES[mode] = entry
        renderers[mode] = (module, _scoped_name(mode))


def scoped_renderer(name: str) -> type:
    """The class :func:`scope_renderers` named ``name``: ``ScopedRenderer`` over the renderer vLLM
    registered for that mode, built once (vLLM resolves the registry's names by attribute lookup)."""
    cls = _SCOPED.get(name)
    if cls is not None:
        return cls
    mode = next((m for m in _BASES if _scoped_name(m) == name), None)
    if mode is None:
        raise AttributeError(name)
    module, class_name = _BASES[mode]
    base = getattr(importlib.import_module(module), class_name)
    cls = type(f"Scoped{base.__name__}", (ScopedRenderer, base), {"__doc__": f"vLLM's {base.__name__}, "
               "rendering and tokenizing each request inside its request_scope (delta-ray)."})
    _SCOPED[name] = cls
    return cls
