"""The two hosts of the HTTP service, each on a free loopback port: the one-process server (uvicorn in
a thread of this process, no Ray) and the Ray Serve app (through Serve's proxy). The HTTP tests
take ``host`` and run once per host; the Serve host's runs carry the ``ray`` mark."""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import pytest

from delta_ray.apps.bundled import bundled_tokenizer_config

# Both hosts serve the same tokenizer with the same options (the Serve app adds a pool of two workers).
OPTIONS = {"model_name": "qwen-3", "max_body_bytes": 200_000, "chunk_size": 8192, "cut_threshold": 20_000}


@dataclass(frozen=True)
class Host:
    name: str  # "local" or "serve"
    base: str  # http://127.0.0.1:PORT[/prefix]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalThread:
    """``local_app`` on uvicorn in a daemon thread of this process, until :meth:`stop`. Options are
    ``local_app``'s, and ``local_server``'s connection limits (as ``run_local`` takes them)."""

    def __init__(self, tokenizer: str, **options):
        from delta_ray.server.local import SERVER_OPTIONS, local_app, local_server
        server = {k: options.pop(k) for k in SERVER_OPTIONS & set(options)}
        self.port = free_port()
        self.server = local_server(local_app(tokenizer, **options), "127.0.0.1", self.port, **server)
        self.thread = threading.Thread(target=self.server.run, name="local-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the local server did not start")
            time.sleep(0.02)
        self.base = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="session")
def local_host(tokenizer_paths):
    srv = LocalThread(tokenizer_paths["qwen-3"], tokenizer_config=bundled_tokenizer_config("qwen-3"), metrics=True,
                      **OPTIONS)  # metrics: test_http.py reads the counters
    yield Host("local", srv.base)
    srv.stop()


@pytest.fixture(scope="session")
def serve_service(ray_session, tokenizer_paths):
    """(base URL, DeploymentHandle) of the Serve app at "/" on its own port."""
    from ray import serve

    from delta_ray import serve_app

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = serve_app(tokenizer_paths["qwen-3"], num_workers=2, tokenizer_config=bundled_tokenizer_config("qwen-3"),
                    **OPTIONS)
    handle = serve.run(app, name="delta-ray-test", route_prefix="/")
    yield f"http://127.0.0.1:{port}", handle
    serve.delete("delta-ray-test")
    serve.shutdown()


@pytest.fixture(scope="session")
def serve_host(serve_service):
    return Host("serve", serve_service[0])


@pytest.fixture(scope="module", params=["local", pytest.param("serve", marks=pytest.mark.ray)])
def host(request) -> Host:
    """Each host in turn: the HTTP tests run against both."""
    return request.getfixturevalue(f"{request.param}_host")


@pytest.fixture(scope="module")
def other(host, tokenizer_paths):
    """A second instance on the same host kind, requiring a tenant: another process's (another
    replica's) sessions and secret, as when a turn is served by a fallback."""
    if host.name == "local":
        srv = LocalThread(tokenizer_paths["qwen-3"], model_name="qwen-3", require_tenant=True)
        yield Host("local", srv.base)
        srv.stop()
        return
    from ray import serve

    from delta_ray import serve_app
    app = serve_app(tokenizer_paths["qwen-3"], model_name="qwen-3", require_tenant=True, replica_cpus=0.1)
    serve.run(app, name="delta-ray-tenant", route_prefix="/t")
    yield Host("serve", f"{host.base}/t")
    serve.delete("delta-ray-tenant")
