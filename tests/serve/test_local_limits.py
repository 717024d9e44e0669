"""What a client may hold of the one-process server (``delta-ray serve --local``): connections, a
request head's bytes and time, body bytes in progress per client and in all. Each is set small on a
real server on a free loopback port, pushed past, and the server is shown to answer (503, 431, 408,
429) or close, and to go on serving a small request. The limits: ``server/http_limits.py`` (the
connection and the head, on uvicorn's protocol) and ``server/asgi.py`` (the body budget)."""
from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

HEAD_TIMEOUT_S = 1.0
LIMITS = {"max_connections": 4, "max_header_bytes": 4096, "header_timeout_s": HEAD_TIMEOUT_S, "keep_alive_s": 0.5,
          "max_body_bytes": 200_000, "max_client_inflight_bytes": 250_000, "max_inflight_bytes": 300_000}
SERVER = dict(LIMITS)  # what the server runs with (the same: a separate name to run the tests without a limit)


@pytest.fixture(scope="module", params=["httptools", "h11"])
def srv(request, tokenizer_paths):
    """The server with small limits, on each of uvicorn's HTTP/1.1 protocols ("auto" is httptools
    where installed, as here; h11 where it is not)."""
    from conftest import LocalThread
    s = LocalThread(tokenizer_paths["qwen-3"], http=request.param, **SERVER)
    s.protocol = request.param
    yield s
    s.stop()


def _settled(srv, timeout=5.0):
    """Wait until the server holds no connection and no body byte (those of earlier tests closed)."""
    app, state = srv.server.config.app, srv.server.server_state
    deadline = time.monotonic() + timeout
    while state.connections or app.budget.held:
        assert time.monotonic() < deadline, (len(state.connections), app.budget.held)
        time.sleep(0.01)


def _read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes (a reset after its answer counts as a close)."""
    out = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not data:
            return out
        out += data


def _tokenize(srv, body: bytes, source: str = "127.0.0.1", chunked: bool = False) -> "tuple[int, dict]":
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30, source_address=(source, 0))
    try:
        if chunked:
            conn.putrequest("POST", "/tokenize")
            conn.putheader("content-type", "application/json")
            conn.putheader("transfer-encoding", "chunked")
            conn.endheaders()
            try:
                for i in range(0, len(body), 16384):
                    piece = body[i:i + 16384]
                    conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
                conn.send(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused mid-body: the answer is read below
        else:
            conn.request("POST", "/tokenize", body=body, headers={"content-type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


def _padded(n: int) -> bytes:
    """A /tokenize body of ``n`` bytes that costs nothing to tokenize (JSON whitespace)."""
    head, tail = b'{"prompt": "Hello world"', b"}"
    return head + b" " * (n - len(head) - len(tail)) + tail


def test_connections_past_the_cap_are_answered_503_and_the_server_goes_on(srv):
    _settled(srv)
    held = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(LIMITS["max_connections"])]
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as extra:
            answer = _read_all(extra)  # without the cap: nothing until the head deadline closes it
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"limit of 4 connections" in answer
    finally:
        for s in held:
            s.close()
    _settled(srv)
    got, out = _tokenize(srv, _padded(100))
    assert got == 200 and out["tokens"] == [9707, 1879]


def test_an_oversized_head_is_refused_with_431_or_closed(srv):
    limit = LIMITS["max_header_bytes"]
    # whole in one read, a little over the limit; just under it is served
    for size, expected in ((limit + 200, b"HTTP/1.1 431"), (limit - 200, b"HTTP/1.1 200")):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            head = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nx-pad: "
            s.sendall(head + b"a" * (size - len(head) - 4) + b"\r\n\r\n")
            answer = _read_all(s)
        assert answer.startswith(expected), (size, answer[:200])
    # one header that never ends, sent in pieces faster than the head's deadline: refused as it
    # grows (h11 answers its own 400), not buffered without end
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nx-pad: ")
        start, sent = time.monotonic(), 0
        try:
            while sent < 100 * limit:
                s.sendall(b"a" * 1024)
                sent += 1024
                time.sleep(0.005)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _read_all(s)
    assert sent < 100 * limit, "the server read an endless header on"
    assert answer.startswith(b"HTTP/1.1 431" if srv.protocol == "httptools" else b"HTTP/1.1 400"), answer[:200]
    assert time.monotonic() - start < HEAD_TIMEOUT_S  # refused by size, not by the deadline


def _drip(port: int, prefix: bytes, payload: bytes, step_s: float = 0.05, give_up_s: float = 10.0):
    """Send ``prefix``, then ``payload`` a byte every ``step_s`` until the server answers or closes:
    (what it sent, seconds from the first dripped byte, bytes dripped)."""
    with socket.create_connection(("127.0.0.1", port), timeout=give_up_s) as s:
        if prefix:
            s.sendall(prefix)
            out = b""
            while b"\r\n\r\n" not in out:  # the complete answer to the prefix's request
                out += s.recv(65536)
        s.settimeout(step_s)
        start, answer, n = time.monotonic(), b"", 0
        while time.monotonic() - start < give_up_s:
            try:
                s.send(payload[n % len(payload):n % len(payload) + 1])
                n += 1
            except (BrokenPipeError, ConnectionResetError):
                break
            try:
                data = s.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
        return answer + (_read_all(s) if answer else b""), time.monotonic() - start, n


def test_a_dripped_head_is_cut_off_at_its_deadline(srv):
    """A first request's head dripped a byte at a time, and a later one on a kept-alive connection
    (uvicorn's keep-alive wait ends at its first byte): each gets a 408 and a close at the deadline."""
    later = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    for prefix in (b"", later):
        answer, took, n = _drip(srv.port, prefix, b"GET /health HTTP/1.1\r\nHost: x\r\nx-slow: " + b"a" * 64)
        assert answer.startswith(b"HTTP/1.1 408"), (prefix, answer[:200], took, n)
        assert HEAD_TIMEOUT_S * 0.8 < took < HEAD_TIMEOUT_S + 2.0, took


def test_idle_connections_are_closed(srv):
    """A connection that never sends a byte is closed at the head's deadline (uvicorn arms no timer
    before a first request); one idle after its answer at the keep-alive time (uvicorn's own)."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        start = time.monotonic()
        assert _read_all(s) == b""
        assert HEAD_TIMEOUT_S * 0.8 < time.monotonic() - start < HEAD_TIMEOUT_S + 2.0
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += s.recv(65536)
        start = time.monotonic()
        assert answer.startswith(b"HTTP/1.1 200") and _read_all(s) == b""
        assert time.monotonic() - start < LIMITS["keep_alive_s"] + 1.5


def test_body_bytes_in_progress_are_bounded_per_client_and_in_all(srv):
    """One client (127.0.0.2) holds most of its share with a body it stops sending. Its next
    request, whose length does not fit its share, is a 429 before a byte is read; another client's
    chunked body that would take the server past its total is a 503 as it arrives; a third
    client's small request is served meanwhile, and once the first leaves its bytes are free."""
    _settled(srv)
    app = srv.server.config.app
    hog = socket.create_connection(("127.0.0.1", srv.port), timeout=10, source_address=("127.0.0.2", 0))
    try:
        hog.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                    b"content-length: 190000\r\n\r\n" + b'{"prompt": "' + b"a" * 180_000)
        deadline = time.monotonic() + 10
        while app.budget.held < 180_000:  # the app has read (and holds) what was sent
            assert time.monotonic() < deadline, app.budget.held
            time.sleep(0.01)
        got, out = _tokenize(srv, _padded(100_000), source="127.0.0.2")
        assert got == 429 and "this client's requests" in out["error"]["message"], (got, out)
        got, out = _tokenize(srv, _padded(150_000), source="127.0.0.3", chunked=True)
        assert got == 503 and "retry later" in out["error"]["message"], (got, out)
        assert _tokenize(srv, _padded(1000), source="127.0.0.4")[0] == 200
        assert app.budget.held_by("127.0.0.2") >= 180_000 and app.budget.held <= LIMITS["max_inflight_bytes"]
    finally:
        hog.close()
    _settled(srv)  # the hog's request ended (its client left): its bytes are released
    assert _tokenize(srv, _padded(150_000), source="127.0.0.3", chunked=True)[0] == 200
    assert _tokenize(srv, _padded(190_000), source="127.0.0.2")[0] == 200


def test_the_limits_are_validated_and_reach_uvicorn(tokenizer_paths):
    from delta_ray.server.asgi import BodyBudget
    from delta_ray.server.http_limits import ConnectionLimits
    from delta_ray.server.local import local_server
    from delta_ray.server.serve_config import DEFAULT_MAX_CLIENT_INFLIGHT_BYTES, inflight_limits

    for bad in ({"max_connections": 0}, {"max_header_bytes": -1}, {"header_timeout_s": 0}):
        with pytest.raises(ValueError):
            ConnectionLimits(**bad)
    with pytest.raises(ValueError):
        BodyBudget(0, 1)
    # the defaults make room for one largest body per client, and the total for one client's share
    assert inflight_limits(1 << 30) == (1 << 30, 1 << 30)
    assert inflight_limits(1000)[1] == DEFAULT_MAX_CLIENT_INFLIGHT_BYTES
    assert inflight_limits(1000, 5000, 3000) == (5000, 3000)
    config = local_server(object(), max_connections=7, keep_alive_s=3, backlog=99).config
    assert (config.limit_concurrency, config.timeout_keep_alive, config.backlog) == (8, 3, 99)
    assert config.ws == "none" and config.http.limits.max_connections == 7


def test_the_cli_passes_the_limits_to_the_local_server_only(monkeypatch, capsys):
    from delta_ray.apps.cli import main as cli
    from delta_ray.server import local

    got = {}
    monkeypatch.setattr(local, "run_local", lambda tok, host, port, **options: got.update(options))
    assert cli(["serve", "--local", "--tokenizer", "qwen-3", "--metrics", "--max-connections", "9",
                "--max-header-bytes", "2048", "--header-timeout", "2.5", "--max-inflight-bytes", "5000000",
                "--max-client-inflight-bytes", "3000000"]) == 0
    assert {k: got[k] for k in ("metrics", "max_connections", "max_header_bytes", "header_timeout_s",
                                "max_inflight_bytes", "max_client_inflight_bytes")} == {
        "metrics": True, "max_connections": 9, "max_header_bytes": 2048, "header_timeout_s": 2.5,
        "max_inflight_bytes": 5_000_000, "max_client_inflight_bytes": 3_000_000}
    got.clear()
    assert cli(["serve", "--local", "--tokenizer", "qwen-3"]) == 0
    assert "metrics" not in got and "max_connections" not in got  # the defaults are local_app's and local_server's
    assert cli(["serve", "--tokenizer", "qwen-3", "--metrics", "--max-connections", "9"]) == 2  # before Ray starts
    assert "--metrics, --max-connections are the one-process server's" in capsys.readouterr().err
