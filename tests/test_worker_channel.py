"""The same-node side channel: frames, errors, peers, and the pool's behaviour when it breaks."""
from __future__ import annotations

import asyncio
import threading

import pytest

from actors import worker_channel
from actors.worker_channel import ChannelClient, ChannelClosed, ChannelServer

pytestmark = pytest.mark.skipif(not worker_channel.supported(), reason="Linux abstract sockets only")


class _Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("no pickling")


def _handler(method: str, args: tuple):
    if method == "echo":
        return args
    if method == "fail":
        raise KeyError(args[0])
    if method == "unpicklable":
        raise _Unpicklable()
    if method == "block":
        args[0].wait(10)
        return "unblocked"
    raise ValueError(method)


def _run(coro):
    return asyncio.run(coro)


def test_round_trip_and_errors():
    server = ChannelServer(_handler)
    try:
        async def main():
            client = ChannelClient(server.address)
            big = "x" * 3_000_000  # larger than any stream buffer
            assert await client.call("echo", (1, "a", big)) == (1, "a", big)
            with pytest.raises(KeyError, match="k"):
                await client.call("fail", ("k",))
            with pytest.raises(RuntimeError, match="not picklable"):
                await client.call("unpicklable", ())
            assert await client.call("echo", (2,)) == (2,)  # errors leave the connection usable
            client.close()
            with pytest.raises(ChannelClosed):
                await client.call("echo", (3,))
        _run(main())
    finally:
        server.close()


def test_concurrent_calls_on_one_client_are_serialized():
    server = ChannelServer(_handler)
    try:
        async def main():
            client = ChannelClient(server.address)
            got = await asyncio.gather(*(client.call("echo", (i,)) for i in range(50)))
            assert got == [(i,) for i in range(50)]
        _run(main())
    finally:
        server.close()


def test_unreachable_or_vanished_server_raises_channel_closed():
    async def main():
        with pytest.raises(ChannelClosed):
            await ChannelClient("\0delta-ray-nobody-listens").call("echo", ())
    _run(main())

    server = ChannelServer(_handler)

    async def vanish():
        client = ChannelClient(server.address)
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
        assert set(pool._channels) == set(pool._workers)  # one node: every worker has a channel
        assert pool.encode(text, session="a").to_pylist() == ref.encode(text).ids
        text += "\nmore"
        assert pool.extend("a", "\nmore").to_pylist() == ref.encode(text).ids
        home = pool._dispatcher.home_of("a")

        async def broken(method, args):
            raise ChannelClosed("simulated: the connection dropped")
        # An extend whose connection drops may or may not have been applied: the pool must not
        # guess, so the caller is told to send the whole text, and that text is then exact.
        pool._channels[home].call = broken
        with pytest.raises(SessionNotFound, match="connection"):
            pool.extend("a", " and more")
        assert home not in pool._channels  # that worker is now served through Ray
        text += " and more"
        assert pool.encode(text, session="a").to_pylist() == ref.encode(text).ids
        # A whole-text call over a dropped channel is simply re-run through Ray.
        other = next(w for w in pool._channels)
        pool._channels[other].call = broken
        key = next(f"k{i}" for i in range(1000) if pool._dispatcher.home_of(f"k{i}") == other)
        assert pool.encode(text, session=key).to_pylist() == ref.encode(text).ids
        assert not pool._channels


def test_a_broken_frame_ends_only_its_connection():
    import socket
    import struct

    server = ChannelServer(_handler)
    try:
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.connect(server.address)
        raw.sendall(struct.pack("!Q", 5) + b"\x80garbage")  # not a pickle
        raw.settimeout(10)
        assert raw.recv(1) == b""  # the server closed this connection
        raw.close()

        async def main():
            assert await ChannelClient(server.address).call("echo", (1,)) == (1,)
        _run(main())
    finally:
        server.close()
