"""``request_scope``: a request's identity (session key, tenant), seen by a wrapped tokenizer.

A serving engine tokenizes deep inside its request path (vLLM's renderer, SGLang's tokenizer
manager), where no request object reaches the tokenizer. The engine's integration (or a user's own
server) binds the request's identity around that call::

    with delta_ray.request_scope(session=request.headers.get("x-session-id"), tenant=request.cache_salt):
        ids = tok.apply_chat_template(messages, tokenize=True)

and the wrapped tokenizer's one-text encodes read it (:mod:`delta_ray.apps.dropin.sessions`): with a
session key they continue that session of that tenant; without one they look the text up by content
inside the tenant; with no scope at all, inside the shared namespace of requests without a tenant.
States never cross tenants.

The scope is a :class:`contextvars.ContextVar`: it follows ``await`` and ``asyncio.to_thread`` (which
copy the context), but not ``loop.run_in_executor`` or ``ThreadPoolExecutor.submit`` (which do not):
pass the function through :meth:`request_scope.bind` there. A nested scope replaces the outer one
whole (its ``None`` means none, not "inherit"), and the outer one is back on exit.
"""
from __future__ import annotations

import contextvars
import functools
from typing import Callable, NamedTuple, TypeVar

from ..._core.arguments import check_tenant, check_text

__all__ = ["Scope", "request_scope"]

T = TypeVar("T")


class Scope(NamedTuple):
    """The identity a request binds: its session key and its tenant (each None when not given)."""

    session: str | None
    tenant: str | None


_CURRENT: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("delta_ray_request_scope", default=None)
current_scope = _CURRENT.get  # the wrapped tokenizer's read: one C call, None outside any scope


class request_scope:
    """``with request_scope(session=..., tenant=...):`` binds a request's identity for the wrapped
    tokenizer calls made inside the block, on this thread (and in tasks and ``asyncio.to_thread``
    calls started from it; for other thread pools see :meth:`bind`).

    ``session``: the conversation's key (a session id header, SGLang's session id...): a one-text
    encode continues that session, re-encoding only what changed since its last call. ``tenant``:
    who may share state with whom (vLLM's ``cache_salt``): nothing is shared across different
    tenants; requests without a tenant share one namespace, as they share an engine's prefix cache.
    Both are ``str`` or ``None``. Nesting: the inner scope wins whole; the outer one is restored on exit.
    """

    __slots__ = ("scope", "_tokens")

    def __init__(self, session: str | None = None, tenant: str | None = None):
        if session is not None:
            check_text(session, "session")
        self.scope = Scope(session, check_tenant(tenant))
        self._tokens: list[contextvars.Token] = []  # one per active ``with`` (re-entrant)

    def __enter__(self) -> Scope:
        self._tokens.append(_CURRENT.set(self.scope))
        return self.scope

    def __exit__(self, *exc) -> bool:
        _CURRENT.reset(self._tokens.pop())
        return False

    def __repr__(self) -> str:
        # the tenant is a secret of its caller's (a cache_salt): never shown
        return f"request_scope(session={self.scope.session!r}, tenant={'<set>' if self.scope.tenant else None})"

    @staticmethod
    def current() -> Scope | None:
        """The scope bound on this thread now (None outside any scope)."""
        return _CURRENT.get()

    @staticmethod
    def bind(fn: Callable[..., T]) -> Callable[..., T]:
        """``fn`` made to run inside the scope current NOW, wherever it is called later: for
        ``loop.run_in_executor(pool, request_scope.bind(fn), ...)`` and ``pool.submit(...)``, which do
        not carry context variables into their threads. Only the scope travels (not the whole
        context), so the bound function may run on several threads at once."""
        scope = _CURRENT.get()

        @functools.wraps(fn)
        def in_scope(*args, **kwargs):
            token = _CURRENT.set(scope)
            try:
                return fn(*args, **kwargs)
            finally:
                _CURRENT.reset(token)
        return in_scope
