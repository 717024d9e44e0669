"""A tenant's cache_salt is a secret of its caller's: no log line of the pool shows it, though the
keys its sessions are stored under carry it (Serve's 409s: tests/test_serve_handler.py)."""
from __future__ import annotations

import asyncio
import logging

from delta_ray._core.config import PoolConfig, TokenizerConfig
from delta_ray._core.loading import load_tokenizer
from delta_ray._tokenizer_core import TokenizerCore
from delta_ray.actors.calls import INSTALL
from delta_ray.actors.orchestrator import PoolOrchestrator
from delta_ray.actors.worker import WorkerService

SECRET = b"s" * 32
TOK = TokenizerConfig(chunk_size=4096, cut_threshold=12_000, threads=1, engine="reference", shadow_rate=0.0)
SALT = "tenant-secret-salt-0042"


class _NoMetrics:
    def __getattr__(self, name):
        return lambda *a, **k: None


class _InstallFails:
    """A transport whose calls run on in-process worker services, and whose installs fail."""

    def __init__(self, services: dict[str, WorkerService], shared: WorkerService):
        self.services, self.shared = services, shared

    async def call(self, wid, call):
        await asyncio.sleep(0)  # a real transport answers on a later loop turn
        if call.kind is INSTALL:
            raise RuntimeError("the worker refused the state")
        svc = self.shared if wid is None else self.services[wid]
        return getattr(svc, call.kind.method)(*call.args)

    def retire(self, wid, *, kill):
        pass

    def close(self):
        pass


def test_a_failed_install_logs_the_session_never_its_salt(tokenizer_paths, references, real_texts, caplog):
    """A long session's first turn is encoded in chunks and installed on its home worker; when
    the install fails the pool warns and re-initializes later. The warning names the session by
    the caller's id, not by its store key (which carries the tenant)."""
    loaded = load_tokenizer(tokenizer_paths["llama3.2"])
    services = {f"w{i}": WorkerService(TokenizerCore(loaded, TOK), SECRET) for i in range(2)}
    transport = _InstallFails(services, WorkerService(TokenizerCore(loaded, TOK), SECRET))
    cfg = PoolConfig(tokenizer=TOK, placement=False, request_timeout_s=5.0).resolved(2)
    loop = asyncio.new_event_loop()
    orch = PoolOrchestrator(TokenizerCore(loaded, TOK), transport, list(services), cfg, loop, SECRET,
                            record=_NoMetrics())
    text = (real_texts["english"] * 3)[:30_000]  # past cut_threshold: a chunked first turn
    with caplog.at_level(logging.WARNING, logger="delta_ray"):
        got = loop.run_until_complete(orch.encode(text, "conv-9", True, tenant=SALT))
    loop.close()
    assert got.to_pylist() == references["llama3.2"].encode(text).ids
    warnings = [r for r in caplog.records if "install" in r.getMessage()]
    assert warnings, caplog.text
    assert SALT not in caplog.text and all("conv-9" in r.getMessage() for r in warnings), caplog.text
