"""Binding a request's identity at a serving engine's seams (vLLM, SGLang, Ray Serve LLM).

The engines tokenize far from the request: vLLM's renderer gets the messages and the request's
``cache_salt`` but no header, SGLang's serving layer renders on an executor thread, and both hand
work to thread pools that do not copy context variables. This module holds what the integrations
share, free of any engine import:

- :func:`engine_scope`: the :func:`~delta_ray.request_scope` a request binds. The tenant is the
  request's own cache namespace (vLLM's ``cache_salt``; SGLang's ``extra_key`` and ``cache_salt``)
  when it gives one, otherwise the tenant of a scope already bound around the call (a user's own
  server); the session key is the one the request gives, else that outer scope's, else the
  ``x-session-id`` of the Ray Serve request being handled (Serve's proxy and Ray Serve LLM's
  ingress carry that header to the replica that runs the engine).
- :func:`carry_scope`: an executor whose every submitted function runs in the scope current at
  submission, wherever the pool runs it.
- :class:`SessionHeader`: an ASGI middleware binding the ``x-session-id`` header as the session key
  around a request, for servers where no Serve context exists (``vllm serve --middleware``).

A key is a hint: whatever session a key selects, the wrapped tokenizer's IDs are the reference's.
What a key decides is which stored state is tried first, so it never crosses a tenant.
"""
from __future__ import annotations

import sys
from concurrent.futures import Executor
from typing import Any, Callable

from .scope import current_scope, request_scope

__all__ = ["MAX_SESSION_CHARS", "SESSION_HEADER", "SessionHeader", "carry_scope", "engine_scope", "is_carrying",
           "serve_session_id", "session_or_none"]

SESSION_HEADER = "x-session-id"  # vLLM's X-Session-ID, Ray Serve's session routing and delta-ray's Serve app
# A longer value is no session key (the request takes the keyless content lookup): keys are stored and
# counted against the session table's bytes, and a client's header should not grow it past a salt's size.
MAX_SESSION_CHARS = 1024
_HEADER_BYTES = SESSION_HEADER.encode()


def session_or_none(value: object) -> str | None:
    """``value`` as a session key: a non-empty str of at most :data:`MAX_SESSION_CHARS` characters,
    else None (an absent, empty, oversized or non-str key means "no key", never an error: the
    engine accepted the request, and a missing key only costs the content lookup)."""
    if isinstance(value, str) and 0 < len(value) <= MAX_SESSION_CHARS:
        return value
    return None


def serve_session_id() -> str | None:
    """The session id of the Ray Serve request this task is handling (its ``x-session-id``), or
    None outside Ray Serve. Ray is never imported here: a process that has not loaded
    ``ray.serve.context`` handles no Serve request."""
    context = sys.modules.get("ray.serve.context")
    if context is None:
        return None
    # Ray Serve keeps the request's context in this context variable (set per request by the
    # replica); its getter would create an empty one outside a request. A third-party seam:
    var = getattr(context, "_serve_request_context", None)
    request = var.get() if var is not None else None
    return session_or_none(getattr(request, "session_id", None))


def engine_scope(tenant: str | None = None, session: str | None = None) -> request_scope:
    """The scope a request binds around its tokenization at an engine seam.

    ``tenant``: the request's cache namespace (None when it gives none); ``session``: a key the
    request itself carries. Missing parts come from a scope already bound around the call (the
    tenant only when the request gives none, so a request never leaves its own namespace), then
    the session id of the Ray Serve request being handled."""
    outer = current_scope()
    if tenant is None and outer is not None:
        tenant = outer.tenant
    session = session_or_none(session)
    if session is None and outer is not None:
        session = outer.session
    if session is None:
        session = serve_session_id()
    return request_scope(session=session, tenant=tenant)


def carry_scope(executor: Executor) -> Executor:
    """Make ``executor`` run every function submitted to it in the scope current at submission
    (``loop.run_in_executor`` and ``submit`` copy no context variables into the pool's threads).
    Changes the one object in place (its ``submit``), so callers that captured it before, such as
    vLLM's ``make_async`` wrappers, carry the scope too; returns it."""
    submit = executor.submit

    def submit_in_scope(fn: Callable[..., Any], /, *args: Any, **kwargs: Any):
        return submit(request_scope.bind(fn), *args, **kwargs)

    submit_in_scope.__wrapped__ = submit  # type: ignore[attr-defined]
    executor.submit = submit_in_scope  # type: ignore[method-assign]
    return executor


def is_carrying(executor: Executor) -> bool:
    """Whether :func:`carry_scope` was applied to ``executor``."""
    return getattr(executor.submit, "__wrapped__", None) is not None


class SessionHeader:
    """ASGI middleware: the request's ``x-session-id`` header (when it is a usable key) is bound as
    the session key around the request, for the engine integration below to pick up
    (``vllm serve ... --middleware delta_ray.apps.dropin.binding.SessionHeader``). It binds no
    tenant: the request's cache salt, read where the engine renders, is the tenant."""

    def __init__(self, app: Callable[..., Any]):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        session = None
        for name, value in scope.get("headers") or ():
            if name.lower() == _HEADER_BYTES:
                # HTTP header values are bytes; latin-1 maps each byte to one character, as Starlette reads them
                session = session_or_none(value.decode("latin-1"))
                break
        if session is None:
            await self.app(scope, receive, send)
            return
        outer = current_scope()
        with request_scope(session=session, tenant=outer.tenant if outer is not None else None):
            await self.app(scope, receive, send)
