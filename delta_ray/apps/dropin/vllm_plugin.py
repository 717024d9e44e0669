"""vLLM tokenizer mode ``delta_ray``: vLLM's own HF tokenizer, encoding through delta-ray.

vLLM loads ``register`` through the ``vllm.general_plugins`` entry point (pyproject) in every
process it starts, Ray Serve LLM's router included, so ``vllm serve --tokenizer-mode delta_ray``
and ``engine_kwargs={"tokenizer_mode": "delta_ray"}`` both find the mode. The tokenizer is vLLM's
``CachedHfTokenizer`` loaded with the drop-in attached to the transformers object BEFORE vLLM
wraps it: vLLM's cached tokenizer (and its thread pool) pickles by rebuilding its subclass around
that original object (``__reduce__``), and deep-copies it, so the drop-in state must live on the
original, where both carry it along. The renderer is vLLM's ``HfRenderer``: it calls
``apply_chat_template(tokenize=True)``, which the drop-in serves.

Options come from the environment, since vLLM passes none to a tokenizer mode:
``DELTA_RAY_CONTENT_REUSE=1`` turns keyless content reuse on (off by default: one server holds
many tenants), ``DELTA_RAY_ENGINE`` picks the engine (``auto`` by default),
``DELTA_RAY_FAST_RENDER=0`` renders chat templates as transformers does (the memoized sandbox,
``delta_ray.apps.dropin.render``, is on by default).
"""
from __future__ import annotations

import os

from .patch import loading_wrapped

MODE = "delta_ray"
__all__ = ["MODE", "DeltaRayTokenizer", "register"]


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
    if MODE not in RENDERER_REGISTRY.renderers:
        RENDERER_REGISTRY.register(MODE, "vllm.renderers.hf", "HfRenderer")


class DeltaRayTokenizer:
    """vLLM ``TokenizerLike`` factory for ``tokenizer_mode="delta_ray"``: ``from_pretrained`` returns
    vLLM's cached HF tokenizer whose transformers object encodes through delta-ray."""

    @classmethod
    def from_pretrained(cls, path_or_repo_id, *args, **kwargs):
        from vllm.tokenizers.hf import CachedHfTokenizer

        kwargs.pop("mistral_format", None)  # set by vLLM for its "hf" mode only
        with loading_wrapped(**_options()):
            return CachedHfTokenizer.from_pretrained(path_or_repo_id, *args, **kwargs)
