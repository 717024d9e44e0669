"""delta-ray: the reference tokenizer's exact IDs, incrementally and in parallel on Ray.

The core (everything imported eagerly here) never imports Ray; the Ray-backed entry points
(``TokenizerPool``, ``serve_app``, ``tokenize_dataset``) are loaded on first use.
"""
import importlib

from delta_ray._core.errors import DeltaRayError as DeltaRayError
from delta_ray._core.errors import PoolAuthError as PoolAuthError
from delta_ray._core.errors import PoolClosed as PoolClosed
from delta_ray._core.errors import PoolStartupError as PoolStartupError
from delta_ray._core.reference_version import UnsupportedReference as UnsupportedReference
from delta_ray._core.reference_version import check_reference as _check_reference

_check_reference()  # a clear error under an unsupported tokenizers (1.x), before anything imports it

from delta_ray._core.admission import Admission as Admission  # noqa: E402
from delta_ray._core.admission import NotAdmitted as NotAdmitted  # noqa: E402
from delta_ray._core.admission import NotAdmittedWarning as NotAdmittedWarning  # noqa: E402
from delta_ray._core.config import PoolConfig as PoolConfig  # noqa: E402
from delta_ray._core.config import TokenizerConfig as TokenizerConfig  # noqa: E402
from delta_ray._core.loading import load_tokenizer as load_tokenizer  # noqa: E402
from delta_ray._core.session_store import SessionNotFound as SessionNotFound  # noqa: E402
from delta_ray._engine.native import FastEngineUnavailable as FastEngineUnavailable  # noqa: E402
from delta_ray._runtime.heap import freeze_heap as freeze_heap  # noqa: E402
from delta_ray.tokenizer import DeltaTokenizer as DeltaTokenizer  # noqa: E402

__all__ = ["Admission", "DeltaRayError", "DeltaTokenizer", "FastEngineUnavailable", "NotAdmitted", "NotAdmittedWarning",
           "PoolAuthError",
           "PoolClosed", "PoolConfig", "PoolStartupError", "SessionNotFound", "TokenizerConfig", "TokenizerPool",
           "UnsupportedReference",
           "freeze_heap", "load_tokenizer", "patch_transformers", "request_scope", "serve_app", "tokenize_dataset",
           "unpatch_transformers"]

_LAZY = {
    "TokenizerPool": ("delta_ray.actors.pool", "TokenizerPool"),
    "serve_app": ("delta_ray.actors.serve", "serve_app"),
    "tokenize_dataset": ("delta_ray.actors.data", "tokenize_dataset"),
    "patch_transformers": ("delta_ray.apps.dropin", "patch_transformers"),  # transformers only when used
    "unpatch_transformers": ("delta_ray.apps.dropin", "unpatch_transformers"),
    "request_scope": ("delta_ray.apps.dropin.scope", "request_scope"),  # a request's session and tenant
}


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'delta_ray' has no attribute {name!r}")
