"""The tokenization service in one process, without Ray: uvicorn, one ``TokenizerCore``, the same API.

For one machine (the common first deployment): the same ASGI app and request handler a Ray Serve
replica runs (``asgi.py``, ``serve_handler.py``), on uvicorn in this process, so a request costs
the handler's work and loopback HTTP, not Ray's proxy and replica hops. Sessions, ``append`` with
``session_version``, chat ``messages``, ``/detokenize``, ``cache_salt``, the request limits and
``/health`` behave as on Serve; the request counters are served at ``GET /metrics``.

Several cores are used inside the one process: a long keyless text is cut at safe cuts and its
pieces encoded on ``threads`` threads (default: every core; the native engines release the GIL),
and long session turns, large parses and serializations run in threads while the event loop
serves short requests. What this process cannot do is what Serve is for: replicas on several
nodes, autoscaling, the session router, a pool of worker processes (``serve_app``).

Several uvicorn worker processes are not offered: each would hold its own sessions, and the kernel
spreads connections, not sessions, over them, so a session's turns would land in processes that do
not hold it (a whole re-encode each, and a 409 for each append).
"""
from __future__ import annotations

from typing import Any

import uvicorn

from delta_ray.runtime.heap import freeze_heap
from delta_ray.core.loading import TokenizerLike

from .asgi import DEFAULT_BODY_TIMEOUT_S, TokenizerASGI
from .local_metrics import Counters
from .serve_config import (DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_DETOKENIZE_TOKENS, DEFAULT_MAX_JSON_ITEMS,
                           POOL_OPTIONS)
from .service import build_handler, service_spec


def local_app(tokenizer: TokenizerLike, *, model_name: "str | None" = None, tokenizer_config: Any = None,
              max_model_len: "int | None" = None, threads: "int | None" = None, require_tenant: bool = False,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              max_detokenize_tokens: int = DEFAULT_MAX_DETOKENIZE_TOKENS,
              max_json_items: int = DEFAULT_MAX_JSON_ITEMS, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
              **options: Any) -> TokenizerASGI:
    """The service as an ASGI app for this process (any ASGI server runs it; :func:`run_local`
    runs it on uvicorn). The options are ``serve_app``'s that make sense in one process: the model's
    name, the chat configuration, ``threads`` for long texts (default: the CPU count), the tenant
    requirement and the request limits (a body must arrive whole within ``body_timeout_s``), and
    :class:`~delta_ray.core.config.TokenizerConfig` fields (``engine``, ``chunk_size``,
    ``max_sessions``, ...). A pool option is a TypeError: a pool runs
    on Ray (``serve_app(num_workers=...)``)."""
    pool_options = sorted(set(options) & (POOL_OPTIONS | {"num_workers", "pool_name", "pool_secret"}))
    if pool_options:
        raise TypeError(f"{pool_options}: a pool runs on Ray; the one-process server has none (use serve_app)")
    spec = service_spec(tokenizer, options, model_name=model_name, tokenizer_config=tokenizer_config,
                        max_model_len=max_model_len, threads=threads, require_tenant=require_tenant,
                        max_body_bytes=max_body_bytes, max_detokenize_tokens=max_detokenize_tokens,
                        max_json_items=max_json_items)
    counters = Counters()
    handler = build_handler(spec.loaded, spec.chat_config, spec.config, record=counters)
    return TokenizerASGI(handler, metrics=counters.render, body_timeout_s=body_timeout_s)


def local_server(app: TokenizerASGI, host: str = "127.0.0.1", port: int = 8000, **uvicorn_options: Any):
    """A ``uvicorn.Server`` for ``app`` (``.run()`` blocks; ``should_exit = True`` stops it): uvloop
    and httptools where installed, no access log, no ``Server`` header."""
    options = {"log_level": "warning", "access_log": False, "lifespan": "on", "server_header": False,
               **uvicorn_options}
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, **options))


def run_local(tokenizer: TokenizerLike, host: str = "127.0.0.1", port: int = 8000, **options: Any) -> None:
    """Serve ``tokenizer`` over HTTP in this process until stopped (``delta-ray serve --local``).
    ``options`` are :func:`local_app`'s."""
    server = local_server(local_app(tokenizer, **options), host, port)
    freeze_heap()  # this process is the server's: its full collections skip what set-up built
    server.run()
