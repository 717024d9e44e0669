"""The ASGI app both hosts run, driven with ASGI messages (no server, no Ray): routing below a
mount point, the lifespan protocol, a client that leaves mid-body."""
from __future__ import annotations

import asyncio
import json

import pytest

from delta_ray.server.asgi import TokenizerASGI


class _Handler:
    """Records what the app hands the handler; answers like RequestHandler.http."""

    def __init__(self):
        self.calls = []

    async def http(self, endpoint, content_length, chunks):
        try:
            body = b"".join([c async for c in chunks])
        except Exception as exc:  # noqa: BLE001 - what the real handler turns into a status
            self.calls.append((endpoint, content_length, repr(exc)))
            return getattr(exc, "status", 500), b"{}", {}
        self.calls.append((endpoint, content_length, body))
        return 200, b'{"ok":true}', {"x-delta-ray-session": "-"}


def _run(app, scope, messages):
    sent = []
    inbox = list(messages)

    async def receive():
        return inbox.pop(0)

    async def send(message):
        sent.append(message)
    asyncio.run(app(scope, receive, send))
    return sent


def _http(path, method="POST", root_path="", headers=()):
    return {"type": "http", "method": method, "path": path, "root_path": root_path, "headers": list(headers)}


def test_routes_below_the_mount_point_and_streams_the_body():
    h = _Handler()
    app = TokenizerASGI(h, metrics=lambda: b"m 1\n")
    body = [{"type": "http.request", "body": b'{"prompt"', "more_body": True},
            {"type": "http.request", "body": b': "x"}', "more_body": False}]
    sent = _run(app, _http("/t/tokenize", root_path="/t", headers=[(b"content-length", b"15")]), body)
    assert sent[0]["status"] == 200 and (b"x-delta-ray-session", b"-") in sent[0]["headers"]
    assert h.calls == [("tokenize", "15", b'{"prompt": "x"}')]
    assert _run(app, _http("/detokenize"), body)[0]["status"] == 200 and h.calls[-1][0] == "detokenize"
    assert _run(app, _http("/health", "GET"), [])[0]["status"] == 200
    sent = _run(app, _http("/metrics", "GET"), [])
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"m 1\n"
    sent = _run(app, _http("/tokenize", "GET"), [])
    assert sent[0]["status"] == 405 and json.loads(sent[1]["body"])["error"]["code"] == 405
    assert _run(app, _http("/elsewhere"), [])[0]["status"] == 404
    assert _run(TokenizerASGI(h), _http("/metrics", "GET"), [])[0]["status"] == 404  # Serve: Ray's export instead


def test_a_client_gone_mid_body_ends_the_request_with_499():
    h = _Handler()
    messages = [{"type": "http.request", "body": b'{"prompt": "', "more_body": True}, {"type": "http.disconnect"}]
    sent = _run(TokenizerASGI(h), _http("/tokenize"), messages)
    assert sent[0]["status"] == 499 and "closed the connection" in h.calls[0][2]


def test_lifespan_startup_and_shutdown_complete():
    sent = _run(TokenizerASGI(_Handler()), {"type": "lifespan"},
                [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_a_body_that_does_not_arrive_in_time_ends_the_request_with_408():
    """A client that sends its headers and then drips (or nothing) holds no request past the
    deadline: the wait ends in a 408, and the request's task is not left cancelled."""
    h = _Handler()
    sent, state = [], {}

    async def main():
        started = asyncio.get_running_loop().time()

        async def receive():
            if not state:
                state["first"] = True
                return {"type": "http.request", "body": b'{"prompt": "', "more_body": True}
            await asyncio.sleep(3600)  # the rest never comes

        async def send(message):
            sent.append(message)
        task = asyncio.current_task()  # the request's task: the app runs in it, as under uvicorn
        watchdog = asyncio.get_running_loop().call_later(10, task.cancel)  # no deadline: fail, not hang
        await TokenizerASGI(h, body_timeout_s=0.2)(_http("/tokenize"), receive, send)
        watchdog.cancel()
        state["elapsed"] = asyncio.get_running_loop().time() - started
        state["cancelling"] = task.cancelling() if hasattr(task, "cancelling") else 0  # Python 3.11+
        await asyncio.sleep(0)  # still runs: nothing left to cancel it
    asyncio.run(main())
    assert sent[0]["status"] == 408 and "did not arrive within 0.2 s" in h.calls[0][2]
    assert 0.2 <= state["elapsed"] < 2 and state["cancelling"] == 0


def test_a_body_deadline_that_passes_between_chunks_ends_the_next_wait():
    """Fired while the body was being handed on (not while waiting for it), the deadline cancels
    nothing: the next wait for a chunk ends in a 408 instead."""
    sent, chunks = [], iter([b'{"pro', b'mpt": "x"}'])

    async def main():
        async def receive():
            await asyncio.sleep(0)
            return {"type": "http.request", "body": next(chunks), "more_body": True}

        async def send(message):
            sent.append(message)

        class SlowHandler(_Handler):
            async def http(self, endpoint, content_length, stream):
                async def slow():
                    async for c in stream:
                        await asyncio.sleep(0.3)  # past the deadline, awaiting something else
                        yield c
                return await super().http(endpoint, content_length, slow())
        await TokenizerASGI(SlowHandler(), body_timeout_s=0.1)(_http("/tokenize"), receive, send)
    asyncio.run(main())
    assert sent[0]["status"] == 408


def test_a_body_timeout_must_be_positive():
    with pytest.raises(ValueError, match="body_timeout_s"):
        TokenizerASGI(_Handler(), body_timeout_s=0)
