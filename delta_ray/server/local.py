"""The tokenization service in one process, without Ray: uvicorn, one ``TokenizerCore``, the same API.

For one machine (the common first deployment): the same ASGI app and request handler a Ray Serve
replica runs (``asgi.py``, ``serve_handler.py``), on uvicorn in this process, so a request costs
the handler's work and loopback HTTP, not Ray's proxy and replica hops. Sessions, ``append`` with
``session_version``, chat ``messages``, ``/detokenize``, ``cache_salt``, the request limits and
``/health`` behave as on Serve; the request counters are served at ``GET /metrics`` where
``metrics=True`` (off by default: they are the operator's, see below).

What a client may hold is bounded (``docs/serving.md``, "What a client may hold"): connections, a
request head's bytes and time (``http_limits.py``, on uvicorn's protocol, with uvicorn's own
``limit_concurrency``, ``timeout_keep_alive`` and ``backlog``), a body's bytes and time and the
body bytes in progress in all and per client (the app, ``asgi.py``). ``/metrics`` counts, among
others, requests whose content was already held ("held") or new: open to every client, it would
tell one whether another sent a text that opens as the client's guess, so it is served only when
asked for, behind the operator's network.

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

from delta_ray._core.loading import TokenizerLike
from delta_ray._runtime.heap import freeze_heap

from .asgi import DEFAULT_BODY_TIMEOUT_S, BodyBudget, TokenizerASGI
from .http_limits import ConnectionLimits, limited_protocol
from .local_metrics import Counters
from .serve_config import (
    DEFAULT_BACKLOG,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_DETOKENIZE_TOKENS,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_JSON_ITEMS,
    POOL_OPTIONS,
    inflight_limits,
)
from .service import build_handler, service_spec

# run_local's options that are the server's (local_server's), not the app's
SERVER_OPTIONS = frozenset({"max_connections", "max_header_bytes", "header_timeout_s", "keep_alive_s", "backlog",
                            "http"})


def local_app(tokenizer: TokenizerLike, *, model_name: "str | None" = None, tokenizer_config: Any = None,
              max_model_len: "int | None" = None, threads: "int | None" = None, require_tenant: bool = False,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              max_detokenize_tokens: int = DEFAULT_MAX_DETOKENIZE_TOKENS,
              max_json_items: int = DEFAULT_MAX_JSON_ITEMS, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
              max_inflight_bytes: "int | None" = None, max_client_inflight_bytes: "int | None" = None,
              metrics: bool = False, **options: Any) -> TokenizerASGI:
    """The service as an ASGI app for this process (any ASGI server runs it; :func:`run_local`
    runs it on uvicorn). The options are ``serve_app``'s that make sense in one process: the model's
    name, the chat configuration, ``threads`` for long texts (default: the CPU count), the tenant
    requirement and the request limits (a body must arrive whole within ``body_timeout_s``; the
    body bytes of the requests in progress are bounded by ``max_inflight_bytes`` in all, a 503
    past it, and ``max_client_inflight_bytes`` per client address, a 429: defaults in
    ``serve_config.py``), and :class:`~delta_ray._core.config.TokenizerConfig` fields (``engine``,
    ``chunk_size``, ``max_sessions``, ...). ``metrics=True`` serves the request counters at
    ``GET /metrics`` (keep that port behind the operator's network: the counters tell held from new
    content). A pool option is a TypeError: a pool runs on Ray (``serve_app(num_workers=...)``)."""
    pool_options = sorted(set(options) & (POOL_OPTIONS | {"num_workers", "pool_name", "pool_secret"}))
    if pool_options:
        raise TypeError(f"{pool_options}: a pool runs on Ray; the one-process server has none (use serve_app)")
    server_options = sorted(set(options) & SERVER_OPTIONS)
    if server_options:
        raise TypeError(f"{server_options} are the server's: give them to local_server or run_local")
    total, per_client = inflight_limits(max_body_bytes, max_inflight_bytes, max_client_inflight_bytes)
    budget = BodyBudget(total, per_client)  # checked before the model loads
    spec = service_spec(tokenizer, options, model_name=model_name, tokenizer_config=tokenizer_config,
                        max_model_len=max_model_len, threads=threads, require_tenant=require_tenant,
                        max_body_bytes=max_body_bytes, max_detokenize_tokens=max_detokenize_tokens,
                        max_json_items=max_json_items)
    counters = Counters()
    handler = build_handler(spec.loaded, spec.chat_config, spec.config, record=counters)
    return TokenizerASGI(handler, metrics=counters.render if metrics else None, body_timeout_s=body_timeout_s,
                         budget=budget)


def local_server(app: Any, host: str = "127.0.0.1", port: int = 8000, *,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
                 header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
                 backlog: int = DEFAULT_BACKLOG, http: str = "auto", **uvicorn_options: Any):
    """A ``uvicorn.Server`` for ``app`` (``.run()`` blocks; ``should_exit = True`` stops it): uvloop
    and httptools where installed (``http``: "auto", "httptools" or "h11"), no access log, no
    ``Server`` header, no websockets, and the connection limits: at most ``max_connections`` open
    (the next is answered 503 and closed), a request's line and headers within ``max_header_bytes``
    (431) and ``header_timeout_s`` (408), an idle connection closed after ``keep_alive_s``, at most
    ``backlog`` connections queued by the kernel (``http_limits.py`` says which limits are
    uvicorn's own and which its protocol gains here). ``uvicorn_options`` go to ``uvicorn.Config``."""
    limits = ConnectionLimits(max_connections, max_header_bytes, header_timeout_s)
    if not keep_alive_s > 0:
        raise ValueError(f"keep_alive_s must be positive, got {keep_alive_s!r}")
    options = {"log_level": "warning", "access_log": False, "lifespan": "on", "server_header": False, "ws": "none",
               "http": limited_protocol(limits, http),
               # uvicorn's own cap, checked when a request's head is in: past it the request is a 503.
               # Connections are capped at accept by the protocol, so one more than that cap bounds
               # the requests running, those whose client has gone included, and never refuses a
               # request on an admitted connection for the number of connections.
               "limit_concurrency": max_connections + 1,
               "timeout_keep_alive": keep_alive_s, "backlog": backlog,
               "h11_max_incomplete_event_size": max_header_bytes,  # the head's bound where h11 runs
               **uvicorn_options}
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, **options))


def run_local(tokenizer: TokenizerLike, host: str = "127.0.0.1", port: int = 8000, **options: Any) -> None:
    """Serve ``tokenizer`` over HTTP in this process until stopped (``delta-ray serve --local``).
    ``options`` are :func:`local_app`'s and :func:`local_server`'s connection limits."""
    server_options = {k: v for k, v in options.items() if k in SERVER_OPTIONS}
    app_options = {k: v for k, v in options.items() if k not in SERVER_OPTIONS}
    server = local_server(local_app(tokenizer, **app_options), host, port, **server_options)
    freeze_heap()  # this process is the server's: its full collections skip what set-up built
    server.run()
