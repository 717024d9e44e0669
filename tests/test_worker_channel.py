"""The same-node side channel: frames, errors, peers, and the pool's behaviour when it breaks."""
from __future__ import annotations

import asyncio
import threading

import pytest

import numpy as np

from delta_ray.actors import worker_channel
from delta_ray.actors.worker_channel import ChannelClient, ChannelClosed, ChannelServer, RemoteError

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
        with pytest.raises(ChannelClosed):
            await client.call("echo", (2,))
        assert client.closed
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
        assert home not in channels  # that worker is now served through Ray
        text += " and more"
        assert pool.encode(text, session="a").to_pylist() == ref.encode(text).ids
        # A whole-text call over a dropped channel is simply re-run through Ray.
        other = next(w for w in channels)
        channels[other].call = broken
        key = next(f"k{i}" for i in range(1000) if pool.home_of(f"k{i}") == other)
        assert pool.encode(text, session=key).to_pylist() == ref.encode(text).ids
        assert not channels


def test_a_broken_frame_ends_only_its_connection():
    import struct

    server = ChannelServer_()
    try:
        raw = _authenticated_raw(server.address)
        raw.sendall(struct.pack("!4sBI", b"DRC1", 1, 8) + b"\x09garbage")  # an unknown value type
        raw.settimeout(10)
        assert raw.recv(1) == b""  # the server closed this connection
        raw.close()

        async def main():
            assert await Client(server.address).call("echo", (1,)) == (1,)
        _run(main())
    finally:
        server.close()


# -- the attack suite: each fails against the pickle channel with a uid check only -----------------
def _authenticated_raw(address, secret=SECRET):
    """A blocking socket that has done the handshake with ``secret``."""
    import hashlib
    import hmac
    import os
    import socket
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.settimeout(10)
    raw.connect(address)
    hello = b""
    while len(hello) < 36:
        chunk = raw.recv(36 - len(hello))
        if not chunk:
            raise ConnectionError("closed during hello")
        hello += chunk
    assert hello[:4] == b"DRH1"
    nonce_c = os.urandom(32)
    raw.sendall(nonce_c + hmac.new(secret, b"client" + hello[4:] + nonce_c, hashlib.sha256).digest())
    proof = raw.recv(32)
    if len(proof) != 32:
        raise ConnectionError("not authenticated")
    return raw


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
    import time
    imp = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for _ in range(100):  # the freed name
        try:
            imp.bind(address)
            break
        except OSError:
            time.sleep(0.02)
    imp.listen(4)

    def serve():
        try:
            conn, _ = imp.accept()
            conn.settimeout(5)
            conn.sendall(b"DRH1" + b"\0" * 32)
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
        raw.sendall(struct.pack("!4sBI", b"DRC1", 1, len(body)) + body)
        assert raw.recv(1) == b""
        raw.close()
    finally:
        server.close()
    assert not marker.exists() and calls == []


def test_oversized_frames_end_the_connection_without_reading_them():
    import resource
    import struct
    server = ChannelServer_(max_frame=1 << 20)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        raw = _authenticated_raw(server.address)
        raw.sendall(struct.pack("!4sBI", b"DRC1", 1, (1 << 30)))  # a 1 GiB length header
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
    import time
    server = ChannelServer_(max_connections=8, handshake_timeout_s=0.5)
    socks = []
    try:
        for _ in range(60):  # connect and say nothing
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(server.address)
            socks.append(s)
        time.sleep(0.3)
        assert server.connections <= 8
        time.sleep(1.0)  # the handshake timeout frees the slots
        assert server.connections == 0

        async def main():  # and a real client is served afterwards
            assert await Client(server.address).call("echo", (1,)) == (1,)
        _run(main())
    finally:
        for s in socks:
            s.close()
        server.close()


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
    from delta_ray.actors.worker_channel import decode_values, encode_values
    vals = (2 ** 64 - 1, 2 ** 63, -2 ** 63, 0, "é\ud800x", None, False, np.arange(5, dtype=np.int32))
    out = decode_values(encode_values(vals))
    assert out[:7] == vals[:7] and np.array_equal(out[7], vals[7])
    with pytest.raises(TypeError):
        encode_values((object(),))
