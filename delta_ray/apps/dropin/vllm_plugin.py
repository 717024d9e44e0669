"""vLLM tokenizer mode ``delta_ray``: vLLM's own HF tokenizer, encoding through delta-ray.

vLLM loads ``register`` through the ``vllm.general_plugins`` entry point (pyproject) in every
process it starts, Ray Serve LLM's router included, so ``vllm serve --tokenizer-mode delta_ray``
and ``engine_kwargs={"tokenizer_mode": "delta_ray"}`` both find the mode. The tokenizer is vLLM's
``CachedHfTokenizer`` loaded with the drop-in attached to the transformers object BEFORE vLLM
wraps it: vLLM's cached tokenizer (and its thread pool) pickles by rebuilding its subclass around
that original object (``__reduce__``), and deep-copies it, so the drop-in state must live on the
original, where both carry it along. The renderer is vLLM's ``HfRenderer`` with the request's
identity bound around its tokenization (``delta_ray.apps.dropin.vllm_renderer``).

How a request's identity (tenant, session key) reaches the tokenizer: :mod:`delta_ray.apps.dropin.vllm_scope`.

Options come from the environment, since vLLM passes none to a tokenizer mode:
``DELTA_RAY_SESSIONS=0`` makes every call stateless (sessions are on by default, inside each
request's tenant, as vLLM's prefix cache is), ``DELTA_RAY_CONTENT_REUSE=0`` keeps keyed sessions
but finds no conversation by content, ``DELTA_RAY_ENGINE`` picks the engine (``auto`` by default),
``DELTA_RAY_FAST_RENDER=0`` renders chat templates as transformers does (the memoized sandbox,
``delta_ray.apps.dropin.render``, is on by default).
"""
from __future__ import annotations

import os

from .patch import loading_wrapped

MODE = "delta_ray"
RENDERER = ("delta_ray.apps.dropin.vllm_renderer", "DeltaRayRenderer")  # binds each request's identity
__all__ = ["MODE", "DeltaRayTokenizer", "env_options", "register"]


def _flag(name: str, default: str) -> bool:
    value = os.environ.get(name, default)
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def _options() -> dict:
    reuse = os.environ.get("DELTA_RAY_CONTENT_REUSE")  # unset: follows the sessions (the drop-in's default)
    return {"sessions": _flag("DELTA_RAY_SESSIONS", "1"),
            "content_reuse": None if reuse is None else _flag("DELTA_RAY_CONTENT_REUSE", "0"),
            "engine": os.environ.get("DELTA_RAY_ENGINE", "auto"),
            "fast_render": _flag("DELTA_RAY_FAST_RENDER", "1")}


def env_options() -> dict:
    """The drop-in's options from the ``DELTA_RAY_*`` environment (above): engines pass none to a
    tokenizer they load (the SGLang integration reads the same)."""
    return _options()


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

        kwargs.pop("mistral_format", None)  # set by vLLM for its "hf" mode only
        with loading_wrapped(**_options()):
            return CachedHfTokenizer.from_pretrained(path_or_repo_id, *args, **kwargs)
