"""``TokenizerPool``: sticky session workers and chunk tasks on Ray, every result exact.

The pool is three parts: this facade (start-up, the sync and async API, named pools), the
orchestrator (``orchestrator.py``: routing, plans, session mirrors and locks, the failure policy,
on an asyncio loop in a background thread) and the transports (``transport.py``: Ray actor calls
and chunk tasks, and the authenticated same-node side channel). Results come back as numpy int32
buffers and are assembled, in input order, into Arrow arrays.

Resources: a worker actor reserves ``worker_cpus`` (0.5) of Ray's CPUs; a chunk task reserves
``task_cpus`` (0 by default) and is placed with SPREAD. What bounds the chunks is the dispatcher's
in-flight limit, not a reservation, so chunk tasks never wait on CPUs held by the workers, by
another pool or by another job (with 0.5 each, two default pools on one node reserved every CPU
and their chunks waited out the 60 s fail-over), and actors never wait on tasks.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import os
import secrets
from dataclasses import replace
from typing import Any, Sequence, overload

import numpy as np
import pyarrow as pa
import ray

from delta_ray._core import constants as C
from delta_ray._core.arguments import check_flag, check_tenant, check_text
from delta_ray._core.config import PoolConfig, pool_config
from delta_ray._core.errors import PoolAuthError, PoolClosed, PoolStartupError
from delta_ray._core.loading import TokenizerLike, load_tokenizer
from delta_ray._core.plan import CHUNKED, HERE, UNADMITTED
from delta_ray._tokenizer_core import TokenizerCore
from delta_ray.scheduler.policies import make_policy
from delta_ray.scheduler.routing import worker_name

from . import worker_channel
from .chunk_task import ChunkLauncher, warm_distinct
from .local_ray import ensure_ray
from .loop_thread import LoopThread
from .orchestrator import PoolOrchestrator
from .transport import ChannelTransport, RayTransport
from .worker import TokenizerWorker
from .worker_channel import ChannelClient

__all__ = ["PoolAuthError", "PoolClosed", "PoolStartupError", "TokenizerPool"]

log = logging.getLogger("delta_ray.pool")
WARM_BUDGET_S = 16.0  # how long a start may wait for the chunk-task processes to come up


def _attach_proof(secret: bytes, name: str, nonce: bytes) -> bytes:
    return hmac.new(secret, b"attach:" + name.encode() + b":" + nonce, hashlib.sha256).digest()


def _registry_proof(secret: bytes, name: str, nonce: bytes, info: dict) -> bytes:
    """The registry's answer to a caller's nonce: HMAC over the pool name, that nonce, and what the
    caller will adopt (tokenizer digest, configuration, each worker's actor id), so only a holder of
    the secret can answer, and no answer can be replayed to another caller or altered."""
    # third-party seam: a Ray actor handle's id (no public accessor on a handle)
    workers = "\n".join(f"{wid}={h._actor_id.hex()}" for wid, h in sorted(info["workers"].items()))
    what = hashlib.sha256(f"{info['loaded'].digest}\n{info['config']!r}\n{workers}".encode()).digest()
    return hmac.new(secret, b"registry:" + name.encode() + b":" + nonce + what, hashlib.sha256).digest()


@ray.remote(num_cpus=0)
class _PoolRegistry:
    """Named actor through which other processes attach to a named pool, if they hold its secret."""

    def __init__(self, name: str, info: dict, secret: bytes):
        self._name, self._info, self._secret = name, info, secret
        self._used: set[bytes] = set()

    def info(self, nonce: bytes, proof: bytes) -> dict:
        if (not isinstance(nonce, bytes) or len(nonce) < 16 or nonce in self._used
                or not isinstance(proof, bytes)
                or not hmac.compare_digest(proof, _attach_proof(self._secret, self._name, nonce))):
            raise PoolAuthError(f"attaching to pool {self._name!r} needs its secret")
        self._used.add(nonce)
        return {**self._info, "proof": _registry_proof(self._secret, self._name, nonce, self._info)}


class TokenizerPool:
    """A Ray actor pool that returns exactly the reference's IDs.

    ``encode(text, session=key)`` goes to the session's home worker (rendezvous over CRC-32 of the
    key and the live workers), which repairs only the tail; long stateless texts are cut at safe cuts and the
    chunks run in parallel; stateless texts under 4,096 bytes are encoded in the caller's process.
    Thread-safe and coroutine-safe; use ``close()`` or a ``with`` block.

    Options: a :class:`~delta_ray._core.config.PoolConfig` and/or its fields as keywords (``num_workers``,
    ``policy``, ``max_inflight_tasks``, ``request_timeout_s``, ...), plus the workers' tokenizer
    options (``chunk_size``, ``cut_threshold``, ``engine``, ...). Stateless texts and chunks run as
    Ray tasks, at most ``max_inflight_tasks`` at once (default: the cluster's CPUs).
    """

    def __init__(self, tokenizer: TokenizerLike, config: PoolConfig | None = None, *, name: str | None = None,
                 secret: bytes | None = None, _attach: dict | None = None, **options):
        if _attach is None:
            cfg = pool_config(config, options)
            make_policy(cfg.policy)  # an unknown policy fails here, before any worker starts
        self._started_ray = ensure_ray()
        self.name = name
        if _attach is not None:  # TokenizerPool.connect
            loaded = load_tokenizer(_attach["loaded"])
            self._owner = False
            self._workers = dict(_attach["workers"])
            cfg = _attach["config"]
            self.secret = _attach["secret"]
        else:
            loaded = load_tokenizer(tokenizer)
            self._owner = True
            # The pool secret authenticates the side channel, seals the session states the pool
            # installs on workers, and is what another process needs to attach to a named pool.
            self.secret = secret if secret is not None else worker_channel.new_secret()
            cfg = cfg.resolved(int(ray.cluster_resources().get("CPU", os.cpu_count() or 1)))
            self._workers = self._start_workers(loaded, cfg, self.secret)
        self.config = cfg
        self._loaded = loaded
        self._config_ref = ray.put(loaded.config_bytes)
        # The caller-side tokenizer: short texts, planning, and the fail-over path.
        local = TokenizerCore(loaded, replace(cfg.tokenizer, threads=max(1, len(self._workers))))
        self.admission = local.admission
        self._loop_thread = LoopThread("delta-ray-pool")
        self._loop = self._loop_thread.loop
        self._launcher = ChunkLauncher(self._config_ref, loaded.digest, cfg)
        self._warm_task_pool()
        transport = RayTransport(self._workers, self._launcher, owner=self._owner)
        if cfg.side_channel:
            transport = ChannelTransport(transport, self._open_channels())
        self._orch = PoolOrchestrator(local, transport, list(self._workers), cfg, self._loop, self.secret)
        self._registry = None
        if self._owner and name:
            info = {"loaded": loaded, "workers": self._workers, "config": cfg}
            self._registry = _PoolRegistry.options(name=f"{name}:registry", namespace=C.NAMESPACE).remote(
                name, info, self.secret)

    # -- construction ------------------------------------------------------------------------
    @staticmethod
    def _start_workers(loaded, cfg: PoolConfig, secret: bytes) -> dict[str, Any]:
        config_ref = ray.put(loaded.config_bytes)
        workers = {}
        for i in range(cfg.num_workers):
            wid = worker_name(i)
            # Workers are not named actors: a process finds them only through the registry, with the secret.
            opts = {"num_cpus": cfg.worker_cpus, "scheduling_strategy": "SPREAD",
                    "runtime_env": {"env_vars": {"RAYON_NUM_THREADS": "1", "FASTOKENS_BPE_THREADS": "1"}}}
            workers[wid] = TokenizerWorker.options(**opts).remote(config_ref, loaded.digest, cfg.tokenizer, secret)
        try:
            ray.get([w.ready.remote() for w in workers.values()], timeout=cfg.startup_timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            for w in workers.values():
                ray.kill(w)
            raise PoolStartupError(f"{cfg.num_workers} workers did not load the tokenizer within "
                                   f"{cfg.startup_timeout_s:.0f} s") from exc
        return workers

    def _warm_task_pool(self) -> None:
        """Load the tokenizer in the processes that will run chunk tasks, before any request waits.

        A cold task process spends seconds importing and loading the tokenizer; without this the
        first bursts of chunks pay it on the request path.
        """
        n = self.config.max_inflight_tasks
        if n <= 0 or not self.admission:
            return
        timeout = self.config.startup_timeout_s

        def run_round(k: int, hold_s: float) -> list[int]:
            return ray.get([self._launcher.warm(hold_s=hold_s) for _ in range(k)], timeout=timeout)
        # Only zero-CPU tasks can all run at once whatever the workers reserve; the rounds stop
        # doubling at a bounded wait, so a node that cannot start n processes slows no start much.
        budget = min(timeout, WARM_BUDGET_S) if self.config.task_cpus == 0 else 0.0
        try:
            warmed = warm_distinct(run_round, n, budget)
        except Exception:  # noqa: BLE001 - warming is best effort; requests still work cold
            log.warning("warming the chunk-task processes failed", exc_info=True)
            return
        if warmed < n:
            log.warning("warmed %d of %d chunk-task processes within %.0f s", warmed, n, budget)

    def _open_channels(self) -> dict[str, ChannelClient]:
        """Side channels to the workers on this process's node (actors/worker_channel.py)."""
        if not worker_channel.supported():
            return {}
        here = ray.get_runtime_context().get_node_id()
        refs = {wid: w.channel.remote() for wid, w in self._workers.items()}
        out = {}
        for wid, ref in refs.items():
            try:
                info = ray.get(ref, timeout=30)
            except Exception:  # noqa: BLE001 - that worker is served through Ray instead
                log.warning("worker %s has no side channel; using Ray calls", wid, exc_info=True)
                continue
            if info["address"] and info["node"] == here:
                out[wid] = ChannelClient(info["address"], self.secret, expected_pid=info["pid"])
        return out

    @classmethod
    def connect(cls, name: str, secret: bytes | str | None = None) -> "TokenizerPool":
        """Attach this process (a Serve replica, a Data worker, another driver) to a named pool.

        ``secret`` is the pool's (``pool.secret``, bytes or hex; default ``$DELTA_RAY_POOL_SECRET``):
        without it the registry refuses with :class:`PoolAuthError`. The registry must prove the same
        secret over this call's nonce and what it returns (an actor that took the registry's name
        cannot hand this process its own workers or secret): otherwise :class:`PoolAuthError`.
        """
        ensure_ray()
        if secret is None:
            secret = os.environ.get("DELTA_RAY_POOL_SECRET")
        if isinstance(secret, str):
            secret = bytes.fromhex(secret)
        if not secret:
            raise PoolAuthError(f"attaching to pool {name!r} needs its secret (secret= or $DELTA_RAY_POOL_SECRET)")
        try:
            registry = ray.get_actor(f"{name}:registry", namespace=C.NAMESPACE)
        except ValueError as exc:
            raise LookupError(f"no delta-ray pool named {name!r} is running") from exc
        nonce = secrets.token_bytes(32)
        try:
            info = ray.get(registry.info.remote(nonce, _attach_proof(secret, name, nonce)))
        except ray.exceptions.RayTaskError as exc:
            raise PoolAuthError(f"attaching to pool {name!r} needs its secret") from exc
        except Exception as exc:  # noqa: BLE001 - not a registry at all
            raise PoolAuthError(f"the actor named {name!r}:registry is not a delta-ray pool registry") from exc
        try:
            loaded = info["loaded"]
            genuine = (hashlib.sha256(loaded.config_bytes).hexdigest() == loaded.digest
                       and hmac.compare_digest(info["proof"], _registry_proof(secret, name, nonce, info)))
        except Exception:  # noqa: BLE001 - malformed: not from a registry holding the secret
            genuine = False
        if not genuine:
            raise PoolAuthError(f"the registry of pool {name!r} did not prove the secret: refusing its workers")
        return cls(None, name=name, _attach={"loaded": loaded, "workers": info["workers"],
                                             "config": info["config"], "secret": secret})

    # -- public API --------------------------------------------------------------------------
    @property
    def num_workers(self) -> int:
        return self._orch.num_workers

    @property
    def stats(self) -> dict[str, int]:
        """Paths taken by this pool's requests (session, session_delta, chunked, placed_here, ...)."""
        return self._orch.stats

    @property
    def request_timeout_s(self) -> float:
        return self.config.request_timeout_s

    def home_of(self, session: str, tenant: str | None = None) -> str:
        """The worker a session's requests go to now."""
        return self._orch.home_of(check_text(session, "session"), check_tenant(tenant))

    # Each operation has one body (its ``_..._request``: checks, then where it runs); the sync and
    # async methods differ only in how they wait for it (``_run`` / ``_run_async``).
    @overload
    def encode(self, text: str, *, session: None = None, add_special_tokens: bool = True,
               tenant: str | None = None) -> pa.Int32Array: ...

    @overload
    def encode(self, text: str, *, session: str, add_special_tokens: bool = True,
               tenant: str | None = None) -> pa.ChunkedArray: ...

    def encode(self, text: str, *, session: str | None = None, add_special_tokens: bool = True,
               tenant: str | None = None) -> pa.Int32Array | pa.ChunkedArray:
        """Reference IDs of ``text`` (a session reuses what its worker already encoded).

        With ``session`` a ``pyarrow.ChunkedArray`` (zero-copy views of the session's ID parts, as
        in process), without it a ``pyarrow.Int32Array``. ``tenant`` namespaces the session and what
        a keyless text reuses by content on the workers (a service serving several tenants passes
        it, so no tenant reads another's session or learns another's text from timing); extend a
        tenant's session with the same ``tenant``."""
        return self._run(self._encode_request(text, session, add_special_tokens, tenant))

    @overload
    async def encode_async(self, text: str, *, session: None = None, add_special_tokens: bool = True,
                           tenant: str | None = None) -> pa.Int32Array: ...

    @overload
    async def encode_async(self, text: str, *, session: str, add_special_tokens: bool = True,
                           tenant: str | None = None) -> pa.ChunkedArray: ...

    async def encode_async(self, text: str, *, session: str | None = None, add_special_tokens: bool = True,
                           tenant: str | None = None) -> pa.Int32Array | pa.ChunkedArray:
        """:meth:`encode` for a caller on an event loop."""
        return await self._run_async(self._encode_request(text, session, add_special_tokens, tenant))

    def extend(self, session: str, delta: str, *, add_special_tokens: bool = True,
               tenant: str | None = None) -> pa.ChunkedArray:
        """IDs of the session's stored text plus ``delta``; SessionNotFound if its worker lacks it."""
        return self._run(self._extend_request(session, delta, add_special_tokens, tenant, tail=False))

    async def extend_async(self, session: str, delta: str, *, add_special_tokens: bool = True,
                           tenant: str | None = None) -> pa.ChunkedArray:
        """:meth:`extend` for a caller on an event loop."""
        return await self._run_async(self._extend_request(session, delta, add_special_tokens, tenant, tail=False))

    async def extend_tail_async(self, session: str, delta: str, *, add_special_tokens: bool = True,
                                tenant: str | None = None) -> tuple[int, int, np.ndarray]:
        """``extend`` answering only the IDs that changed: ``(start, count, tail)``, where the
        session's IDs are the caller's previous answer cut to ``start`` followed by ``tail`` (an
        append over HTTP receives kilobytes, not the transcript's IDs)."""
        return await self._run_async(self._extend_request(session, delta, add_special_tokens, tenant, tail=True))

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[pa.Int32Array]:
        """Reference IDs of many stateless texts, spread over the workers and tasks."""
        return self._run(self._orch.encode_batch(self._check_batch(texts), check_flag(add_special_tokens)))

    async def encode_batch_async(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[pa.Int32Array]:
        """:meth:`encode_batch` for a caller on an event loop."""
        return await self._run_async(self._orch.encode_batch(self._check_batch(texts), check_flag(add_special_tokens)))

    def decode(self, ids, *, skip_special_tokens: bool = True) -> str:
        return self._orch.core.decode(ids, skip_special_tokens=skip_special_tokens)

    def cuts(self, text: str) -> list[int]:
        return self._orch.core.cuts(text)

    def worker_stats(self) -> dict[str, dict]:
        """Per-worker session counts and paths taken (for metrics and tests)."""
        refs = {wid: self._workers[wid].stats.remote() for wid in self._orch.dispatcher.workers}
        return {wid: ray.get(r) for wid, r in refs.items()}

    def close(self) -> None:
        """Stop the loop; kill the workers if this process created them; stop Ray if it started it."""
        if self._loop_thread.closed:
            return
        # calls in flight are cancelled and answered with PoolClosed; the channels close on the loop
        self._loop_thread.close(before_stop=self._orch.transport.close)
        if self._owner:
            for w in self._workers.values():
                try:
                    ray.kill(w)
                except Exception:
                    pass
            if self._registry is not None:
                ray.kill(self._registry)
        if self._started_ray:
            ray.shutdown()

    def __enter__(self) -> "TokenizerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------------
    @staticmethod
    def _check_batch(texts) -> list[str]:
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of str, not a str")
        texts = list(texts)
        for t in texts:
            check_text(t)
        return texts

    def _encode_request(self, text, session, add: bool, tenant):
        """What :meth:`encode` runs: a call here (a text the caller should encode itself), or a
        coroutine for the pool's loop."""
        check_text(text)
        add, tenant = check_flag(add), check_tenant(tenant)
        if session is not None:
            check_text(session, "session")
        route = self._orch.router.decide(text, session)
        if route is HERE or route is CHUNKED or route is UNADMITTED:  # kept in the caller: no hop to the loop
            return functools.partial(self._orch.encode_here, route, text, add)
        return self._orch.encode(text, session, add, tenant=tenant, route=route)

    def _extend_request(self, session, delta, add: bool, tenant, *, tail: bool):
        check_text(session, "session"), check_text(delta, "delta")
        return (self._orch.extend_tail if tail else self._orch.extend)(session, delta, check_flag(add),
                                                                       tenant=check_tenant(tenant))

    def _run(self, request):
        """Wait for a request in this thread: a call here runs here, a coroutine on the pool's loop."""
        if isinstance(request, functools.partial):
            return request()
        return self._loop_thread.run(request)

    async def _run_async(self, request):
        if isinstance(request, functools.partial):
            return await asyncio.to_thread(request)
        return await self._loop_thread.run_async(request)
