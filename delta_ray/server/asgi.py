"""The HTTP side of the tokenization service: one ASGI app, run by both hosts.

The one-process server (``local.py``) runs it on uvicorn; a Ray Serve replica (``actors/serve.py``)
builds the same app over its own handler (``__serve_build_asgi_app__``), whether Serve's proxy or
the replica's own server (direct ingress) receives the request. So routing, the body's stream
under its limit, status codes and the JSON answers are one implementation; what a request means
is :class:`~delta_ray.server.serve_handler.RequestHandler`'s.

A plain ASGI callable rather than a framework's router: a request costs a dict lookup and two
``send`` calls here, and the handler already does what a framework would add (validation, errors
as JSON). Ray-free.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable

from .http_api import BadRequest, dumps_json

# path -> endpoint name of RequestHandler.http (POST only)
ENDPOINTS = {"/tokenize": "tokenize", "/detokenize": "detokenize"}
JSON = (b"content-type", b"application/json")
CLIENT_GONE = 499  # the client closed the connection before its body arrived (nginx's code; nothing is sent)
# A whole request body must arrive within this: neither uvicorn nor Serve's proxy times out a body
# that a client drips, so without it each such client holds a connection and a request forever.
DEFAULT_BODY_TIMEOUT_S = 120.0
TOO_MANY = 429  # one client's requests hold their share of body bytes
BUSY = 503  # all requests together hold the server's body bytes


class TokenizerASGI:
    """``POST /tokenize``, ``POST /detokenize``, ``GET /health`` and, where ``metrics`` is given,
    ``GET /metrics`` (its text), over a handler's ``http(endpoint, content_length, chunks)``. A body
    that has not arrived whole within ``body_timeout_s`` ends its request with a 408; where
    ``budget`` is given, the body bytes requests hold at once are bounded by it (a 429 or 503)."""

    def __init__(self, handler: Any, metrics: "Callable[[], bytes] | None" = None,
                 body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S, budget: "BodyBudget | None" = None):
        if not body_timeout_s > 0:
            raise ValueError(f"body_timeout_s must be positive, not {body_timeout_s!r}")
        self.handler = handler
        self.metrics = metrics
        self.body_timeout_s = body_timeout_s
        self.budget = budget

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            return await _lifespan(receive, send)
        if kind != "http":  # websockets: not served
            return
        path = _route(scope)
        method = scope["method"]
        endpoint = ENDPOINTS.get(path)
        if endpoint is not None:
            if method != "POST":
                return await _error(send, 405, f"{path} takes POST", "MethodNotAllowed", [(b"allow", b"POST")])
            length = _content_length(scope)
            share = None if self.budget is None else self.budget.share(scope)
            try:
                status, data, headers = await self.handler.http(endpoint, length,
                                                                  _body(receive, self.body_timeout_s, share, length))
            finally:
                if share is not None:
                    share.release()  # the request's body, parsed or not, is no longer held
            return await _send(send, status, data, [JSON, *((k.encode(), v.encode()) for k, v in headers.items())])
        if path == "/health" or (path == "/metrics" and self.metrics is not None):
            if method not in ("GET", "HEAD"):
                return await _error(send, 405, f"{path} takes GET", "MethodNotAllowed", [(b"allow", b"GET, HEAD")])
            data = b"" if path == "/health" else self.metrics()
            headers = [] if path == "/health" else [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
            return await _send(send, 200, b"" if method == "HEAD" else data, headers, len(data))
        return await _error(send, 404, f"no route {path[:200]!r}: POST /tokenize, POST /detokenize, GET /health",
                            "NotFoundError")


def _route(scope: dict) -> str:
    """The path below the app's mount point (Serve's route prefix), as Starlette reads it."""
    path, root = scope.get("path", "/"), scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    return path or "/"


def _content_length(scope: dict) -> "str | None":
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return value.decode("latin-1")
    return None


class BodyBudget:
    """The request body bytes that the requests in progress hold at once: ``total`` by all of them
    (past it a 503: the server is busy, retry) and ``per_client`` by those of one client address
    (past it a 429). A request is charged each chunk as it arrives and released when its answer is
    ready (its body is held until then: as chunks, then parsed); one whose ``Content-Length`` does
    not fit what is left is refused before a byte of it is read. Charging what arrives, not what is
    declared, makes a client send the bytes it holds the budget with. The event loop's alone: no lock.

    The client is ``scope["client"]``'s address: the peer's, or what a trusted proxy's
    ``X-Forwarded-For`` names (uvicorn's ``forwarded_allow_ips``, loopback by default)."""

    __slots__ = ("total", "per_client", "held", "_clients")

    def __init__(self, total: int, per_client: int):
        for name, value in (("total", total), ("per_client", per_client)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.total, self.per_client = total, per_client
        self.held = 0
        self._clients: dict[str, int] = {}

    def held_by(self, client: str) -> int:
        return self._clients.get(client, 0)

    def share(self, scope: dict) -> "_Share":
        client = scope.get("client")
        return _Share(self, client[0] if client else "")

    def check(self, client: str, n: int) -> None:
        """Refuse ``n`` more bytes for ``client`` unless they fit its share and the total."""
        if self._clients.get(client, 0) + n > self.per_client:
            raise BadRequest(f"this client's requests in progress hold their limit of {self.per_client} body bytes: "
                             "retry when some have been answered", TOO_MANY)
        if self.held + n > self.total:
            raise BadRequest(f"the server's requests in progress hold its limit of {self.total} body bytes: "
                             "retry later", BUSY)

    def take(self, client: str, n: int) -> None:
        """Charge ``n`` bytes to ``client`` if they fit (else a 429 or 503)."""
        self.check(client, n)
        self.held += n
        self._clients[client] = self._clients.get(client, 0) + n

    def give_back(self, client: str, n: int) -> None:
        self.held -= n
        left = self._clients[client] - n
        if left:
            self._clients[client] = left
        else:
            del self._clients[client]


class _Share:
    """One request's bytes in its :class:`BodyBudget`."""

    __slots__ = ("budget", "client", "held")

    def __init__(self, budget: BodyBudget, client: str):
        self.budget, self.client, self.held = budget, client, 0

    def admit(self, content_length: "str | None") -> None:
        """Refuse a body whose declared length does not fit what is left (a 429 or 503)."""
        if content_length is not None and content_length.isdigit():
            self.budget.check(self.client, int(content_length))

    def charge(self, n: int) -> None:
        self.budget.take(self.client, n)
        self.held += n

    def release(self) -> None:
        n, self.held = self.held, 0
        if n:
            self.budget.give_back(self.client, n)


class _BodyDeadline:
    """One timer per request (not a task per chunk): when it fires while the request waits for its
    body, the request's task is cancelled and the wait ends in a 408; fired at any other moment, the
    next wait ends so."""

    __slots__ = ("expired", "waiting", "_task", "_handle")

    def __init__(self, timeout_s: float):
        self.expired = self.waiting = False
        self._task = asyncio.current_task()
        self._handle = asyncio.get_running_loop().call_later(timeout_s, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self.waiting:
            self._task.cancel()

    def absorb(self) -> None:
        """The cancel that ended the wait was this deadline's: the task is not being cancelled."""
        uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+ counts cancels
        if uncancel is not None:
            uncancel()

    def done(self) -> None:
        self._handle.cancel()


def _late(timeout_s: float) -> BadRequest:
    return BadRequest(f"the request body did not arrive within {timeout_s:g} s", 408)


async def _body(receive: Callable, timeout_s: float, share: "_Share | None" = None,
                content_length: "str | None" = None) -> AsyncIterator[bytes]:
    """The request body's chunks as they arrive; a client gone mid-body ends the request (499), a
    body not whole within ``timeout_s`` ends it with a 408, one past its ``share`` of the body
    budget with a 429 or 503 (its declared length before a byte is read, then each chunk)."""
    deadline = _BodyDeadline(timeout_s)
    try:
        if share is not None:
            share.admit(content_length)
        while True:
            if deadline.expired:
                raise _late(timeout_s)
            deadline.waiting = True
            try:
                message = await receive()
            except asyncio.CancelledError:
                if not deadline.expired:
                    raise
                deadline.absorb()
                raise _late(timeout_s) from None
            finally:
                deadline.waiting = False
            if message["type"] == "http.disconnect":
                raise BadRequest("the client closed the connection", CLIENT_GONE)
            chunk = message.get("body", b"")
            if chunk:
                if share is not None:
                    share.charge(len(chunk))
                yield chunk
            if not message.get("more_body", False):
                return
    finally:
        deadline.done()


async def _send(send: Callable, status: int, data: bytes, headers: list, length: "int | None" = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", b"%d" % (len(data) if length is None else length)), *headers]})
    await send({"type": "http.response.body", "body": data})


async def _error(send: Callable, status: int, message: str, kind: str, headers: "list | None" = None) -> None:
    data = dumps_json({"error": {"message": message, "type": kind, "code": status}})
    await _send(send, status, data, [JSON, *(headers or [])])


async def _lifespan(receive: Callable, send: Callable) -> None:
    """Nothing to start or stop: the handler is built before the server starts."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
