"""The same-node side channel: frames, errors, peers, and the pool's behaviour when it breaks."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from delta_ray.actors import worker_channel
from delta_ray.actors.channel_codec import RemoteError
from delta_ray.actors.worker_channel import ChannelClient, ChannelClosed, ChannelServer

pytestmark = pytest.mark.skipif(not worker_channel.supported(), reason="Linux abstract sockets only")

SECRET = b"s" * 32


class _Custom(Exception):
    pass


def _handler(method: str, args: tuple):
    if method == "echo":
        return args
    if method == "fail":
        raise KeyError(args[0])
    if method == "custom":
        raise _Custom("boom")
    raise ValueError(method)


def _until(cond, what: str, timeout_s: float = 30.0) -> None:
    """Poll ``cond`` until it holds (a loaded machine is slow, never wrong); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.02)


async def _until_async(cond, what: str, timeout_s: float = 30.0) -> None:
    """:func:`_until` on an event loop that keeps running (it sees the sockets' events meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        await asyncio.sleep(0.02)


def ChannelServer_(handler=_handler, **kw):  # noqa: N802 - the server under test, with the test secret
    return ChannelServer(handler, SECRET, **kw)


def Client(address, secret=SECRET, **kw):  # noqa: N802
    return ChannelClient(address, secret, **kw)


def _run(coro):
    return asyncio.run(coro)


def test_round_trip_and_errors():
    server = ChannelServer_()
    try:
        async def main():
            client = Client(server.address)
            big = "x" * 3_000_000  # larger than any stream buffer
            ids = np.arange(100_000, dtype=np.int32)
            got = await client.call("echo", (1, "a", big, None, True, ids))
            assert got[:5] == (1, "a", big, None, True) and np.array_equal(got[5], ids)
            with pytest.raises(KeyError, match="k"):
                await client.call("fail", ("k",))
            with pytest.raises(RemoteError, match="_Custom: boom"):  # unknown types never travel as objects
                await client.call("custom", ())
            assert await client.call("echo", (2,)) == (2,)  # errors leave the connection usable
            client.close()
            with pytest.raises(ChannelClosed):
                await client.call("echo", (3,))
        _run(main())
    finally:
        server.close()


def test_concurrent_calls_on_one_client_are_serialized():
    server = ChannelServer_()
    try:
        async def main():
            client = Client(server.address)
            got = await asyncio.gather(*(client.call("echo", (i,)) for i in range(50)))
            assert got == [(i,) for i in range(50)]
        _run(main())
    finally:
        server.close()


def test_unreachable_or_vanished_server_raises_channel_closed():
    async def main():
        with pytest.raises(ChannelClosed):
            await Client("\0delta-ray-nobody-listens").call("echo", ())
    _run(main())

    server = ChannelServer_()

    async def vanish():
        client = Client(server.address)
        assert await client.call("echo", (1,)) == (1,)
        # The connection's serving thread ends when the peer closes; simulate the worker dying by
        # closing the listening socket and the client's transport from the far side.
        server.close()
        client._writer.transport.abort()
        with pytest.raises(worker_channel.ChannelNotSent):  # found closed: the request never left
            await client.call("echo", (2,))
        assert not client.usable  # backs off (the pool uses Ray meanwhile), then tries again
    _run(vanish())


@pytest.mark.ray
def test_pool_session_calls_use_the_channel_and_survive_losing_it(ray_session, tokenizer_paths, references,
                                                                  real_texts):
    from delta_ray import SessionNotFound, TokenizerPool

    ref = references["qwen-3"]
    text = real_texts["code"][:20_000]
    with TokenizerPool(tokenizer_paths["qwen-3"], num_workers=2) as pool:
        channels = pool._orch.transport.channels  # the side-channel transport's clients
        assert set(channels) == set(pool._workers)  # one node: every worker has a channel
        assert pool.encode(text, session="a").to_pylist() == ref.encode(text).ids
        text += "\nmore"
        assert pool.extend("a", "\nmore").to_pylist() == ref.encode(text).ids
        home = pool.home_of("a")

        async def broken(method, args):
            raise ChannelClosed("simulated: the connection dropped")
        # An extend whose connection drops may or may not have been applied: the pool must not
        # guess, so the caller is told to send the whole text, and that text is then exact.
        channels[home].call = broken
        with pytest.raises(SessionNotFound, match="connection"):
            pool.extend("a", " and more")
        text += " and more"
        assert pool.encode(text, session="a").to_pylist() == ref.encode(text).ids  # re-run through Ray
        # A whole-text call over a dropped channel is simply re-run through Ray.
        other = next(w for w in channels if w != home)
        channels[other].call = broken
        key = next(f"k{i}" for i in range(1000) if pool.home_of(f"k{i}") == other)
        assert pool.encode(text, session=key).to_pylist() == ref.encode(text).ids
        # The clients stay: once the connection works again the channel carries the calls again.
        del channels[home].call, channels[other].call
        used = channels[home]._last_used
        text += " again"
        assert pool.extend("a", " again").to_pylist() == ref.encode(text).ids
        assert channels[home]._last_used > used  # answered over the channel


def test_a_broken_frame_ends_only_its_connection():
    server = ChannelServer_()
    try:
        raw = _authenticated_raw(server.address)
        raw.send_frame(1, b"\x09garbage")  # an unknown value type, correctly tagged
        assert raw.sock.recv(1) == b""  # the server closed this connection
        raw.sock.close()

        async def main():
            assert await Client(server.address).call("echo", (1,)) == (1,)
        _run(main())
    finally:
        server.close()


# -- the attack suite: each fails against the pickle channel with a uid check only -----------------
class _Raw:
    """A blocking socket that has done the handshake with ``secret``, and sends tagged frames."""

    def __init__(self, address, secret=SECRET):
        import os
        import socket

        from delta_ray.actors.channel_codec import FrameKeys as _FrameKeys
        from delta_ray.actors.channel_codec import mac as _mac
        from delta_ray.actors.channel_codec import transcript as _transcript
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.settimeout(10)
        raw.connect(address)
        hello = b""
        while len(hello) < 40:
            chunk = raw.recv(40 - len(hello))
            if not chunk:
                raise ConnectionError("closed during hello")
            hello += chunk
        assert hello[:4] == b"DRH2"
        nonce_c = os.urandom(32)
        transcript = _transcript(hello, nonce_c, os.getpid(), os.getpid())  # server in this process
        raw.sendall(nonce_c + _mac(secret, b"client", transcript))
        proof = raw.recv(32)
        if len(proof) != 32:
            raise ConnectionError("not authenticated")
        self.sock, self.keys = raw, _FrameKeys(secret, transcript, server=False)

    def send_frame(self, kind, body, *, magic=b"DRC2", size=None):
        import struct
        data = struct.pack("!4sBI", magic, kind, len(body) if size is None else size) + body
        self.sock.sendall(data + self.keys.seal(data))


def _authenticated_raw(address, secret=SECRET):
    return _Raw(address, secret)


def _recording_handler():
    calls = []

    def handler(method, args):
        calls.append((method, args))
        return "ok"
    return handler, calls


def test_an_impostor_on_a_dead_workers_name_gets_nothing():
    """A worker dies; another process binds its abstract name. The pool's client refuses it before
    sending any request text (wrong pid and no secret), and never unpickles anything from it."""
    real = ChannelServer_()
    address = real.address
    pid_of_real = __import__("os").getpid()
    real.close()
    import socket
    impostor_calls = []
    imp = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def bound() -> bool:  # the freed name
        try:
            imp.bind(address)
            return True
        except OSError:
            return False
    _until(bound, "binding the freed name")
    imp.listen(4)

    def serve():
        try:
            conn, _ = imp.accept()
            conn.settimeout(5)
            conn.sendall(b"DRH2" + b"\0" * 36)
            data = conn.recv(1 << 16)
            impostor_calls.append(data)
            conn.sendall(b"\0" * 32)  # it cannot make the server proof
            impostor_calls.append(conn.recv(1 << 16))
            conn.close()
        except OSError:
            pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()

    async def main():
        client = Client(address, expected_pid=pid_of_real)
        with pytest.raises(ChannelClosed):
            await client.call("encode_session", ("tenant-secret-session", "the tenant's private text", None))
    _run(main())
    t.join(5)
    imp.close()
    assert all(b"private text" not in d for d in impostor_calls)


def test_a_server_with_another_secret_is_refused():
    """Secrets differ: whichever end checks first hangs up; no request is served or sent."""
    handler, calls = _recording_handler()
    other = ChannelServer(handler, b"o" * 32)
    try:
        async def main():
            with pytest.raises(ChannelClosed):
                await Client(other.address).call("echo", ("private",))
        _run(main())
    finally:
        other.close()
    assert calls == [] and other.rejected == 1


def test_a_wrong_peer_pid_is_refused():
    server = ChannelServer_()
    try:
        async def main():
            with pytest.raises(worker_channel.ChannelAuthError, match="pid"):
                await Client(server.address, expected_pid=1).call("echo", (1,))
        _run(main())
    finally:
        server.close()


def test_a_same_uid_client_without_the_secret_runs_nothing(tmp_path):
    """Any same-uid process (another Ray job, a sidecar) can connect; without the secret its frames,
    pickles included, are never read."""
    import pickle
    import socket
    import struct
    handler, calls = _recording_handler()
    server = ChannelServer_(handler)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))
    try:
        with pytest.raises((ConnectionError, OSError)):
            _authenticated_raw(server.address, secret=b"x" * 32)
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.settimeout(5)
        raw.connect(server.address)
        body = pickle.dumps(("encode_session", (Evil(),)))
        raw.sendall(b"\0" * 64 + struct.pack("!Q", len(body)) + body)
        try:
            raw.recv(100)
        except OSError:
            pass
        raw.close()
        # even an authenticated peer's pickle is only bytes of an unknown value type
        raw = _authenticated_raw(server.address)
        raw.send_frame(1, body)
        assert raw.sock.recv(1) == b""
        raw.sock.close()
    finally:
        server.close()
    assert not marker.exists() and calls == []


def test_oversized_frames_end_the_connection_without_reading_them():
    import resource
    import struct
    server = ChannelServer_(max_frame=1 << 20)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        raw = _authenticated_raw(server.address).sock
        raw.sendall(struct.pack("!4sBI", b"DRC2", 1, (1 << 30)))  # a 1 GiB length header
        try:
            raw.sendall(b"\0" * (8 << 20))  # and a stream behind it
        except OSError:
            pass  # the server hung up, as it should
        raw.settimeout(5)
        try:
            assert raw.recv(1) == b""
        except ConnectionResetError:
            pass
        raw.close()
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        assert grown_mb < 64

        async def main():  # the client side caps answers too
            client = Client(server.address, max_frame=100)
            with pytest.raises(ChannelClosed):
                await client.call("echo", ("y" * 1000,))
        _run(main())
    finally:
        server.close()


def test_an_idle_connection_flood_is_bounded():
    import socket
    server = ChannelServer_(max_connections=8, handshake_timeout_s=0.5)
    socks = []
    try:
        for _ in range(60):  # connect and say nothing
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(server.address)
            socks.append(s)
        end = time.monotonic() + 0.3
        while time.monotonic() < end:  # the cap holds throughout
            assert server.connections <= 8
            time.sleep(0.02)
        _until(lambda: server.connections == 0, "the handshake timeout freeing the slots")

        async def main():  # and a real client is served afterwards
            assert await Client(server.address).call("echo", (1,)) == (1,)
        _run(main())
    finally:
        for s in socks:
            s.close()
        server.close()


# -- handshake slots: a peer without the secret cannot keep the pool out (issue 47, item 7) ------------
def _silent(address: str, n: int) -> list:
    """``n`` connections that say nothing (a same-uid process without the secret)."""
    import socket
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(address)
        socks.append(s)
    return socks


def _closed_by_server(sock) -> bool:
    """The server closed ``sock`` (after its hello, if it sent one)."""
    sock.settimeout(10)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except OSError:  # a timeout: still open
        return False


def test_unauthenticated_connections_cannot_keep_the_pool_out():
    """Every slot held by a peer without the secret (that keeps reconnecting, so the handshake
    deadline never frees them for long): the pool still connects, evicting the oldest handshake."""
    server = ChannelServer_(max_connections=4, max_pending=4, handshake_timeout_s=60)
    socks = _silent(server.address, 4)
    try:
        _until(lambda: server.connections == 4, "the silent connections accepted")

        async def main():
            assert await Client(server.address).call("echo", (1,)) == (1,)
            assert server.connections == 4  # three silent ones and the pool's
        _run(main())
        assert server.evicted == 1 and _closed_by_server(socks[0])  # the oldest went
    finally:
        for s in socks:
            s.close()
        server.close()


def test_authenticated_connections_are_never_evicted():
    from delta_ray.actors.channel_codec import encode_values
    server = ChannelServer_(max_connections=4, max_pending=2, handshake_timeout_s=60)
    socks, pool = [], []
    try:
        pool = [_authenticated_raw(server.address) for _ in range(2)]
        socks = _silent(server.address, 20)
        _until(lambda: server.evicted == 18, "the flood evicting its own handshakes")
        for raw in pool:  # both still served
            raw.send_frame(1, encode_values(("echo", 7)))
            assert raw.sock.recv(1)
        assert server.connections == 4
        socks.append(_silent(server.address, 1)[0])  # every slot authenticated or in a handshake
        _until(lambda: server.evicted == 19, "the newest evicting the oldest handshake")
    finally:
        for s in socks:
            s.close()
        for raw in pool:
            raw.sock.close()
        server.close()


_FLOOD = r"""
import socket, sys, time
address = bytes.fromhex(sys.argv[1]).decode()
socks = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(address)
    socks.append(s)
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_flood_from_one_process_cannot_evict_another_process_handshake():
    """A handshake in progress (the pool's, here in this process) survives a flood of connections
    from one other process: each new connection evicts that process's own oldest handshake."""
    import os
    import subprocess
    import sys

    from delta_ray.actors.channel_codec import mac as _mac
    from delta_ray.actors.channel_codec import transcript as _transcript
    server = ChannelServer_(max_connections=8, max_pending=4, handshake_timeout_s=60)
    pending = _silent(server.address, 1)[0]
    pending.settimeout(10)
    hello = b""
    while len(hello) < 40:
        hello += pending.recv(40 - len(hello))
    proc = subprocess.Popen([sys.executable, "-c", _FLOOD, server.address.encode().hex(), "30"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        _until(lambda: server.evicted >= 30 - 3, "the flood's connections accepted")
        nonce = os.urandom(32)
        pending.sendall(nonce + _mac(SECRET, b"client", _transcript(hello, nonce, os.getpid(), os.getpid())))
        assert len(pending.recv(32)) == 32  # the server's proof: this handshake was never evicted
    finally:
        proc.stdin.close()
        proc.wait(30)
        pending.close()
        server.close()


def test_max_pending_is_checked():
    for bad in (0, 33):
        with pytest.raises(ValueError):
            ChannelServer_(max_pending=bad)


def test_close_stops_serving():
    import socket
    server = ChannelServer_()

    async def main():
        client = Client(server.address)
        assert await client.call("echo", (1,)) == (1,)
        server.close()
        with pytest.raises(ChannelClosed):
            await client.call("echo", (2,))
    _run(main())
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with pytest.raises(OSError):
        s.connect(server.address)
    s.close()


def test_values_round_trip_including_64_bit_versions():
    from delta_ray.actors.channel_codec import decode_values, encode_values
    vals = (2 ** 64 - 1, 2 ** 63, -2 ** 63, 0, "é\ud800x", None, False, np.arange(5, dtype=np.int32))
    out = decode_values(encode_values(vals))
    assert out[:7] == vals[:7] and np.array_equal(out[7], vals[7])
    with pytest.raises(TypeError):
        encode_values((object(),))


# -- channel binding: a relay between the pool and a live worker (issue 21, item 5) ----------------
_RELAY = r"""
import os, select, socket, sys
listen, target, capture, direction, old, new = sys.argv[1:7]
old, new = bytes.fromhex(old), bytes.fromhex(new)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(bytes.fromhex(listen))
srv.listen(1)
print("ready", flush=True)
a, _ = srv.accept()                       # the pool's client
b = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
b.connect(bytes.fromhex(target))          # the live worker
seen = bytearray()
peers = {a: b, b: a}
try:
    while True:
        r, _, _ = select.select([a, b], [], [], 20)
        if not r:
            break
        for s in r:
            data = s.recv(1 << 16)
            if not data:
                raise EOFError
            seen += data
            if old and ((direction == "c2s") == (s is a)):
                data = data.replace(old, new)  # tamper with what passes
            peers[s].sendall(data)
except (EOFError, OSError):
    pass
open(capture, "wb").write(bytes(seen))
"""


def _start_relay(tmp_path, target: str, direction: str = "", old: bytes = b"", new: bytes = b""):
    """A same-uid process on its own abstract name (as if it held a dead worker's name and pid)
    that relays bytes between a client and ``target``, recording them, optionally replacing
    ``old`` by ``new`` in one direction."""
    import subprocess
    import sys
    import uuid
    address = "\0delta-ray-relay-" + uuid.uuid4().hex
    capture = tmp_path / f"relay-{uuid.uuid4().hex}.bin"
    proc = subprocess.Popen([sys.executable, "-c", _RELAY, address.encode().hex(), target.encode().hex(),
                             str(capture), direction or "-", old.hex(), new.hex()], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    return proc, address, capture


def _relay_seen(proc, capture) -> bytes:
    proc.wait(30)
    return capture.read_bytes() if capture.exists() else b""


def test_a_relay_of_the_handshake_to_a_live_worker_is_refused(tmp_path):
    """A same-uid process holding a dead worker's pid relays the handshake between the pool and a
    live worker. Without channel binding both proofs pass through it and it reads every frame; the
    transcript names both pids, so the live worker refuses the client's proof."""
    handler, calls = _recording_handler()
    server = ChannelServer_(handler)
    try:
        proc, address, capture = _start_relay(tmp_path, server.address)

        async def main():
            client = Client(address, expected_pid=proc.pid)  # the pid the pool was told about
            with pytest.raises(ChannelClosed):
                await client.call("encode_session", ("tenant", "the tenant's private text", None))
            client.close()
        _run(main())
        seen = _relay_seen(proc, capture)
    finally:
        server.close()
    assert b"private text" not in seen and calls == []


@pytest.mark.parametrize("direction", ["c2s", "s2c"])
def test_frames_altered_in_flight_end_the_connection(tmp_path, monkeypatch, direction):
    """Defence in depth: even a relay that got through the handshake (here the pid binding is
    switched off) cannot change a request or an answer: every frame is authenticated with keys
    bound to this handshake and a sequence number."""
    from delta_ray.actors import channel_codec
    monkeypatch.setattr(channel_codec, "transcript", lambda hello, nonce_c, s, c: hello + nonce_c)
    handler, calls = _recording_handler()

    def echo(method, args):
        calls.append((method, args))
        return args
    server = ChannelServer_(echo)
    try:
        proc, address, capture = _start_relay(tmp_path, server.address, direction,
                                              b"pay 10 to alice", b"pay 99 to mally")

        async def main():
            client = Client(address, expected_pid=proc.pid)
            with pytest.raises(ChannelClosed):
                got = await client.call("echo", ("pay 10 to alice",))
                assert got == ("pay 10 to alice",)  # (what a successful tamper would break)
            client.close()
        _run(main())
        _relay_seen(proc, capture)
    finally:
        server.close()
    assert all(args == ("pay 10 to alice",) for _, args in calls)  # the server never ran a tampered one
    if direction == "c2s":
        assert calls == []


def test_a_replayed_or_reordered_frame_fails_its_check():
    from delta_ray.actors.channel_codec import FrameError
    from delta_ray.actors.channel_codec import FrameKeys as _FrameKeys
    sender = _FrameKeys(SECRET, b"transcript", server=False)
    receiver = _FrameKeys(SECRET, b"transcript", server=True)
    first, second = b"header-1body-1", b"header-2body-2"
    t1, t2 = sender.seal(first), sender.seal(second)
    with pytest.raises(FrameError):  # the second frame first
        receiver.check(second[:8], second[8:], t2)
    receiver.check(first[:8], first[8:], t1)
    with pytest.raises(FrameError):  # the first frame again
        receiver.check(first[:8], first[8:], t1)
    other = _FrameKeys(SECRET, b"another transcript", server=True)
    with pytest.raises(FrameError):  # another connection's keys
        other.check(first[:8], first[8:], t1)


# -- the handshake has one deadline (item 8) --------------------------------------------------------
def test_a_dripping_peer_is_cut_off_at_the_handshake_deadline():
    """A peer that sends one byte of its 64-byte answer every 0.1 s never trips a per-recv timeout
    of 0.5 s; the handshake's deadline cuts it off after about five bytes."""
    import select
    import socket
    server = ChannelServer_(handshake_timeout_s=0.5)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(server.address)
        s.settimeout(5)
        hello = b""
        while len(hello) < 40:
            hello += s.recv(40 - len(hello))
        sent = 0
        for _ in range(64):
            readable, _, _ = select.select([s], [], [], 0)
            try:
                if readable and s.recv(1) == b"":
                    break  # the server hung up
            except ConnectionResetError:
                break  # hung up with our unread bytes in its buffer: a reset, not an end of file
            try:
                s.sendall(b"\0")
            except OSError:
                break
            sent += 1
            time.sleep(0.1)
        assert sent < 40, "the server kept waiting for a dripping handshake"
    finally:
        s.close()
        server.close()


# -- idle connections are made again, not lost (item 3) ---------------------------------------------
@pytest.mark.parametrize("loop_saw_the_close", [True, False])
def test_a_connection_the_server_closed_for_idleness_is_made_again(loop_saw_the_close):
    """The server closes a connection idle for ``idle_timeout_s``; the next call must not fail
    (it reconnects before sending), whether or not the client's loop has seen the close yet."""
    server = ChannelServer_(idle_timeout_s=1.0)
    try:
        async def main():
            client = Client(server.address)
            assert await client.call("echo", (1,)) == (1,)
            closed = lambda: server.connections == 0  # noqa: E731
            if loop_saw_the_close:
                await _until_async(closed, "the server's idle close")
                await asyncio.sleep(0.1)  # a few loop turns: the client's reader sees the EOF
            else:
                _until(closed, "the server's idle close")  # the loop is blocked: it has not read the close
            assert await client.call("echo", (2,)) == (2,)
            assert client.connects == 2
            assert await client.call("echo", (3,)) == (3,)  # and the new connection is reused
            assert client.connects == 2
            client.close()
        _run(main())
    finally:
        server.close()


class _FakeRay:
    """The Ray side of a ChannelTransport, in process: the workers' own services, always alive."""

    def __init__(self, services):
        self.services, self.calls = services, []

    async def call(self, wid, call):
        self.calls.append((wid, call.kind.method))
        return getattr(self.services[wid], call.kind.method)(*call.args)

    async def alive(self, wid):
        return True

    def retire(self, wid, *, kill):
        pass

    def close(self):
        pass


@pytest.fixture()
def channel_pool(tokenizer_paths):
    """An orchestrator whose one worker (an in-process WorkerService) is reached over a real side
    channel with a 0.3 s idle timeout, and through a fake Ray otherwise."""
    import os

    from delta_ray._core.config import PoolConfig, TokenizerConfig
    from delta_ray._core.loading import load_tokenizer
    from delta_ray._tokenizer_core import TokenizerCore
    from delta_ray.actors.calls import CHANNEL_METHODS
    from delta_ray.actors.orchestrator import PoolOrchestrator
    from delta_ray.actors.transport import ChannelTransport
    from delta_ray.actors.worker import WorkerService

    class NoMetrics:
        def __getattr__(self, name):
            return lambda *a, **k: None
    tok = TokenizerConfig(chunk_size=4096, cut_threshold=12_000, threads=1, engine="reference", shadow_rate=0.0)
    loaded = load_tokenizer(tokenizer_paths["llama3.2"])
    svc = WorkerService(TokenizerCore(loaded, tok), SECRET)
    server = ChannelServer(lambda m, a: getattr(svc, m)(*a), SECRET, methods=CHANNEL_METHODS, idle_timeout_s=0.3)
    client = ChannelClient(server.address, SECRET, expected_pid=os.getpid())
    ray_side = _FakeRay({"w0": svc})
    cfg = PoolConfig(tokenizer=tok, placement=False, request_timeout_s=10.0).resolved(2)
    loop = asyncio.new_event_loop()
    orch = PoolOrchestrator(TokenizerCore(loaded, tok), ChannelTransport(ray_side, {"w0": client}), ["w0"], cfg,
                            loop, SECRET, record=NoMetrics())
    yield orch, loop, server, client, ray_side
    client.close()
    server.close()
    loop.close()


def test_an_extend_after_an_idle_close_keeps_its_session(channel_pool, references, real_texts):
    """The audit's case: 10 idle minutes (here 0.3 s), the server closes the connection, and the
    next extend became SessionNotFound although it was never sent."""
    orch, loop, server, client, ray_side = channel_pool
    ref = references["llama3.2"]
    text = real_texts["english"][:6_000]
    assert orch.encode and loop.run_until_complete(orch.encode(text, "a", True)).to_pylist() == ref.encode(text).ids
    _until(lambda: server.connections == 0, "the server's idle close")
    text += " and after a pause"
    assert loop.run_until_complete(orch.extend("a", " and after a pause", True)).to_pylist() == ref.encode(text).ids
    assert ray_side.calls == [] and client.connects == 2  # over the channel, reconnected


def test_an_extend_the_channel_could_not_send_goes_through_ray(channel_pool, references, real_texts):
    """The worker lives but its channel is gone: the extend was never sent, so it is not a lost
    connection (which would drop the session): it goes through Ray and stays exact."""
    orch, loop, server, client, ray_side = channel_pool
    ref = references["llama3.2"]
    text = real_texts["english"][:6_000]
    assert loop.run_until_complete(orch.encode(text, "b", True)).to_pylist() == ref.encode(text).ids
    server.close()
    text += " once more"
    assert loop.run_until_complete(orch.extend("b", " once more", True)).to_pylist() == ref.encode(text).ids
    assert ray_side.calls == [("w0", "extend")]
    text += " and again"  # backing off: straight to Ray, no connect attempt
    assert loop.run_until_complete(orch.extend("b", " and again", True)).to_pylist() == ref.encode(text).ids
    assert ray_side.calls == [("w0", "extend")] * 2 and not client.closed


# -- the frame codec refuses instead of wrapping, and bounds decoding (item 15) ---------------------
def test_the_codec_refuses_values_it_would_wrap():
    from delta_ray.actors.channel_codec import decode_values, encode_values
    for bad in (np.array([2 ** 31], np.int64), np.array([-2 ** 31 - 1], np.int64), np.array([2 ** 32 - 1], np.uint32)):
        with pytest.raises(OverflowError):
            encode_values((bad,))
    with pytest.raises(TypeError):
        encode_values((np.array([1.5]),))
    for bad in (2 ** 64, -2 ** 63 - 1):
        with pytest.raises(OverflowError):
            encode_values((bad,))
    edge = np.array([-2 ** 31, 2 ** 31 - 1, 0], np.int64)  # in range: carried exactly
    assert np.array_equal(decode_values(encode_values((edge,)))[0], edge)
    assert decode_values(encode_values((2 ** 64 - 1, -2 ** 63))) == (2 ** 64 - 1, -2 ** 63)


def test_decoding_cannot_amplify_a_frame():
    """A 5 MB body of empty arrays would decode into a million numpy objects (about 100 bytes each);
    a frame holds at most MAX_VALUES values."""
    from delta_ray.actors.channel_codec import MAX_VALUES, FrameError, decode_values, encode_values
    body = b"\x05\0\0\0\0" * 1_000_000  # T_I32 with count 0
    with pytest.raises(FrameError, match="values"):
        decode_values(body)
    with pytest.raises(FrameError):
        decode_values(b"\0" * (MAX_VALUES + 1))  # Nones
    assert decode_values(b"\0" * MAX_VALUES) == (None,) * MAX_VALUES
    with pytest.raises(ValueError):
        encode_values((None,) * (MAX_VALUES + 1))
    with pytest.raises(FrameError):
        decode_values(b"\x04\0\0\0\x01\xff")  # not UTF-8: a FrameError, not a UnicodeDecodeError


def test_frame_tags_are_standard_hmac_sha256_of_sequence_and_frame():
    """The frame MAC runs on OpenSSL's HMAC object where available (C calls, not the hmac module's
    wrapper): its tags must be exactly HMAC-SHA256(direction key, seq || header || body)."""
    import hashlib
    import hmac
    import struct

    from delta_ray.actors.channel_codec import FrameKeys as _FrameKeys
    from delta_ray.actors.channel_codec import keyed_sha256
    key = b"\x07" * 32
    m = keyed_sha256(key).copy()
    m.update(b"abc")
    assert m.digest() == hmac.new(key, b"abc", hashlib.sha256).digest()
    sender = _FrameKeys(SECRET, b"transcript", server=False)
    prk = hmac.new(SECRET, b"delta-ray channel keys v2" + b"transcript", hashlib.sha256).digest()
    c2s = hmac.new(prk, b"client to server\x01", hashlib.sha256).digest()
    for seq, data in enumerate((b"header-1body-1", b"x" * 70_000)):
        want = hmac.new(c2s, struct.pack("!Q", seq) + data, hashlib.sha256).digest()
        assert sender.seal(data) == want
