"""vLLM's renderer for ``tokenizer_mode="delta_ray"``: ``HfRenderer`` binding each request's identity
(:class:`~delta_ray.apps.dropin.vllm_scope.ScopedRenderer`). Only vLLM imports this module, through
its renderer registry (``vllm_plugin.register``), so importing vLLM here costs nothing elsewhere."""
from __future__ import annotations

from vllm.renderers.hf import HfRenderer

from .vllm_scope import ScopedRenderer

__all__ = ["DeltaRayRenderer"]


class DeltaRayRenderer(ScopedRenderer, HfRenderer):
    """vLLM's ``HfRenderer``, rendering and tokenizing each request inside its ``request_scope``."""
