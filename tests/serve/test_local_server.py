"""The one-process server (``delta-ray serve --local``): no Ray, and the options only Ray Serve has are
refused. Its HTTP behaviour is tested with the Serve app's in test_http.py."""
from __future__ import annotations

import pytest

from delta_ray.apps.cli import main as cli


def test_serve_local_answers_without_ever_importing_ray(run_own_process):
    assert "LOCAL NO RAY OK" in run_own_process("local_no_ray_check.py", timeout=300)


@pytest.mark.parametrize("flags", [["--replicas", "2"], ["--workers", "2"], ["--autoscale", "1:3"],
                                   ["--direct-ingress"]])
def test_serve_local_refuses_what_needs_ray(flags, capsys):
    assert cli(["serve", "--local", "--tokenizer", "qwen-3", *flags]) == 2
    assert "need Ray Serve" in capsys.readouterr().err


def test_local_app_refuses_a_pool(tokenizer_paths):
    from delta_ray.server.local import local_app
    with pytest.raises(TypeError, match="pool runs on Ray"):
        local_app(tokenizer_paths["qwen-3"], num_workers=2)
    with pytest.raises(ValueError, match="reuse"):  # the same validation as serve_app's
        local_app(tokenizer_paths["qwen-3"], reuse="content")


def test_a_dripping_client_gets_a_408_and_the_server_keeps_serving(tokenizer_paths):
    """uvicorn has no body-read timeout: the app's own deadline answers a client that sends its
    headers and part of its body, then nothing, and the next request is served."""
    import json
    import socket
    import urllib.request

    from conftest import LocalThread
    srv = LocalThread(tokenizer_paths["qwen-3"], body_timeout_s=0.5)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                      b"content-length: 100\r\n\r\n{\"prompt\": \"")
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                data = s.recv(4096)  # a missing deadline ends here in socket.timeout, not a hang
                if not data:
                    break
                answer += data
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert "did not arrive within 0.5 s" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["message"]
        req = urllib.request.Request(srv.base + "/tokenize", data=b'{"prompt": "Hello world"}',
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert json.loads(r.read())["count"] == 2
    finally:
        srv.stop()
