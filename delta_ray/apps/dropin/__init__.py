"""Drop-in for transformers (and so vLLM, SGLang, Ray Serve LLM): stock outputs, delta-ray's encode.

``delta_ray.patch_transformers()`` makes every tokenizer loaded afterwards encode through
delta-ray's exact path; ``wrap_tokenizer(tok)`` does it for one object. ``request_scope(session=...,
tenant=...)`` binds a request's identity, so a conversation's next turn re-encodes only what changed
(:mod:`delta_ray.apps.dropin.sessions`). Nothing here imports Ray;
transformers is imported on first use. The vLLM tokenizer mode lives in
:mod:`delta_ray.apps.dropin.vllm_plugin` (loaded by vLLM through its ``vllm.general_plugins`` entry point).
"""
from .binding import SessionHeader
from .patch import (
                    is_wrapped,
                    loading_wrapped,
                    patch_transformers,
                    refresh,
                    unpatch_transformers,
                    unwrap_tokenizer,
                    wrap_tokenizer,
)
from .scope import request_scope

__all__ = ["SessionHeader", "is_wrapped", "loading_wrapped", "patch_transformers", "refresh", "request_scope",
           "unpatch_transformers", "unwrap_tokenizer", "wrap_tokenizer"]
