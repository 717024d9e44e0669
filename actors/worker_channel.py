"""A same-node side channel to a worker actor for session calls, beside Ray's actor calls.

Why: a Ray actor call costs 1.4-2 ms here even for an empty method (measured: bench_pool and
``tests/test_worker_channel.py``), more than a 1.3K-character session repair itself. A Unix
socket round trip from the pool's event loop costs about 0.4 ms. Ray Compiled Graphs would be the
native answer, but their actor loop spins a full core while idle, which a tokenizer pool on a
serving node cannot afford.

What: the worker serves length-prefixed pickle frames on a Linux abstract-namespace Unix socket
(no file to clean up when the actor is killed), accepting only peers of its own user id
(SO_PEERCRED). A frame is ``(method, args)``; the answer is ``(True, result)`` or
``(False, exception)``. The pool uses it only for workers on its own node and only for session
calls; everything else, and every other node, goes through Ray. A dropped connection never makes
the pool guess: it falls back to Ray, which reports a dead actor the usual way (see
``actors/pool.py``).
"""
from __future__ import annotations

import asyncio
import os
import pickle
import socket
import struct
import sys
import threading
import uuid
from typing import Any, Callable, Optional

_HEADER = struct.Struct("!Q")
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class ChannelClosed(ConnectionError):
    """The worker's end of the channel went away (the actor most likely died)."""


def supported() -> bool:
    """Abstract-namespace Unix sockets and SO_PEERCRED are Linux features."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_PEERCRED")


def _frame(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


class ChannelServer:
    """Worker side: serve ``handler(method, args)`` to same-user peers, one thread per connection.

    ``handler`` must be thread-safe against the actor's own Ray method calls (the worker holds one
    lock around its tokenizer for both).
    """

    def __init__(self, handler: Callable[[str, tuple], Any]):
        self._handler = handler
        self.address = "\0delta-ray-" + uuid.uuid4().hex
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(64)
        threading.Thread(target=self._accept, name="delta-ray-channel", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            try:
                _, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            except OSError:  # the peer left already: keep accepting others
                conn.close()
                continue
            if uid != os.getuid():  # abstract sockets have no file permissions: check the peer
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="delta-ray-channel-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            while True:
                try:
                    header = reader.read(_HEADER.size)
                    if len(header) < _HEADER.size:
                        return
                    method, args = pickle.loads(reader.read(_HEADER.unpack(header)[0]))
                except Exception:  # noqa: BLE001 - a broken or truncated frame ends this connection only
                    return
                try:
                    answer = (True, self._handler(method, args))
                except Exception as exc:  # noqa: BLE001 - the caller gets it, as from a Ray call
                    answer = (False, exc)
                try:
                    data = _frame(answer)
                except Exception as exc:  # noqa: BLE001 - an unpicklable exception
                    data = _frame((False, RuntimeError(f"worker error (not picklable): {answer[1]!r}: {exc}")))
                try:
                    conn.sendall(data)
                except OSError:
                    return

    def close(self) -> None:
        self._sock.close()


class ChannelClient:
    """Pool side: one connection to one worker, used from the pool's event loop.

    Calls are serialized per connection (the dispatcher already runs one task per worker at a
    time); any transport failure raises :class:`ChannelClosed` and the client stays closed.
    """

    def __init__(self, address: str):
        self.address = address
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._lock: Optional[asyncio.Lock] = None
        self.closed = False

    async def call(self, method: str, args: tuple) -> Any:
        """Run ``method(*args)`` on the worker; its exception is raised here as it was there."""
        if self.closed:
            raise ChannelClosed(f"channel {self.address[1:]!r} is closed")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            try:
                if self._writer is None:
                    self._reader, self._writer = await asyncio.open_unix_connection(self.address, limit=2 ** 20)
                self._writer.write(_frame((method, args)))
                header = await self._reader.readexactly(_HEADER.size)
                ok, value = pickle.loads(await self._reader.readexactly(_HEADER.unpack(header)[0]))
            except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
                self.close()
                raise ChannelClosed(f"channel {self.address[1:]!r} closed: {exc!r}") from exc
            except BaseException:  # e.g. cancelled mid-frame: the stream is out of step now
                self.close()
                raise
        if not ok:
            raise value
        return value

    def close(self) -> None:
        self.closed = True
        if self._writer is not None:
            self._writer.close()
            self._writer = None
