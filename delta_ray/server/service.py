"""What both hosts of the HTTP service set up the same way: the tokenizer's chat configuration and
model length, the validated options, and the request handler over a ``TokenizerCore``.

``serve_app`` (``actors/serve.py``) resolves the options once in the driver and sends them to each
replica, which builds its handler with :func:`build_handler`; the one-process server
(``local.py``) does both in its own process. Ray-free.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delta_ray._core.loading import LoadedTokenizer, TokenizerLike, load_tokenizer
from delta_ray._tokenizer_core import TokenizerCore

from .chat_template import ChatTemplate
from .serve_config import ServeConfig
from .serve_handler import RequestHandler

MODEL_MAX_LENGTH_CAP = 10 ** 12  # transformers writes a huge sentinel for "no limit"


@dataclass(frozen=True)
class ServiceSpec:
    """The tokenizer a service serves and how: its bytes, chat configuration and validated options."""

    loaded: LoadedTokenizer
    chat_config: "dict | None"
    config: ServeConfig


def chat_config_for(tokenizer: Any, tokenizer_config: Any) -> "dict | None":
    """The tokenizer_config.json to take the chat template from (explicit, beside the file, or none)."""
    if isinstance(tokenizer_config, dict):
        return tokenizer_config
    candidates = []
    if tokenizer_config is not None:
        candidates.append(Path(tokenizer_config))
    if isinstance(tokenizer, (str, Path)):
        p = Path(tokenizer)
        candidates.append((p if p.is_dir() else p.parent) / "tokenizer_config.json")
    for c in candidates:
        c = c / "tokenizer_config.json" if c.is_dir() else c
        if c.exists():
            return json.loads(c.read_text(encoding="utf-8"))
    return None


def service_spec(tokenizer: TokenizerLike, options: "dict[str, Any]", *, model_name: "str | None" = None,
                 tokenizer_config: Any = None, max_model_len: "int | None" = None,
                 **fields: Any) -> ServiceSpec:
    """Load the tokenizer, find its chat configuration and validate the options into a
    :class:`ServeConfig` (``options``: TokenizerConfig/PoolConfig fields; ``fields``: ServeConfig's
    own and ``threads``/``num_workers``). ``max_model_len`` defaults to the chat configuration's
    ``model_max_length``; the model's name to the tokenizer's bundled name or ``"delta-ray"``."""
    loaded = load_tokenizer(tokenizer)
    chat_config = chat_config_for(tokenizer, tokenizer_config)
    if max_model_len is None and chat_config:
        mml = chat_config.get("model_max_length")
        max_model_len = mml if isinstance(mml, int) and mml < MODEL_MAX_LENGTH_CAP else None
    name = model_name or (loaded.source if loaded.source.startswith("<") else None) or "delta-ray"
    config = ServeConfig.from_options(options, model_name=name, max_model_len=max_model_len, **fields)
    return ServiceSpec(loaded, chat_config, config)


def build_handler(loaded: LoadedTokenizer, chat_config: "dict | None", config: ServeConfig, *, pool: Any = None,
                  replica_id: str = "", record: Any = None) -> RequestHandler:
    """The request handler of one serving process: its own ``TokenizerCore`` (sessions in memory,
    ``config.tokenizer.threads`` threads for long texts), the chat template, the limits; warmed
    (:meth:`RequestHandler.warm`), so the first client does not pay for lazy imports."""
    threads = config.tokenizer.threads
    handler = RequestHandler(
        loaded, TokenizerCore(loaded, config.tokenizer), template=ChatTemplate.from_config(chat_config),
        pool=pool, served={config.model_name}, max_body_bytes=config.max_body_bytes,
        max_model_len=config.max_model_len, require_tenant=config.require_tenant,
        pool_min_chars=config.pool_min_chars, overflow_inflight=config.overflow_inflight or 2 * (threads or 2),
        max_detokenize_tokens=config.max_detokenize_tokens, max_json_items=config.max_json_items,
        replica_id=replica_id, record=record)
    handler.warm()
    return handler
