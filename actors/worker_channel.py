"""A same-node side channel to a worker actor for session calls, beside Ray's actor calls.

Why: a Ray actor call, even to an empty method, costs more than a short session repair itself; a
Unix socket round trip from the pool's event loop costs a fraction of it.

What travels (:mod:`delta_ray.actors.channel_codec`): typed binary frames, never pickle. A frame is a 9-byte header
(magic ``DRC2``, a kind byte, a uint32 body length), a body of typed values (None, bool, signed or unsigned 64-bit
integers, UTF-8 text and little-endian int32 arrays) and a 32-byte tag. A request is ``(method,
*args)``; an answer is a tuple of values, one value, or an error (exception type name and message,
mapped back to a small set of known exception classes on the client; anything else is a
:class:`RemoteError`). Decoding can build nothing but those values, at most :data:`MAX_VALUES` of
them, so a hostile peer cannot run code through a frame, nor make a frame decode into more than
about four times its own size.

Who may talk (``docs/threat-model.md``, "Side channel"): the socket is a Linux abstract-namespace
name, which any local process of any user can try to connect to, and which anyone can bind once the
worker that held it dies. So both ends authenticate before any request text moves, and every frame
after that is authenticated too:

* the server accepts only peers of its own uid (SO_PEERCRED), at most ``max_connections`` at once,
  of which at most ``max_pending`` still in their handshake, and sends a random 32-byte challenge.
  A peer without the secret can hold slots only until the handshake deadline, and only handshake
  slots: when those are full, a new connection closes the oldest handshake of the peer process
  holding the most of them, so a process that keeps reconnecting (or floods) evicts its own
  connections, and the pool, which answers within milliseconds, still gets in. Authenticated
  connections are never evicted. (Many colluding same-uid processes can still crowd out a handshake;
  a same-uid process can also simply kill the worker: availability against the same user is not
  claimed, only that one misbehaving process does not keep the pool on the Ray path.)
* the client checks the server's peer credentials (same uid, and the pid the pool learned from the
  worker through Ray), then proves knowledge of the per-pool secret (HMAC-SHA256 over the
  transcript: both nonces, the server's idle timeout, and both endpoints' pids as the kernel reports
  them) and requires the server to prove it too. A process without the secret (another Ray job, a
  sidecar, an impostor on a dead worker's name) is dropped before it sees a byte of a request.
* Channel binding: the transcript names the server pid the client's kernel sees and the client pid
  the server's kernel sees, and each end checks that these are itself. A process that relays the
  handshake between the pool and a live worker (holding a dead worker's pid) is a third pid on both
  sockets, so the worker refuses the client's proof. Keys for each direction are derived from the
  secret and the transcript (HMAC-SHA256 as a KDF), and each frame carries HMAC-SHA256(key,
  sequence number || header || body): a frame that was altered, replayed, reordered, dropped or
  sent by anyone but the other end of this handshake ends the connection.

Bounds: frames over ``max_frame`` bytes end the connection (both directions); the whole handshake
has one deadline of ``handshake_timeout_s`` (a peer that drips bytes gains nothing), an idle
connection ``idle_timeout_s``; ``close()`` stops accepting and closes every open connection.

Idle connections: the server closes a connection idle for ``idle_timeout_s`` and says how long
that is in its hello. The client reconnects before sending on a connection idle for half of that or
closed by the peer, so an idle close never costs a request; a request that could not be sent at all
raises :class:`ChannelNotSent` (it was not applied, so any call may be re-sent through Ray). A
connection lost after the request left is :class:`ChannelClosed` and the pool never guesses: it
asks Ray whether the actor lives (``actors/transport.py``).
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
import time
import uuid
from typing import Any, Callable, Optional

from delta_ray._core.errors import DeltaRayError

from . import channel_codec as codec
from .channel_codec import (
    HEADER,
    KIND_ERROR,
    KIND_REQUEST,
    KIND_TUPLE,
    KIND_VALUE,
    MAX_FRAME,
    FrameError,
    answer_frame,
    decode_values,
    encode_values,
    error_frame,
    frame,
    parse_header,
    raise_error,
)

HELLO = b"DRH2"
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_NONCE = 32
_MAC = hashlib.sha256().digest_size
_TAG = _MAC  # per-frame HMAC-SHA256
_IDLE = struct.Struct("!I")  # the server's idle timeout in ms, in its hello

MAX_CONNECTIONS = 32
MAX_PENDING = 8  # of those, connections still in their handshake
HANDSHAKE_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 600.0
RECONNECT_BACKOFF_S = 1.0  # after a failed connect, calls go through Ray this long before retrying

class ChannelClosed(DeltaRayError, ConnectionError):
    """The worker's end of the channel went away (the actor most likely died), or it failed to
    authenticate: either way the pool falls back to Ray. The request may have reached the worker."""


class ChannelNotSent(ChannelClosed):
    """No connection could be made (or it was found closed) before the request left this process:
    the worker did not see it, so re-sending it another way cannot apply it twice."""


class ChannelAuthError(ChannelNotSent):
    """The peer did not prove the pool secret, or is not the process the pool was told about.
    Raised during the handshake, before any request is sent; the client stays closed."""


def supported() -> bool:
    """Abstract-namespace Unix sockets and SO_PEERCRED are Linux features."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_PEERCRED")


def new_secret() -> bytes:
    """A per-pool secret (handed to workers through Ray, never over the channel)."""
    return secrets.token_bytes(32)


def _peer(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, as the kernel recorded it at connect/listen."""
    pid, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return pid, uid


def _recv_exactly(conn: socket.socket, n: int, deadline: float) -> bytes:
    """n bytes before ``deadline`` (monotonic), however the peer spreads them."""
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("handshake deadline passed")
        conn.settimeout(left)
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed during the handshake")
        buf += chunk
    return bytes(buf)


# -- server ---------------------------------------------------------------------------------------
class ChannelServer:
    """Worker side: serve ``handler(method, args)`` to authenticated same-user peers.

    ``handler`` must be thread-safe against the actor's own Ray method calls (the worker holds one
    lock around its tokenizer for both). ``methods`` is the whitelist, checked before the handler.
    """

    def __init__(self, handler: Callable[[str, tuple], Any], secret: bytes, *, methods: frozenset[str] | None = None,
                 max_frame: int = MAX_FRAME, max_connections: int = MAX_CONNECTIONS, max_pending: int = MAX_PENDING,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S, idle_timeout_s: float = IDLE_TIMEOUT_S):
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise ValueError("the channel secret must be at least 16 random bytes")
        if not 1 <= max_pending <= max_connections:
            raise ValueError(f"max_pending must be between 1 and max_connections ({max_connections}), "
                             f"got {max_pending!r}")
        if not 0 < idle_timeout_s < 2 ** 32 / 1000:
            raise ValueError(f"idle_timeout_s must be positive and under 49 days, got {idle_timeout_s!r}")
        self._handler = handler
        self._secret = secret
        self._methods = methods
        self.max_frame = max_frame
        self.max_connections = max_connections
        self.max_pending = max_pending
        self.handshake_timeout_s = handshake_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.address = "\0delta-ray-" + uuid.uuid4().hex
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(64)
        self._conns: set[socket.socket] = set()
        self._pending: dict[socket.socket, int] = {}  # in their handshake, oldest first -> the peer's pid
        self._conns_lock = threading.Lock()
        self.closed = False
        self.rejected = 0
        self.evicted = 0  # handshakes closed to make room for a newer connection
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
                pid, uid = _peer(conn)
            except OSError:  # the peer left already: keep accepting others
                conn.close()
                continue
            with self._conns_lock:
                admitted = uid == os.getuid() and not self.closed and self._make_room()
                if admitted:
                    self._conns.add(conn)
                    self._pending[conn] = pid
                else:
                    self.rejected += 1
                    conn.close()
                    continue
            threading.Thread(target=self._serve, args=(conn, pid), name="delta-ray-channel-conn", daemon=True).start()

    def _make_room(self) -> bool:
        """Whether one more connection fits, after closing a handshake if the slots are full (the
        oldest of the peer holding the most handshakes); False when every slot is authenticated.
        Called with the lock held."""
        if len(self._pending) < self.max_pending and len(self._conns) < self.max_connections:
            return True
        if not self._pending:
            return False
        held: dict[int, int] = {}
        for pid in self._pending.values():
            held[pid] = held.get(pid, 0) + 1
        most = max(held.values())
        victim = next(c for c, pid in self._pending.items() if held[pid] == most)  # oldest first
        del self._pending[victim]
        self._conns.discard(victim)
        self.evicted += 1
        try:
            victim.shutdown(socket.SHUT_RDWR)  # its thread's recv returns; the thread closes it
        except OSError:
            pass
        return True

    def _handshake(self, conn: socket.socket, client_pid: int) -> codec.FrameKeys | None:
        """The server's side of the handshake, all of it before one deadline; None if refused."""
        deadline = time.monotonic() + self.handshake_timeout_s
        hello = HELLO + secrets.token_bytes(_NONCE) + _IDLE.pack(max(1, int(self.idle_timeout_s * 1000)))
        conn.settimeout(self.handshake_timeout_s)
        conn.sendall(hello)
        got = _recv_exactly(conn, _NONCE + _MAC, deadline)
        nonce_c, mac = got[:_NONCE], got[_NONCE:]
        transcript = codec.transcript(hello, nonce_c, os.getpid(), client_pid)
        if not hmac.compare_digest(mac, codec.mac(self._secret, b"client", transcript)):
            return None  # no secret, or a relay: the client saw another server pid than ours
        with self._conns_lock:
            if self._pending.pop(conn, None) is None:
                return None  # evicted meanwhile: its slot went to a newer connection
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        conn.settimeout(left)
        conn.sendall(codec.mac(self._secret, b"server", transcript))
        conn.settimeout(self.idle_timeout_s)
        return codec.FrameKeys(self._secret, transcript, server=True)

    def _serve(self, conn: socket.socket, client_pid: int) -> None:
        try:
            with conn:
                try:
                    keys = self._handshake(conn, client_pid)
                except OSError:  # silent, slow or gone before proving anything
                    keys = None
                if keys is None:
                    self.rejected += 1
                    return
                with conn.makefile("rb") as reader:
                    self._serve_frames(conn, reader, keys)
        except (OSError, FrameError, ValueError):  # a broken frame, a timeout: this connection ends
            return
        finally:
            with self._conns_lock:
                self._conns.discard(conn)
                self._pending.pop(conn, None)

    def _serve_frames(self, conn: socket.socket, reader, keys: codec.FrameKeys) -> None:
        while not self.closed:
            header = reader.read(HEADER.size)
            if len(header) < HEADER.size:
                return
            kind, size = parse_header(header, self.max_frame)
            if kind != KIND_REQUEST:
                return
            rest = reader.read(size + _TAG)  # the body and its tag in one read
            if len(rest) < size + _TAG:
                return
            body = memoryview(rest)[:size]
            keys.check(header, body, rest[size:])  # before decoding a byte of it
            values = decode_values(body)
            del body, rest
            if not values or not isinstance(values[0], str):
                return
            method, args = values[0], values[1:]
            try:
                if self._methods is not None and method not in self._methods:
                    raise ValueError(f"{method!r} is not served over the side channel")
                data = answer_frame(self._handler(method, args))
            except Exception as exc:  # noqa: BLE001 - the caller gets it, as from a Ray call
                data = error_frame(exc)
            if len(data) - HEADER.size > self.max_frame:
                data = error_frame(RuntimeError("the answer is over the side channel's frame cap"))
            tag = keys.seal(data)
            if len(data) < 65536:
                conn.sendall(data + tag)
            else:  # no copy of a large answer
                conn.sendall(data)
                conn.sendall(tag)

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
    """Pool side: an authenticated connection to one worker, used from the pool's event loop.

    ``expected_pid`` is the worker's pid as Ray reported it: a server with another pid (an
    impostor that bound a dead worker's name) is refused before anything is sent. Calls are
    serialized per connection. The connection is made on first use and made again, before a
    request is sent, when the server closed it or it has been idle for half the server's idle
    timeout. Failures: :class:`ChannelNotSent` (the request never left; after a failed connect,
    :attr:`usable` is False for ``reconnect_backoff_s``), :class:`ChannelAuthError` (the peer is
    not the worker; the client stays closed), :class:`ChannelClosed` (lost after sending).
    """

    def __init__(self, address: str, secret: bytes, *, expected_pid: int | None = None, max_frame: int = MAX_FRAME,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S, reconnect_backoff_s: float = RECONNECT_BACKOFF_S):
        self.address = address
        self._secret = secret
        self.expected_pid = expected_pid
        self.max_frame = max_frame
        self.handshake_timeout_s = handshake_timeout_s
        self.reconnect_backoff_s = reconnect_backoff_s
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._keys: codec.FrameKeys | None = None
        self._lock: Optional[asyncio.Lock] = None
        self._reuse_s = IDLE_TIMEOUT_S / 2  # replaced by half the server's idle timeout on connect
        self._last_used = 0.0
        self._retry_at = 0.0
        self.connects = 0  # connections made (tests, metrics)
        self.closed = False  # closed for good (by close() or a failed authentication)

    @property
    def usable(self) -> bool:
        """Not closed, and not backing off after a failed connect."""
        return not self.closed and time.monotonic() >= self._retry_at

    async def _connect(self) -> None:
        reader, writer = await asyncio.open_unix_connection(self.address, limit=2 ** 20)
        self._reader, self._writer = reader, writer
        pid, uid = _peer(writer.get_extra_info("socket"))
        if uid != os.getuid() or (self.expected_pid is not None and pid != self.expected_pid):
            raise ChannelAuthError(f"the process behind {self.address[1:]!r} (pid {pid}, uid {uid}) is not "
                                   f"the worker (pid {self.expected_pid})")
        hello = await reader.readexactly(len(HELLO) + _NONCE + _IDLE.size)
        if hello[:len(HELLO)] != HELLO:
            raise ChannelAuthError("not a delta-ray channel (or another version of it)")
        nonce_c = secrets.token_bytes(_NONCE)
        transcript = codec.transcript(hello, nonce_c, pid, os.getpid())
        writer.write(nonce_c + codec.mac(self._secret, b"client", transcript))
        proof = await reader.readexactly(_MAC)
        if not hmac.compare_digest(proof, codec.mac(self._secret, b"server", transcript)):
            raise ChannelAuthError("the worker did not prove the pool secret")
        self._keys = codec.FrameKeys(self._secret, transcript, server=False)
        idle_s = _IDLE.unpack_from(hello, len(HELLO) + _NONCE)[0] / 1000
        self._reuse_s = idle_s / 2
        self._last_used = asyncio.get_running_loop().time()
        self.connects += 1

    def _stale(self, now: float) -> bool:
        """The connection must not carry a request: the server closed it, or may be about to."""
        return (self._reader.at_eof() or self._writer.is_closing()
                or now - self._last_used >= self._reuse_s)

    async def _ensure_connected(self) -> None:
        loop = asyncio.get_running_loop()
        if self._writer is not None and self._stale(loop.time()):
            self._disconnect()
        if self._writer is not None:
            return
        try:
            await asyncio.wait_for(self._connect(), self.handshake_timeout_s)
        except ChannelAuthError:
            self.close()
            raise
        except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.TimeoutError, struct.error) as exc:
            self._disconnect()
            self._retry_at = time.monotonic() + self.reconnect_backoff_s
            raise ChannelNotSent(f"channel {self.address[1:]!r}: could not connect: {exc!r}") from exc
        except BaseException:  # cancelled during the handshake: nothing was sent
            self._disconnect()
            raise

    async def call(self, method: str, args: tuple) -> Any:
        """Run ``method(*args)`` on the worker; its exception is raised here as it was there."""
        if self.closed:
            raise ChannelNotSent(f"channel {self.address[1:]!r} is closed")
        if self._lock is None:
            self._lock = asyncio.Lock()
        request = frame(KIND_REQUEST, encode_values((method, *args)))
        async with self._lock:
            if self.closed:
                raise ChannelNotSent(f"channel {self.address[1:]!r} is closed")
            loop = asyncio.get_running_loop()
            if self._writer is None or self._stale(loop.time()):  # else no coroutine to enter
                await self._ensure_connected()
            try:
                tag = self._keys.seal(request)
                if len(request) < 65536:  # one send for a small request; no copy of a large one
                    self._writer.write(request + tag)
                else:
                    self._writer.write(request)
                    self._writer.write(tag)
                del request
                header = await self._reader.readexactly(HEADER.size)
                kind, size = parse_header(header, self.max_frame)
                rest = memoryview(await self._reader.readexactly(size + _TAG))
                body = rest[:size]
                self._keys.check(header, body, rest[size:])
                values = decode_values(body)
            except FrameError as exc:  # an answer that is malformed or not from the worker
                self.close()
                raise ChannelClosed(f"channel {self.address[1:]!r} closed: {exc}") from exc
            except (OSError, EOFError, asyncio.IncompleteReadError, struct.error) as exc:
                self._disconnect()
                raise ChannelClosed(f"channel {self.address[1:]!r} closed: {exc!r}") from exc
            except BaseException:  # e.g. cancelled mid-frame: the stream is out of step now
                self._disconnect()
                raise
            self._last_used = loop.time()
        if kind == KIND_ERROR:
            raise_error(values)
        if kind == KIND_TUPLE:
            return values
        if kind == KIND_VALUE and len(values) == 1:
            return values[0]
        self.close()
        raise ChannelClosed(f"channel {self.address[1:]!r}: unexpected answer kind {kind}")

    def _disconnect(self) -> None:
        """Drop the connection; the next call makes a new one."""
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
        self._keys = None

    def close(self) -> None:
        """Close for good: every later call raises :class:`ChannelNotSent`."""
        self.closed = True
        self._disconnect()
