"""vLLM's renderers binding each request's identity (:class:`~delta_ray.apps.dropin.vllm_scope.ScopedRenderer`):
``DeltaRayRenderer`` (``HfRenderer``) for ``tokenizer_mode="delta_ray"``, and under ``DELTA_RAY_VLLM=1``
every other renderer vLLM registered, by the name :func:`~delta_ray.apps.dropin.vllm_scope.scope_renderers`
gave it in vLLM's registry (resolved here by attribute lookup). Only vLLM imports this module, through
its renderer registry, so importing vLLM here costs nothing elsewhere."""
from __future__ import annotations

from vllm.renderers.hf import HfRenderer

from .vllm_scope import ScopedRenderer, scoped_renderer

__all__ = ["DeltaRayRenderer"]


class DeltaRayRenderer(ScopedRenderer, HfRenderer):
    """vLLM's ``HfRenderer``, rendering and tokenizing each request inside its ``request_scope``."""


def __getattr__(name: str) -> type:
    return scoped_renderer(name)
