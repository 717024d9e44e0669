"""What a client may hold of the one-process server before the app sees a request: connections, a
request head's bytes and its time. uvicorn's own limits where it has them, its protocols extended
where it has none.

uvicorn (0.55) bounds, as ``local.py`` configures it: requests running at once
(``limit_concurrency``: a request whose head arrives while that many run, counting those whose
client has gone, is answered 503 and closed), an idle connection between requests
(``timeout_keep_alive``), the kernel's queue of connections not yet accepted (``backlog``) and,
with its h11 protocol, a request head's size (``h11_max_incomplete_event_size``: a 400 and a close).
It does not bound, and :func:`limited_protocol` adds to its protocol classes:

- **open connections**: one past ``max_connections`` is answered 503 and closed unread, so idle
  sockets cannot pile up (uvicorn counts them only when a request's head is in, and its 503 then
  refuses every connection's requests, the established ones' too);
- **a request head's bytes** with httptools (what uvicorn picks where it is installed, as with
  ``uvicorn[standard]``), which buffers a head of any size: past ``max_header_bytes`` of request
  line and headers a 431 and a close, counted as the bytes arrive, so a head that never ends is
  refused as well (h11 enforces the same bound itself, with a 400);
- **a request head's time**: a head must be in within ``header_timeout_s`` of the connection's
  start (its first request) or of its own first byte (later requests, once the keep-alive wait has
  ended). uvicorn arms no timer before a connection's first request, and a byte ends its keep-alive
  wait, so a client that connects and sends nothing, or drips a head, was never cut off. Past the
  deadline a connection that sent nothing is closed and one in the middle of a head gets a 408 and
  is closed. The wait does not count while the server itself has stopped reading the connection
  (a pipelined request waiting for the one before it).

What follows the head, the body, is the app's (``asgi.py``: its deadline and the body budget).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from .http_api import dumps_json
from .serve_config import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEADER_BYTES

log = logging.getLogger("delta_ray.serve")

PROTOCOLS = ("auto", "httptools", "h11")
WARN_EVERY_S = 60.0  # a refusal is logged at most this often (a flood of them would flood the log)


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may hold before its request reaches the app (see the module's text)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S

    def __post_init__(self):
        for name in ("max_connections", "max_header_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        t = self.header_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise ValueError(f"header_timeout_s must be positive, got {t!r}")


def limited_protocol(limits: ConnectionLimits, http: str = "auto") -> type:
    """uvicorn's HTTP/1.1 protocol class ``http`` ("auto": httptools where installed, else h11)
    with ``limits``: give it to ``uvicorn.Config(http=...)``."""
    if http not in PROTOCOLS:
        raise ValueError(f"http must be one of {PROTOCOLS}, got {http!r}")
    if http == "auto":
        try:
            import httptools  # noqa: F401  # lazy: whether it is installed decides "auto" (as uvicorn's own)
        except ImportError:  # pragma: no cover - uvicorn[standard] brings it
            http = "h11"
        else:
            http = "httptools"
    base = _httptools_limited() if http == "httptools" else _h11_limited()
    return type(base.__name__, (base,), {"limits": limits})


def _error(status: int, reason: str, message: str) -> bytes:
    """A whole response written straight to the transport (no request cycle to answer through),
    with the app's JSON error body, that closes the connection."""
    body = dumps_json({"error": {"message": message, "type": "BadRequestError", "code": status}})
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, reason.encode(), len(body))) + body


def _refusing_app(status: int, message: str) -> Callable:
    """An ASGI app that answers ``status`` and closes the connection (for a request whose head is
    in but is refused before the app sees it)."""
    body = dumps_json({"error": {"message": message, "type": "BadRequestError", "code": status}})

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
    return app


def _head_checked(app: Callable, limit: int, message: Callable[[], str]) -> Callable:
    """``app`` behind a check of the request's line and headers against ``limit`` bytes (a 431 and
    a close past it), for a protocol that measures no complete head itself."""

    async def checked(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b""))
            size += sum(len(name) + len(value) + 4 for name, value in scope["headers"])
            if size > limit:
                return await _refusing_app(431, message())(scope, receive, send)
        await app(scope, receive, send)
    return checked


_last_warning: dict[str, float] = {}


def _warn(what: str, message: str, *args: Any) -> None:
    now = time.monotonic()
    if now - _last_warning.get(what, -WARN_EVERY_S) >= WARN_EVERY_S:
        _last_warning[what] = now
        log.warning(message + " (logged at most once a minute)", *args)


class _Limited:
    """What both protocols add: the connection cap and the head's deadline. The subclasses say
    when a head starts and ends (``_head_open``)."""

    limits: ConnectionLimits  # set by limited_protocol
    _refused = False
    _head_timer: "asyncio.TimerHandle | None" = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            self._refused = True
            _warn("connections", "refused a connection: %d are open (max_connections)", len(self.connections))
            transport.write(_error(503, "Service Unavailable", f"the server holds its limit of "
                                   f"{self.limits.max_connections} connections: retry later"))
            transport.close()
            return
        super().connection_made(transport)
        self._arm_head()

    def connection_lost(self, exc: "Exception | None") -> None:
        if self._refused:
            return
        self._disarm_head()
        super().connection_lost(exc)

    def _arm_head(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def _disarm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # this side stopped reading (pipelining): not the client's delay
            self._arm_head()
            return
        if self._head_open():
            _warn("head-time", "closed a connection whose request head was not in within %g s (header_timeout_s)",
                  self.limits.header_timeout_s)
            self._refuse(_error(408, "Request Timeout", f"the request's headers did not arrive within "
                                f"{self.limits.header_timeout_s:g} s"))
        else:
            self.transport.close()  # nothing sent: an idle connection

    def _refuse(self, response: bytes) -> None:
        self._disarm_head()
        self.transport.write(response)
        self.transport.close()

    def _too_big(self) -> str:
        """The 431's message (and the log line, at most once a minute)."""
        _warn("head-size", "refused a request head over %d bytes (max_header_bytes)", self.limits.max_header_bytes)
        return f"the request's line and headers exceed {self.limits.max_header_bytes} bytes"

    def _unsupported_upgrade_warning(self) -> None:
        """The service serves no websockets (``ws="none"``): an ``Upgrade`` request is answered as
        plain HTTP, and the two warnings uvicorn logs for each would be a log any client fills."""

    def _head_open(self) -> bool:
        raise NotImplementedError


def _httptools_limited() -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # lazy: imports httptools, maybe absent

    class LimitedHttpToolsProtocol(_Limited, HttpToolsProtocol):
        """httptools' protocol with the limits. A head's size is counted twice: exactly, from the
        parser's callbacks (the URL and each whole header), and as the raw bytes of each read that
        leaves it open: the parser hands a header over only once it ends, so an endless header shows
        only in the second count. A read in which another request ended (pipelining) is not
        counted, as its bytes are partly that request's: the buffered head stays within the limit
        plus one read."""

        _in_head = False  # between a request's first byte and its headers' end
        _head_size = 0  # its URL and headers so far, exactly
        _head_raw = 0  # the bytes of the reads that left it open
        _ended = False  # a request ended during this read

        def _head_open(self) -> bool:
            return self._in_head

        def data_received(self, data: bytes) -> None:
            if self._refused or self.transport.is_closing():
                return
            self._ended = False
            super().data_received(data)
            if not self._in_head or self.transport.is_closing():
                return
            if not self._ended:  # all of this read is the open head's (but CRLFs before it)
                self._head_raw += len(data)
            if max(self._head_size, self._head_raw) > self.limits.max_header_bytes:
                self._refuse(_error(431, "Request Header Fields Too Large", self._too_big()))

        def on_message_complete(self) -> None:
            self._ended = True
            super().on_message_complete()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._head_size, self._head_raw = True, 0, 0
            self._arm_head()

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            self._head_size += len(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            super().on_header(name, value)
            self._head_size += len(name) + len(value) + 4  # ": " and CRLF

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._disarm_head()
            if self._head_size <= self.limits.max_header_bytes:
                return super().on_headers_complete()
            # Refused through a request cycle (the parser goes on with the body): a 431, then a close.
            app, self.app = self.app, _refusing_app(431, self._too_big())
            try:
                super().on_headers_complete()
            finally:
                self.app = app

    return LimitedHttpToolsProtocol


def _h11_limited() -> type:
    import h11  # lazy: only where h11 runs
    from uvicorn.protocols.http.h11_impl import H11Protocol  # lazy: only where h11 runs

    class LimitedH11Protocol(_Limited, H11Protocol):
        """h11's protocol with the limits. h11 bounds a head it is still waiting for the end of
        (``h11_max_incomplete_event_size``, which ``local.py`` sets to ``max_header_bytes``: a 400
        and a close), so what it buffers stays within the limit plus one read; a head that came
        whole in one read is measured when its request starts (a 431 and a close)."""

        _head_started = False  # bytes of a request's head have come, its headers' end not yet

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.app = _head_checked(self.app, self.limits.max_header_bytes, self._too_big)

        def _head_open(self) -> bool:
            return self._head_started

        def data_received(self, data: bytes) -> None:
            if self._refused or self.transport.is_closing():
                return
            if self.conn.their_state is h11.IDLE:  # these bytes start (or go on with) a request's head
                self._head_started = True
                self._arm_head()
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._head_started = False
                self._disarm_head()

    return LimitedH11Protocol
