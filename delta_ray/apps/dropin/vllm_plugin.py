"""delta-ray inside vLLM: ``DELTA_RAY_VLLM=1`` under whatever tokenizer mode vLLM picks.

vLLM loads ``register`` through the ``vllm.general_plugins`` entry point (pyproject) in every
process it starts, Ray Serve LLM's router included. With ``DELTA_RAY_VLLM=1`` in the environment it
does what ``VLLM_USE_FASTOKENS=1`` does for fastokens, exactly: every transformers tokenizer the
process loads afterwards encodes through the drop-in (``patch_transformers``), so the mode vLLM
chooses, ``hf`` or a model-specific one (``deepseek_v32``, ``deepseek_v4``, ``kimi_k3``...: vLLM picks
them by architecture), keeps its own tokenizer class and its own renderer; each renderer is vLLM's
class with the request's identity bound around it (:func:`~delta_ray.apps.dropin.vllm_scope.scope_renderers`).
The ``mistral`` mode's tokenizer is mistral_common's, not a transformers one: it stays as vLLM
loads it. Without the variable this module only registers the alias below.

``tokenizer_mode="delta_ray"`` (kept for deployments that name it) is vLLM's ``hf`` mode with the
drop-in: vLLM's ``CachedHfTokenizer`` loaded with the drop-in attached to the transformers object
BEFORE vLLM wraps it (vLLM's cached tokenizer pickles by rebuilding its subclass around that
original object, and deep-copies it, so the drop-in state must live on the original, where both
carry it along), and vLLM's ``HfRenderer`` with the identity bound. Like any explicit mode it
replaces vLLM's per-architecture choice, so a model vLLM renders with its own encoder (DeepSeek V4)
must use the variable instead.

How a request's identity (tenant, session key) reaches the tokenizer: :mod:`delta_ray.apps.dropin.vllm_scope`.

Options come from the environment, since vLLM passes none to a tokenizer:
``DELTA_RAY_SESSIONS=0`` makes every call stateless (sessions are on by default, inside each
request's tenant, as vLLM's prefix cache is), ``DELTA_RAY_CONTENT_REUSE=0`` keeps keyed sessions
but finds no conversation by content, ``DELTA_RAY_ENGINE`` picks the engine (``auto`` by default),
``DELTA_RAY_FAST_RENDER=0`` renders chat templates as transformers does (the memoized sandbox,
``delta_ray.apps.dropin.render``, is on by default).
"""
from __future__ import annotations

import os

from .patch import loading_wrapped, patch_transformers
from .vllm_scope import scope_renderers

MODE = "delta_ray"
SWITCH = "DELTA_RAY_VLLM"
RENDERER = ("delta_ray.apps.dropin.vllm_renderer", "DeltaRayRenderer")  # binds each request's identity
__all__ = ["MODE", "SWITCH", "DeltaRayTokenizer", "env_options", "register", "switched_on"]


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


def switched_on() -> bool:
    """Whether ``DELTA_RAY_VLLM=1`` asks for delta-ray under every mode vLLM picks (a value other
    than 0 or 1 is refused: a typo must not silently serve without it). With vLLM's own
    ``VLLM_USE_FASTOKENS`` on too, both would replace transformers' backend: refused, with the reason,
    rather than one of them quietly giving way to the other."""
    on = _flag(SWITCH, "0")
    fastokens = os.environ.get("VLLM_USE_FASTOKENS", "0").strip()
    if on and fastokens not in ("", "0"):
        raise ValueError(f"{SWITCH}=1 and VLLM_USE_FASTOKENS={fastokens} both put an engine under vLLM's "
                         f"transformers tokenizers; set one (delta-ray runs fastokens inside its own exact "
                         f"cuts when DELTA_RAY_ENGINE allows it)")
    return on


def register() -> None:
    """vLLM general plugin: register the ``delta_ray`` mode and its renderer; under
    ``DELTA_RAY_VLLM=1`` also patch transformers and bind each request's identity in every
    renderer vLLM has registered."""
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry

    if MODE not in TokenizerRegistry.tokenizers:
        TokenizerRegistry.register(MODE, __name__, "DeltaRayTokenizer")
    if RENDERER_REGISTRY.renderers.get(MODE) != RENDERER:
        RENDERER_REGISTRY.register(MODE, *RENDERER)
    if switched_on():
        patch_transformers(**_options())
        scope_renderers(RENDERER_REGISTRY.renderers, RENDERER[0])


class DeltaRayTokenizer:
    """vLLM ``TokenizerLike`` factory for ``tokenizer_mode="delta_ray"``: ``from_pretrained`` returns
    vLLM's cached HF tokenizer whose transformers object encodes through delta-ray."""

    @classmethod
    def from_pretrained(cls, path_or_repo_id, *args, **kwargs):
        from vllm.tokenizers.hf import CachedHfTokenizer

        kwargs.pop("mistral_format", None)  # set by vLLM for its "hf" mode only
        with loading_wrapped(**_options()):
            return CachedHfTokenizer.from_pretrained(path_or_repo_id, *args, **kwargs)
