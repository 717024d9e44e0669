"""A same-node side channel to a worker actor for session calls, beside Ray's actor calls.

Why: a Ray actor call costs 1.4-2 ms here even for an empty method, more than a 1.3K-character
session repair itself; a Unix socket round trip from the pool's event loop costs about 0.4 ms.

What travels: typed binary frames, never pickle. A frame is a 9-byte header (magic ``DRC1``, a
kind byte, a uint32 body length) and a body of typed values: None, bool, signed or unsigned 64-bit
integers, UTF-8 text and little-endian int32 arrays. A request is ``(method, *args)``; an answer is a tuple of values, one
value, or an error (exception type name and message, mapped back to a small set of known
exception classes on the client; anything else is a :class:`RemoteError`). Decoding can build
nothing but those values, so a hostile peer cannot run code through a frame.

Who may talk (threat model in ``docs/design.md`` §9): the socket is a Linux abstract-namespace
name, which any local process of any user can try to connect to, and which anyone can bind once the
worker that held it dies. So both ends authenticate before any request text moves:

* the server accepts only peers of its own uid (SO_PEERCRED), at most ``max_connections`` at once,
  and sends a random 32-byte challenge;
* the client checks the server's peer credentials (same uid, and the pid the pool learned from the
  worker through Ray), then proves knowledge of the per-pool secret (HMAC-SHA256 over both nonces)
  and requires the server to prove it too. A process without the secret (another Ray job, a
  sidecar, an impostor on a dead worker's name) is dropped before it sees a byte of a request.

Bounds: frames over ``max_frame`` bytes end the connection (both directions); a handshake has
``handshake_timeout_s``, an idle connection ``idle_timeout_s``; ``close()`` stops accepting and
closes every open connection. A dropped connection never makes the pool guess: it asks Ray whether
the actor lives (``actors/pool.py``).
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import socket
import struct
import sys
import threading
import uuid
from typing import Any, Callable, Optional

import numpy as np

from delta_ray.session_store import SessionNotFound
from delta_ray.errors import DeltaRayError

MAGIC = b"DRC1"
HELLO = b"DRH1"
_HEADER = struct.Struct("!4sBI")  # magic, kind, body length
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_NONCE = 32
_MAC = hashlib.sha256().digest_size

KIND_REQUEST, KIND_TUPLE, KIND_VALUE, KIND_ERROR = 1, 2, 3, 4
T_NONE, T_FALSE, T_TRUE, T_INT, T_STR, T_I32, T_UINT = range(7)
_LEN = struct.Struct("!I")
_INT = struct.Struct("!q")
_UINT = struct.Struct("!Q")  # state versions are random 64-bit counters

MAX_FRAME = 512 * 1024 * 1024  # a 100M-character text or 128M IDs; larger goes through Ray
MAX_CONNECTIONS = 32
HANDSHAKE_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 600.0

# Exceptions a worker may raise that the client re-raises as themselves.
KNOWN_ERRORS: dict[str, type[BaseException]] = {
    "SessionNotFound": SessionNotFound, "KeyError": KeyError, "ValueError": ValueError,
    "TypeError": TypeError, "RuntimeError": RuntimeError,
}


class ChannelClosed(DeltaRayError, ConnectionError):
    """The worker's end of the channel went away (the actor most likely died), or it failed to
    authenticate: either way the pool falls back to Ray."""


class ChannelAuthError(ChannelClosed):
    """The peer did not prove the pool secret, or is not the process the pool was told about."""


class RemoteError(DeltaRayError, RuntimeError):
    """A worker error of a type the channel does not map back (its type name is in the message)."""


class FrameError(DeltaRayError, ValueError):
    """A malformed frame: the connection that sent it ends."""


def supported() -> bool:
    """Abstract-namespace Unix sockets and SO_PEERCRED are Linux features."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_PEERCRED")


def new_secret() -> bytes:
    """A per-pool secret (handed to workers through Ray, never over the channel)."""
    return secrets.token_bytes(32)


# -- values ---------------------------------------------------------------------------------------
def encode_values(values: tuple) -> bytes:
    """Typed binary encoding of a tuple of None/bool/int/str/int32-array values."""
    out = bytearray()
    for v in values:
        if v is None:
            out.append(T_NONE)
        elif v is True or v is False:
            out.append(T_TRUE if v else T_FALSE)
        elif isinstance(v, (int, np.integer)):
            v = int(v)
            if v >= 0:
                out.append(T_UINT)
                out += _UINT.pack(v)
            else:
                out.append(T_INT)
                out += _INT.pack(v)
        elif isinstance(v, str):
            data = v.encode("utf-8", "surrogatepass")
            out.append(T_STR)
            out += _LEN.pack(len(data)) + data
        elif isinstance(v, np.ndarray):
            data = np.ascontiguousarray(v, dtype="<i4").tobytes()
            out.append(T_I32)
            out += _LEN.pack(len(data) // 4) + data
        else:
            raise TypeError(f"the side channel carries None, bool, int, str and int32 arrays, not {type(v).__name__}")
    return bytes(out)


def decode_values(body: bytes) -> tuple:
    """Inverse of :func:`encode_values`; raises :class:`FrameError` on anything malformed."""
    out: list[Any] = []
    pos, n = 0, len(body)
    mv = memoryview(body)
    while pos < n:
        t = body[pos]
        pos += 1
        if t == T_NONE:
            out.append(None)
        elif t in (T_FALSE, T_TRUE):
            out.append(t == T_TRUE)
        elif t in (T_INT, T_UINT):
            if pos + 8 > n:
                raise FrameError("truncated int")
            out.append((_INT if t == T_INT else _UINT).unpack_from(body, pos)[0])
            pos += 8
        elif t in (T_STR, T_I32):
            if pos + 4 > n:
                raise FrameError("truncated length")
            count = _LEN.unpack_from(body, pos)[0]
            pos += 4
            size = count * (4 if t == T_I32 else 1)
            if pos + size > n:
                raise FrameError("truncated value")
            if t == T_STR:
                out.append(bytes(mv[pos:pos + size]).decode("utf-8", "surrogatepass"))
            else:
                out.append(np.frombuffer(body, dtype="<i4", count=count, offset=pos).astype(np.int32, copy=False))
            pos += size
        else:
            raise FrameError(f"unknown value type {t}")
    return tuple(out)


def frame(kind: int, body: bytes) -> bytes:
    return _HEADER.pack(MAGIC, kind, len(body)) + body


def _parse_header(header: bytes, max_frame: int) -> tuple[int, int]:
    magic, kind, size = _HEADER.unpack(header)
    if magic != MAGIC:
        raise FrameError("bad magic")
    if size > max_frame:
        raise FrameError(f"frame of {size} bytes over the {max_frame}-byte cap")
    return kind, size


def _mac(secret: bytes, tag: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, tag + a + b, hashlib.sha256).digest()


def _answer_frame(result: Any) -> bytes:
    if isinstance(result, tuple):
        return frame(KIND_TUPLE, encode_values(result))
    return frame(KIND_VALUE, encode_values((result,)))


def _error_frame(exc: BaseException) -> bytes:
    name = type(exc).__name__ if type(exc).__name__ in KNOWN_ERRORS else "RemoteError"
    msg = str(exc) if name != "RemoteError" else f"{type(exc).__name__}: {exc}"
    return frame(KIND_ERROR, encode_values((name, msg[:4096])))


def _raise_error(values: tuple) -> None:
    if len(values) != 2 or not all(isinstance(v, str) for v in values):
        raise FrameError("malformed error frame")
    name, msg = values
    cls = KNOWN_ERRORS.get(name, RemoteError)
    raise cls(msg)


# -- server ---------------------------------------------------------------------------------------
class ChannelServer:
    """Worker side: serve ``handler(method, args)`` to authenticated same-user peers.

    ``handler`` must be thread-safe against the actor's own Ray method calls (the worker holds one
    lock around its tokenizer for both). ``methods`` is the whitelist, checked before the handler.
    """

    def __init__(self, handler: Callable[[str, tuple], Any], secret: bytes, *, methods: frozenset[str] | None = None,
                 max_frame: int = MAX_FRAME, max_connections: int = MAX_CONNECTIONS,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S, idle_timeout_s: float = IDLE_TIMEOUT_S):
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise ValueError("the channel secret must be at least 16 random bytes")
        self._handler = handler
        self._secret = secret
        self._methods = methods
        self.max_frame = max_frame
        self.max_connections = max_connections
        self.handshake_timeout_s = handshake_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.address = "\0delta-ray-" + uuid.uuid4().hex
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(64)
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self.closed = False
        self.rejected = 0
        self._acceptor = threading.Thread(target=self._accept, name="delta-ray-channel", daemon=True)
        self._acceptor.start()

    @property
    def connections(self) -> int:
        with self._conns_lock:
            return len(self._conns)

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            try:
                _, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            except OSError:  # the peer left already: keep accepting others
                conn.close()
                continue
            with self._conns_lock:
                full = len(self._conns) >= self.max_connections
                if uid == os.getuid() and not full and not self.closed:
                    self._conns.add(conn)
                else:
                    self.rejected += 1
                    conn.close()
                    continue
            threading.Thread(target=self._serve, args=(conn,), name="delta-ray-channel-conn", daemon=True).start()

    def _handshake(self, conn: socket.socket, reader) -> bool:
        conn.settimeout(self.handshake_timeout_s)
        nonce_s = secrets.token_bytes(_NONCE)
        conn.sendall(HELLO + nonce_s)
        got = reader.read(_NONCE + _MAC)
        if len(got) != _NONCE + _MAC:
            return False
        nonce_c, mac = got[:_NONCE], got[_NONCE:]
        if not hmac.compare_digest(mac, _mac(self._secret, b"client", nonce_s, nonce_c)):
            return False
        conn.sendall(_mac(self._secret, b"server", nonce_c, nonce_s))
        conn.settimeout(self.idle_timeout_s)
        return True

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rb") as reader:
                if not self._handshake(conn, reader):
                    self.rejected += 1
                    return
                while not self.closed:
                    header = reader.read(_HEADER.size)
                    if len(header) < _HEADER.size:
                        return
                    kind, size = _parse_header(header, self.max_frame)
                    if kind != KIND_REQUEST:
                        return
                    body = reader.read(size)
                    if len(body) < size:
                        return
                    values = decode_values(body)
                    del body
                    if not values or not isinstance(values[0], str):
                        return
                    method, args = values[0], values[1:]
                    try:
                        if self._methods is not None and method not in self._methods:
                            raise ValueError(f"{method!r} is not served over the side channel")
                        data = _answer_frame(self._handler(method, args))
                    except Exception as exc:  # noqa: BLE001 - the caller gets it, as from a Ray call
                        data = _error_frame(exc)
                    if len(data) - _HEADER.size > self.max_frame:
                        data = _error_frame(RuntimeError("the answer is over the side channel's frame cap"))
                    conn.sendall(data)
        except (OSError, FrameError, ValueError):  # a broken frame, a timeout: this connection ends
            return
        finally:
            with self._conns_lock:
                self._conns.discard(conn)

    def close(self) -> None:
        """Stop accepting and close every open connection."""
        self.closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept thread
        except OSError:
            pass
        self._sock.close()
        if threading.current_thread() is not self._acceptor:
            self._acceptor.join(2.0)  # the name is free once accept() has returned
        with self._conns_lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# -- client ---------------------------------------------------------------------------------------
class ChannelClient:
    """Pool side: one authenticated connection to one worker, used from the pool's event loop.

    ``expected_pid`` is the worker's pid as Ray reported it: a server with another pid (an
    impostor that bound a dead worker's name) is refused before anything is sent. Calls are
    serialized per connection; any transport or authentication failure raises
    :class:`ChannelClosed` and the client stays closed.
    """

    def __init__(self, address: str, secret: bytes, *, expected_pid: int | None = None, max_frame: int = MAX_FRAME):
        self.address = address
        self._secret = secret
        self.expected_pid = expected_pid
        self.max_frame = max_frame
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._lock: Optional[asyncio.Lock] = None
        self.closed = False

    async def _connect(self) -> None:
        reader, writer = await asyncio.open_unix_connection(self.address, limit=2 ** 20)
        self._reader, self._writer = reader, writer
        sock = writer.get_extra_info("socket")
        pid, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        if uid != os.getuid() or (self.expected_pid is not None and pid != self.expected_pid):
            raise ChannelAuthError(f"the process behind {self.address[1:]!r} (pid {pid}, uid {uid}) is not "
                                   f"the worker (pid {self.expected_pid})")
        hello = await reader.readexactly(len(HELLO) + _NONCE)
        if hello[:len(HELLO)] != HELLO:
            raise ChannelAuthError("not a delta-ray channel")
        nonce_s = hello[len(HELLO):]
        nonce_c = secrets.token_bytes(_NONCE)
        writer.write(nonce_c + _mac(self._secret, b"client", nonce_s, nonce_c))
        proof = await reader.readexactly(_MAC)
        if not hmac.compare_digest(proof, _mac(self._secret, b"server", nonce_c, nonce_s)):
            raise ChannelAuthError("the worker did not prove the pool secret")

    async def call(self, method: str, args: tuple) -> Any:
        """Run ``method(*args)`` on the worker; its exception is raised here as it was there."""
        if self.closed:
            raise ChannelClosed(f"channel {self.address[1:]!r} is closed")
        if self._lock is None:
            self._lock = asyncio.Lock()
        request = frame(KIND_REQUEST, encode_values((method, *args)))
        async with self._lock:
            try:
                if self._writer is None:
                    await self._connect()
                self._writer.write(request)
                del request
                kind, size = _parse_header(await self._reader.readexactly(_HEADER.size), self.max_frame)
                values = decode_values(await self._reader.readexactly(size))
            except ChannelClosed:
                self.close()
                raise
            except (OSError, EOFError, asyncio.IncompleteReadError, FrameError, struct.error) as exc:
                self.close()
                raise ChannelClosed(f"channel {self.address[1:]!r} closed: {exc!r}") from exc
            except BaseException:  # e.g. cancelled mid-frame: the stream is out of step now
                self.close()
                raise
        if kind == KIND_ERROR:
            _raise_error(values)
        if kind == KIND_TUPLE:
            return values
        if kind == KIND_VALUE and len(values) == 1:
            return values[0]
        self.close()
        raise ChannelClosed(f"channel {self.address[1:]!r}: unexpected answer kind {kind}")

    def close(self) -> None:
        self.closed = True
        if self._writer is not None:
            self._writer.close()
            self._writer = None
