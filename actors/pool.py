"""``TokenizerPool``: sticky session workers and chunk tasks on Ray, every result exact.

The pool runs an asyncio loop in a background thread. Every request becomes one or more tasks in a
:class:`scheduler.Dispatcher`, which keeps the queues (so the policy decides what starts next) and
hands a task to Ray only when a worker or the shared task pool has a free slot. Results come back
as numpy int32 buffers and are assembled, in input order, into one ``pyarrow.Int32Array``.

Resources: a worker actor reserves ``worker_cpus`` (0.5) of Ray's CPUs; a chunk task reserves
``task_cpus`` (0 by default) and is placed with SPREAD. What bounds the chunks is the dispatcher's
in-flight limit, not a reservation, so chunk tasks never wait on CPUs held by the workers, by
another pool or by another job (with 0.5 each, two default pools on one node reserved every CPU
and their chunks waited out the 60 s fail-over), and actors never wait on tasks.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import ray

from delta_ray import constants as C
from delta_ray.assembly import concat_ids, to_arrow
from delta_ray.loading import TokenizerLike, load_tokenizer
from delta_ray.planner import chunk_count, plan_cuts
from delta_ray.repair import finish_repair, plan_repair
from delta_ray.session_store import SessionNotFound, merge_id_parts, prefix_parts, rope_is_prefix
from delta_ray.state_seal import seal_state
from delta_ray.tokenizer import DeltaTokenizer, _check_text
from delta_ray.scheduler import Dispatcher, PlacementModel, content_key, nonascii_share

from . import metrics
from . import worker_channel
from .chunk_task import CHUNK_ENV, encode_chunks, warm_chunk_process
from .local_ray import ensure_ray
from .worker import CHANNEL_METHODS, TokenizerWorker
from .worker_channel import ChannelClient, ChannelClosed
from delta_ray.errors import DeltaRayError

log = logging.getLogger("delta_ray.pool")


class PoolStartupError(DeltaRayError, RuntimeError):
    """The workers did not load within the start-up timeout."""


class PoolClosed(DeltaRayError, RuntimeError):
    """The pool was closed."""


def _attach_proof(secret: bytes, name: str, nonce: bytes) -> bytes:
    import hashlib
    import hmac
    return hmac.new(secret, b"attach:" + name.encode() + b":" + nonce, hashlib.sha256).digest()


class PoolAuthError(DeltaRayError, PermissionError):
    """Attaching to a named pool without its secret (or with a wrong one)."""


@ray.remote(num_cpus=0)
class _PoolRegistry:
    """Named actor through which other processes attach to a named pool, if they hold its secret."""

    def __init__(self, name: str, info: dict, secret: bytes):
        self._name, self._info, self._secret = name, info, secret
        self._used: set[bytes] = set()

    def info(self, nonce: bytes, proof: bytes) -> dict:
        import hmac
        if (not isinstance(nonce, bytes) or len(nonce) < 16 or nonce in self._used
                or not isinstance(proof, bytes)
                or not hmac.compare_digest(proof, _attach_proof(self._secret, self._name, nonce))):
            raise PoolAuthError(f"attaching to pool {self._name!r} needs its secret")
        self._used.add(nonce)
        return {**self._info, "secret": self._secret}


class _NoAnswer(Exception):
    """Set on a request's future when its fail-over timeout expires."""


class _NoWorkers(Exception):
    """Set on a queued session request's future when the pool has no live worker left."""


class _Request:
    """A future and the time its first task was handed to Ray (for the fail-over timeout)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.future: asyncio.Future = loop.create_future()
        self.dispatched = asyncio.Event()
        self.ref = None  # the Ray call running it, if any (cancelled when it hangs)


class _KeyLock:
    """Serializes one session's requests (extend order matters); forgets idle keys."""

    def __init__(self, locks: dict, key: str):
        self._locks, self._key = locks, _kid(key)

    async def __aenter__(self):
        entry = self._locks.setdefault(self._key, [asyncio.Lock(), 0])
        entry[1] += 1
        self._entry = entry
        await entry[0].acquire()

    async def __aexit__(self, *exc):
        self._entry[0].release()
        self._entry[1] -= 1
        if self._entry[1] == 0:
            self._locks.pop(self._key, None)


def _kid(key: str) -> bytes:
    """A fixed-size stand-in for a session key in the pool's own tables (keys may be megabytes)."""
    import hashlib
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()


_ENTRY_OVERHEAD = 160  # bytes per table entry besides its values (dict slot, tuple, digest)


def _ids_bytes(parts) -> int:
    return sum(p.nbytes for p in parts)


def _text_bytes(parts) -> int:
    import sys
    return sum(map(sys.getsizeof, parts))


class _Mirror:
    """session -> (state version, rope of immutable parts), LRU-bounded by bytes, keys by digest.

    Two of them: the IDs this pool last returned (to splice workers' delta answers) and the text it
    last sent (so a whole-transcript turn that extends it ships only the suffix). Their parts are
    shared with the answers and the callers' strings, never copied.
    """

    def __init__(self, max_bytes: int, size_of):
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._data: OrderedDict[bytes, tuple[int, tuple, int]] = OrderedDict()
        self._bytes = 0

    def get(self, key: str):
        k = _kid(key)
        item = self._data.get(k)
        if item is None:
            return None
        self._data.move_to_end(k)
        return item[0], item[1]

    def pop(self, key: str, default=None):
        item = self._data.pop(_kid(key), None)
        if item is None:
            return default
        self._bytes -= item[2]
        return item[0], item[1]

    def put(self, key: str, version: int, parts: tuple) -> None:
        self.pop(key)
        size = self._size_of(parts) + _ENTRY_OVERHEAD
        if size > self.max_bytes:
            return
        self._data[_kid(key)] = (version, parts, size)
        self._bytes += size
        while self._bytes > self.max_bytes and self._data:
            _, old = self._data.popitem(last=False)
            self._bytes -= old[2]

    @property
    def resident_bytes(self) -> int:
        return self._bytes


class _Bounded:
    """session -> small value, LRU-bounded by count, keys by digest (so 1 MiB keys cost 16 bytes)."""

    def __init__(self, max_items: int):
        self.max_items = max_items
        self._data: OrderedDict[bytes, Any] = OrderedDict()

    def get(self, key: str, default=None):
        return self._data.get(_kid(key), default)

    def put(self, key: str, value) -> None:
        k = _kid(key)
        self._data[k] = value
        self._data.move_to_end(k)
        while len(self._data) > self.max_items:
            self._data.popitem(last=False)

    def pop(self, key: str, default=None):
        return self._data.pop(_kid(key), default)

    def __len__(self) -> int:
        return len(self._data)


class TokenizerPool:
    """A Ray actor pool that returns exactly the reference's IDs.

    ``encode(text, session=key)`` goes to the session's home worker (CRC-32 of the key over the
    live workers), which repairs only the tail; long stateless texts are cut at safe cuts and the
    chunks run in parallel; stateless texts under 4,096 bytes are encoded in the caller's process.
    Thread-safe and coroutine-safe; use ``close()`` or a ``with`` block.

    Stateless texts and chunks run as Ray tasks, at most ``max_inflight_tasks`` at once (default:
    the cluster's CPUs). ``workers_take_shared`` lets idle session workers take them too (the
    better head of their two queues); by default only when ``max_inflight_tasks=0``, since a turn
    whose worker runs a chunk waits for the whole chunk.
    """

    def __init__(self, tokenizer: TokenizerLike, *, num_workers: int | None = None,
                 policy: str = "shortest_first", chunk_size: int = C.CHUNK_SIZE,
                 cut_threshold: int = C.CUT_THRESHOLD, max_chunks: int = C.MAX_CHUNKS,
                 name: str | None = None, worker_cpus: float = C.WORKER_CPUS, task_cpus: float = C.TASK_CPUS,
                 max_inflight_tasks: int | None = None, workers_take_shared: bool | None = None,
                 engine: str = "auto", shadow_rate: float = C.POOL_SHADOW_RATE, side_channel: bool = True,
                 task_nice: int = C.TASK_NICE,
                 request_timeout_s: float = C.REQUEST_TIMEOUT_S,
                 startup_timeout_s: float = C.STARTUP_TIMEOUT_S,
                 max_session_bytes: int = C.MAX_SESSION_BYTES, max_sessions: int = C.MAX_SESSIONS,
                 secret: bytes | None = None, placement: bool = True, _attach: dict | None = None):
        self._started_ray = ensure_ray()
        self._closed = False
        self.name = name
        self.request_timeout_s = request_timeout_s
        if _attach is not None:  # TokenizerPool.connect
            info = _attach
            loaded = load_tokenizer(info["loaded"])
            self._owner = False
            self._workers = dict(info["workers"])
            opts = info["options"]
            self.secret = info["secret"]
        else:
            loaded = load_tokenizer(tokenizer)
            self._owner = True
            # The pool secret authenticates the side channel, seals the session states the pool
            # installs on workers, and is what another process needs to attach to a named pool.
            self.secret = secret if secret is not None else worker_channel.new_secret()
            n_cpus = int(ray.cluster_resources().get("CPU", os.cpu_count() or 1))
            num_workers = num_workers or max(1, n_cpus)
            if num_workers < 1:
                raise ValueError("num_workers must be >= 1")
            if max_inflight_tasks is None:
                max_inflight_tasks = max(1, n_cpus)
            if workers_take_shared is None:
                # Measured on bursts (bench_pool): a worker running a chunk makes its sessions' next
                # turn wait for the whole chunk, while a chunk in a task process only shares the
                # cores. So workers take shared work only when there is no task pool.
                workers_take_shared = max_inflight_tasks == 0
            opts = {"chunk_size": chunk_size, "cut_threshold": cut_threshold, "max_chunks": max_chunks,
                    "policy": policy, "side_channel": side_channel, "task_nice": task_nice,
                    "task_cpus": task_cpus, "workers_take_shared": workers_take_shared,
                    "max_inflight_tasks": max_inflight_tasks,
                    "worker": {"chunk_size": chunk_size, "cut_threshold": cut_threshold, "max_chunks": max_chunks,
                               "threads": 1, "max_session_bytes": max_session_bytes, "max_sessions": max_sessions,
                               "engine": engine, "shadow_rate": shadow_rate}}
            self._workers = self._start_workers(loaded, num_workers, worker_cpus, opts["worker"], self.secret,
                                                startup_timeout_s)
        self._opts = opts
        self._loaded = loaded
        self._config_ref = ray.put(loaded.config_bytes)
        # The caller-side tokenizer: short texts, planning, and the fail-over path.
        wopts = opts["worker"]
        self._local = DeltaTokenizer(loaded, chunk_size=opts["chunk_size"], cut_threshold=opts["cut_threshold"],
                                     max_chunks=opts["max_chunks"], threads=max(1, len(self._workers)),
                                     engine=wopts.get("engine", "auto"), shadow_rate=wopts.get("shadow_rate", 0.0))
        self.admission = self._local.admission
        self._dispatcher = Dispatcher(opts["policy"], workers=list(self._workers),
                                      max_inflight_tasks=opts["max_inflight_tasks"],
                                      workers_take_shared=opts.get("workers_take_shared", True))
        self._lock = threading.Lock()  # guards the dispatcher against the loop and callers
        self._requests: dict[int, _Request] = {}
        self._session_locks: dict[str, asyncio.Lock] = {}
        self._known = _Bounded(C.KNOWN_SESSIONS)  # session -> worker believed to hold it
        self._mirror = _Mirror(C.MIRROR_BYTES, _ids_bytes)  # session -> (state version, IDs) last returned
        # session -> version of the state this pool last saw: an extend must extend exactly that one
        self._versions = _Bounded(C.KNOWN_SESSIONS)
        self._texts = _Mirror(C.TEXT_MIRROR_BYTES, _text_bytes)  # session -> the text last sent, to ship deltas
        self._placement = PlacementModel()
        self._starts: dict[bytes, int] = {}  # session -> first ID that changed in its last answer
        self._placement_enabled = placement
        self._fast_seen = False
        self.stats: dict[str, int] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="delta-ray-pool", daemon=True)
        self._thread.start()
        self._warm_task_pool(startup_timeout_s)
        self._channels = self._open_channels() if opts.get("side_channel", True) else {}
        self._registry = None
        if self._owner and name:
            info = {"loaded": loaded, "workers": self._workers, "options": opts}
            self._registry = _PoolRegistry.options(name=f"{name}:registry", namespace=C.NAMESPACE).remote(
                name, info, self.secret)

    # -- construction ------------------------------------------------------------------------
    @staticmethod
    def _start_workers(loaded, n, cpus, options, secret, timeout) -> dict[str, Any]:
        config_ref = ray.put(loaded.config_bytes)
        workers = {}
        for i in range(n):
            wid = f"w{i:03d}"
            # Workers are not named actors: a process finds them only through the registry, with the secret.
            opts = {"num_cpus": cpus, "scheduling_strategy": "SPREAD",
                    "runtime_env": {"env_vars": {"RAYON_NUM_THREADS": "1", "FASTOKENS_BPE_THREADS": "1"}}}
            workers[wid] = TokenizerWorker.options(**opts).remote(config_ref, loaded.digest, options, secret)
        try:
            ray.get([w.ready.remote() for w in workers.values()], timeout=timeout)
        except ray.exceptions.GetTimeoutError as exc:
            for w in workers.values():
                ray.kill(w)
            raise PoolStartupError(f"{n} workers did not load the tokenizer within {timeout:.0f} s") from exc
        return workers

    def _warm_task_pool(self, timeout: float) -> None:
        """Load the tokenizer in the processes that will run chunk tasks, before any request waits.

        A cold task process spends seconds importing and loading the tokenizer; without this the
        first bursts of chunks pay it on the request path.
        """
        n = self._opts["max_inflight_tasks"]
        if n <= 0 or not self.admission:
            return
        refs = [warm_chunk_process.options(**self._chunk_options())
                .remote(self._config_ref, self._loaded.digest, self._opts["worker"], self._opts.get("task_nice", 0), 0.5)
                for _ in range(n)]
        try:
            ray.get(refs, timeout=timeout)
        except Exception:  # noqa: BLE001 - warming is best effort; requests still work cold
            log.warning("warming the chunk-task processes failed", exc_info=True)

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

    def _chunk_options(self) -> dict:
        return {"num_cpus": self._opts["task_cpus"], "scheduling_strategy": "SPREAD",
                "runtime_env": {"env_vars": CHUNK_ENV}}

    def _chunk_task(self, piece: str):
        return encode_chunks.options(**self._chunk_options()).remote(
            self._config_ref, self._loaded.digest, [piece], self._opts["worker"], self._opts.get("task_nice", 0))

    @classmethod
    def connect(cls, name: str, secret: bytes | str | None = None) -> "TokenizerPool":
        """Attach this process (a Serve replica, a Data worker, another driver) to a named pool.

        ``secret`` is the pool's (``pool.secret``, bytes or hex; default ``$DELTA_RAY_POOL_SECRET``):
        without it the registry refuses with :class:`PoolAuthError`.
        """
        import secrets as _secrets
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
        nonce = _secrets.token_bytes(32)
        try:
            info = ray.get(registry.info.remote(nonce, _attach_proof(secret, name, nonce)))
        except ray.exceptions.RayTaskError as exc:
            raise PoolAuthError(f"attaching to pool {name!r} needs its secret") from exc
        return cls(None, name=name, _attach=info)

    # -- public API --------------------------------------------------------------------------
    @property
    def num_workers(self) -> int:
        return len(self._dispatcher.workers)

    def encode(self, text: str, *, session: str | None = None, add_special_tokens: bool = True) -> pa.Int32Array:
        """Reference IDs of ``text`` (a session reuses what its worker already encoded)."""
        _check_text(text)
        if session is not None:
            _check_text(session, "session")
        if session is None and self._runs_here(text):
            return self._encode_here(text, add_special_tokens)
        return self._call(self._encode(text, session, add_special_tokens))

    def extend(self, session: str, delta: str, *, add_special_tokens: bool = True) -> pa.Int32Array:
        """IDs of the session's stored text plus ``delta``; SessionNotFound if its worker lacks it."""
        _check_text(session, "session")
        _check_text(delta, "delta")
        return self._call(self._extend(session, delta, add_special_tokens))

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[pa.Int32Array]:
        """Reference IDs of many stateless texts, spread over the workers and tasks."""
        texts = self._check_batch(texts)
        return self._call(self._encode_batch(texts, add_special_tokens))

    async def encode_async(self, text: str, *, session: str | None = None,
                           add_special_tokens: bool = True) -> pa.Int32Array:
        _check_text(text)
        if session is not None:
            _check_text(session, "session")
        if session is None and self._runs_here(text):
            return await asyncio.to_thread(self._encode_here, text, add_special_tokens)
        return await self._call_async(self._encode(text, session, add_special_tokens))

    async def extend_tail_async(self, session: str, delta: str, *,
                                add_special_tokens: bool = True) -> tuple[int, int, np.ndarray]:
        """``extend`` answering only the IDs that changed: ``(start, count, tail)``, where the
        session's IDs are the caller's previous answer cut to ``start`` followed by ``tail`` (an
        append over HTTP receives kilobytes, not the transcript's IDs)."""
        _check_text(session, "session")
        _check_text(delta, "delta")
        return await self._call_async(self._extend_tail(session, delta, add_special_tokens))

    async def extend_async(self, session: str, delta: str, *, add_special_tokens: bool = True) -> pa.Int32Array:
        _check_text(session, "session")
        _check_text(delta, "delta")
        return await self._call_async(self._extend(session, delta, add_special_tokens))

    async def encode_batch_async(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[pa.Int32Array]:
        texts = self._check_batch(texts)
        return await self._call_async(self._encode_batch(texts, add_special_tokens))

    def decode(self, ids, *, skip_special_tokens: bool = True) -> str:
        return self._local.decode(ids, skip_special_tokens=skip_special_tokens)

    def cuts(self, text: str) -> list[int]:
        return self._local.cuts(text)

    def worker_stats(self) -> dict[str, dict]:
        """Per-worker session counts and paths taken (for metrics and tests)."""
        refs = {wid: w.stats.remote() for wid, w in self._live_workers().items()}
        return {wid: ray.get(r) for wid, r in refs.items()}

    def close(self) -> None:
        """Stop the loop; kill the workers if this process created them; stop Ray if it started it."""
        if self._closed:
            return
        self._closed = True
        for client in list(self._channels.values()):
            self._loop.call_soon_threadsafe(client.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
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
            _check_text(t)
        return texts

    def _is_local(self, text: str) -> bool:
        if len(text) >= C.LOCAL_MAX_BYTES:
            return False
        return text.isascii() or len(text.encode("utf-8", "surrogatepass")) < C.LOCAL_MAX_BYTES

    def _runs_here(self, text: str) -> bool:
        """Stateless placement: short texts always run in the caller; longer ones where the cost
        model (scheduler/placement.py) expects them to finish first."""
        if self._is_local(text):
            return True
        if not self.admission or not self._placement_enabled:
            return False
        if getattr(self._local.engine_switch.current, "fast", None) is not None and not self._fast_seen:
            self._fast_seen = True  # the caller's engine just became the fast tier: start from its speed
            self._placement.local_chars_per_ms = max(self._placement.local_chars_per_ms, C.FAST_CHARS_PER_MS)
        return self._placement.run_local(len(text), self._slots())

    def _encode_here(self, text: str, add_special_tokens: bool):
        t0 = time.perf_counter()
        out = self._local.encode(text, add_special_tokens=add_special_tokens)
        self._placement.observe_local(len(text), (time.perf_counter() - t0) * 1e3)
        self._placement.remote_chars_per_ms = self._placement.local_chars_per_ms  # workers run the same engine
        self._count("placed_here")
        return out

    def _call(self, coro):
        if self._closed:
            coro.close()
            raise PoolClosed("the pool is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _call_async(self, coro):
        if self._closed:
            coro.close()
            raise PoolClosed("the pool is closed")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def _count(self, path: str) -> None:
        self.stats[path] = self.stats.get(path, 0) + 1
        metrics.record_path(path)

    def _live_workers(self) -> dict[str, Any]:
        return {wid: self._workers[wid] for wid in self._dispatcher.workers}

    def _finish(self, ids: np.ndarray, add_special_tokens: bool) -> pa.Int32Array:
        return to_arrow(self._local._finish(ids, add_special_tokens))

    def _finish_parts(self, parts, add_special_tokens: bool) -> pa.ChunkedArray:
        """A session's IDs as zero-copy chunks (as DeltaTokenizer returns them), template included."""
        return self._local.session_arrow((parts,) if isinstance(parts, np.ndarray) else parts, add_special_tokens)

    # -- request coroutines (run on the pool's loop) ------------------------------------------------
    async def _encode(self, text: str, session: str | None, add: bool) -> pa.Int32Array:
        if session is None:
            if len(text) >= self._opts["cut_threshold"] and self.admission:
                return await self._stateless_chunked(text, add)
            session = "content:" + content_key(text)  # keyless: sticky by content, reusable
        return await self._session(session, text, add)

    async def _session(self, key: str, text: str, add: bool) -> pa.Int32Array:
        async with self._session_lock(key):
            if not self.admission:
                ids = await self._run("session", len(text), key, ("encode_reference", key, text, add),
                                      fallback=lambda: self._local.encode_ids(text, session=key, add_special_tokens=add),
                                      share_of=text)
                self._count("reference")
                return to_arrow(ids)
            home = self._dispatcher.home_of(key) if self._dispatcher.workers else None
            if home is not None and len(text) >= self._opts["cut_threshold"] and self._known.get(key) != home:
                ids = await self._chunked_init(key, text)
                self._count("chunked_init")
                return self._finish_parts(ids, add)
            known = self._mirror.get(key)
            sent = self._texts.get(key)
            version = self._versions.get(key)
            sent_chars = sum(map(len, sent[1])) if sent is not None else 0
            if sent is not None and version is not None and sent[0] == version and len(text) > sent_chars \
                    and rope_is_prefix(sent[1], sent_chars, text):
                # The text extends what this session last sent: ship only the suffix, as extend does.
                delta = text[sent_chars:]
                call = ("extend", key, delta, known[0] if known else None, version)
                try:
                    ids = await self._run("session", len(delta), key, call, share_of=delta,
                                          fallback=lambda: self._local.encode_ids(text, session=key,
                                                                                  add_special_tokens=False))
                except SessionNotFound:  # evicted, moved or changed on the worker: send it whole
                    self._texts.pop(key)
                else:
                    self._texts.put(key, self._versions.get(key), sent[1] + (delta,))
                    self._count("session_delta")
                    return self._finish_parts(ids, add)
                known = self._mirror.get(key)
            call = ("encode_session", key, text, known[0] if known else None)
            ids = await self._run("session", len(text), key, call, share_of=text,
                                  fallback=lambda: self._local.encode_ids(text, session=key, add_special_tokens=False))
            self._texts.put(key, self._versions.get(key), (text,))
            self._count("session")
            return self._finish_parts(ids, add)

    async def _extend_tail(self, key: str, delta: str, add: bool) -> tuple[int, int, np.ndarray]:
        """Extend, answering only what changed: (start, count, IDs from start on)."""
        ids = await self._extend(key, delta, add)
        k = self._starts.pop(_kid(key), 0)
        adm = self._local.admission
        start = k + len(adm.prefix_ids) if add and k else k
        return start, len(ids), ids.slice(start).to_numpy()  # copies the tail only

    async def _extend(self, key: str, delta: str, add: bool) -> pa.Int32Array:
        def no_fallback():
            raise SessionNotFound(f"session {key!r} timed out on its worker: send the whole text "
                                  "with encode(text, session=...)")
        async with self._session_lock(key):
            if not self.admission:
                ids = await self._run("session", len(delta), key, ("extend_reference", key, delta, add),
                                      fallback=no_fallback, share_of=delta)
                return to_arrow(ids)
            known = self._mirror.get(key)
            sent = self._texts.get(key)
            version = self._versions.get(key)
            call = ("extend", key, delta, known[0] if known else None, version)
            ids = await self._run("session", len(delta), key, call,
                                  fallback=no_fallback, share_of=delta)
            if sent is not None and sent[0] == version:
                self._texts.put(key, self._versions.get(key), sent[1] + (delta,))
            else:
                self._texts.pop(key)
            self._count("extend")
            return self._finish_parts(ids, add)

    def _session_lock(self, key: str) -> "_KeyLock":
        return _KeyLock(self._session_locks, key)

    def _splice(self, key: str, answer) -> tuple:
        """Turn a worker's (version, k, tail) into the session's IDs (a rope: the kept prefix of the
        mirror, not copied, plus the tail) and remember them."""
        version, k, tail = answer
        known = self._mirror.pop(key, None)
        tail = np.asarray(tail, dtype=np.int32)
        if k:
            if known is None:  # cannot happen: k > 0 only answers a version we sent
                raise RuntimeError("worker answered a delta for IDs this pool does not hold")
            parts = merge_id_parts(list(prefix_parts(known[1], k)) + [tail])
        else:
            parts = (tail,)
        self._mirror.put(key, version, parts)
        self._remember(key, self._dispatcher.home_of(key), version)
        self._starts[_kid(key)] = k  # IDs before k are the ones this pool returned last time
        return parts

    def _slots(self) -> int:
        """Parallel execution slots for planning chunks: Ray task slots, plus the live workers
        when they take shared work too."""
        workers = self.num_workers if self._opts.get("workers_take_shared", True) else 0
        return max(1, workers + self._opts["max_inflight_tasks"])

    async def _stateless_chunked(self, text: str, add: bool) -> pa.Int32Array:
        t0 = time.perf_counter()
        try:
            return await self._stateless_chunked_run(text, add)
        finally:
            self._placement.observe_remote(len(text), self._slots(), (time.perf_counter() - t0) * 1e3)

    async def _stateless_chunked_run(self, text: str, add: bool) -> pa.Int32Array:
        workers = self._slots()
        cuts = plan_cuts(text, self._local.predicate, self._local.config, workers)
        metrics.record_cut_misses(chunk_count(len(text), self._local.config, workers) - 1 - len(cuts))
        bounds = [0] + [c.pos for c in cuts] + [len(text)]
        arrays = await self._pieces([text[s:e] for s, e in zip(bounds, bounds[1:])])
        self._count("chunked" if cuts else "whole")
        return self._finish(concat_ids(arrays), add)

    async def _chunked_init(self, key: str, text: str) -> np.ndarray:
        """A long session's first encode: chunks in parallel, then the home worker adopts the state."""
        plan = plan_repair(text, None, 0, self._local.predicate, self._local.config,
                           self._slots(), self._local.margin)
        arrays = await self._pieces(plan.pieces)
        res = finish_repair(plan, arrays)
        self._mirror.pop(key, None)
        try:
            seal = seal_state(self.secret, key, res.state)
            await self._run("session", 0, key, ("install", key, res.state, seal), fallback=lambda: True)
            self._remember(key, self._dispatcher.home_of(key), res.state.version)
            self._mirror.put(key, res.state.version, res.state.id_parts)
            self._texts.put(key, res.state.version, (text,))
        except Exception:  # the next request re-initializes on whichever worker is home then
            log.warning("installing session %r failed; it will re-initialize", key, exc_info=True)
            self._forget(key)
        return res.state.id_parts

    async def _pieces(self, pieces: list[str]) -> list[np.ndarray]:
        total = sum(map(len, pieces))

        async def one(piece: str) -> np.ndarray:
            out = await self._run("chunk", len(piece), None, ("pieces", piece), request_chars=max(1, total),
                                  fallback=lambda: self._local.encoder.encode_pieces([piece]), share_of=piece)
            return out[0]
        return list(await asyncio.gather(*(one(p) for p in pieces)))

    async def _encode_batch(self, texts: list[str], add: bool) -> list[pa.Int32Array]:
        async def one(t: str) -> pa.Int32Array:
            if self._is_local(t) or not self.admission:
                return await asyncio.to_thread(self._local.encode, t, add_special_tokens=add)
            if len(t) >= self._opts["cut_threshold"]:
                return await self._stateless_chunked(t, add)
            arrays = await self._pieces([t])
            return self._finish(arrays[0], add)
        return list(await asyncio.gather(*(one(t) for t in texts)))

    def _remember(self, key: str, wid: str, version: int) -> None:
        self._known.put(key, wid)
        self._versions.put(key, version)

    # -- dispatch ----------------------------------------------------------------------------------
    async def _run(self, kind: str, n_chars: int, key: str | None, call: tuple, *, fallback, share_of: str = "",
                   request_chars: int | None = None):
        """Queue one task, wait for it; past the timeout after dispatch, run ``fallback`` in-process."""
        if not self._dispatcher.workers and (kind == "session" or self._opts["max_inflight_tasks"] == 0):
            self._count("no_workers_fallback")
            return await asyncio.to_thread(fallback)
        req = _Request(self._loop)
        with self._lock:
            task = self._dispatcher.submit(kind, max(1, n_chars), session_key=key,
                                           nonascii_share=nonascii_share(share_of) if share_of else 0.0,
                                           payload=call, request_chars=request_chars)
            self._requests[task.id] = req
        self._pump()
        await req.dispatched.wait()
        # A timer rather than wait_for(shield(...)): two fewer tasks and loop turns per request,
        # which is a measurable share of a 1 ms extend.
        timer = self._loop.call_later(self.request_timeout_s, self._expire, req)
        try:
            return await req.future
        except (_NoWorkers, _NoAnswer) as exc:
            if isinstance(exc, _NoWorkers):
                self._count("no_workers_fallback")
            else:
                self._count("timeout_fallback")
                log.warning("task %s had no answer after %.0f s; encoding in-process", task.id,
                            self.request_timeout_s)
                self._requests.pop(task.id, None)
                self._free_hung(task, req)
            if key is not None:
                self._forget(key)
            return await asyncio.to_thread(fallback)
        finally:
            timer.cancel()

    def _free_hung(self, task, req: _Request) -> None:
        """Take a task with no answer off its slot, so nothing queues behind it forever.

        A worker that holds a task this long is hung (or far slower than any encode should be):
        it is retired like a dead one (killed if this pool started it) and its sessions move to
        their new homes. A hung chunk task is cancelled and its slot freed.
        """
        with self._lock:
            running, wid = self._dispatcher.running_where(task.id)
            if not running:
                return
            self._dispatcher.fail(task.id)
        if wid is not None and self._retire(wid):
            log.warning("retired worker %s: no answer within %.0f s", wid, self.request_timeout_s)
            if self._owner:
                try:
                    ray.kill(self._workers[wid])
                except Exception:  # noqa: BLE001 - already gone
                    pass
        elif req.ref is not None:
            try:
                ray.cancel(req.ref, force=True)
            except Exception:  # noqa: BLE001 - best effort: the slot is free either way
                pass
        self._pump()

    def _retire(self, wid: str) -> bool:
        """Retire a dead or hung worker: its queue moves to the sessions' new homes and what it was
        running is retried there. Returns False when it was retired already."""
        with self._lock:
            if wid not in self._dispatcher.workers:
                return False
            for t in self._dispatcher.retire_worker(wid):
                self._dispatcher.requeue(t)
        self._channels.pop(wid, None)
        self._count("worker_retired")
        self._orphans()
        return True

    def _forget(self, key: str) -> None:
        """Drop what this pool believes about a session's worker state (it is unknown now)."""
        self._mirror.pop(key, None)
        self._known.pop(key, None)
        self._versions.pop(key, None)
        self._texts.pop(key)

    def _orphans(self) -> None:
        """With no live worker left, queued session requests are served in-process, not kept
        waiting for a worker that will not come."""
        if self._dispatcher.workers:
            return
        log.error("the pool has no live worker left; session requests are encoded in-process")
        with self._lock:
            tasks = self._dispatcher.take_homeless()
        for t in tasks:
            req = self._requests.pop(t.id, None)
            if req is not None:
                req.dispatched.set()
                if not req.future.done():
                    req.future.set_exception(_NoWorkers())

    @staticmethod
    def _expire(req: _Request) -> None:
        if not req.future.done():
            req.future.set_exception(_NoAnswer())

    def _pump(self) -> None:
        with self._lock:
            assignments = self._dispatcher.dispatch()
        for wid, task in assignments:
            self._launch(wid, task)

    def _launch(self, wid: str | None, task) -> None:
        method, *args = task.payload
        client = self._channels.get(wid) if wid is not None and method in CHANNEL_METHODS else None
        if client is not None and not client.closed:
            req = self._requests.get(task.id)
            if req is not None:
                req.dispatched.set()
            self._loop.create_task(self._via_channel(client, wid, task, method, tuple(args)))
            return
        self._launch_ray(wid, task)

    async def _via_channel(self, client: ChannelClient, wid: str, task, method: str, args: tuple) -> None:
        """Run a session call over the side channel; on a lost connection, let Ray decide.

        A lost connection says nothing certain: ask Ray whether the actor is alive. Dead: the
        usual retire-and-retry path. Alive: a whole-text call is re-run through Ray (idempotent);
        an extend might or might not have been applied, so the worker drops the session and the
        caller gets SessionNotFound (send the whole text), never a guess.
        """
        t0 = time.perf_counter()
        try:
            outcome = await client.call(method, args)
        except ChannelClosed:
            self._channels.pop(wid, None)
            try:
                await asyncio.wrap_future(self._workers[wid].ready.remote().future())
            except Exception as exc:  # noqa: BLE001 - an actor error is handled by _on_done
                self._on_done(task, wid, t0, exc)
                return
            log.warning("lost the side channel to live worker %s; using Ray calls", wid)
            if method in ("extend", "extend_reference"):
                key = args[0]
                self._forget(key)
                try:
                    await asyncio.wrap_future(self._workers[wid].drop_session.remote(key).future())
                except Exception:  # noqa: BLE001 - died since: its sessions are gone anyway
                    pass
                self._on_done(task, wid, t0, SessionNotFound(
                    f"session {key!r}: the connection to its worker was lost mid-extend; "
                    "send the whole text with encode(text, session=...)"))
                return
            self._launch_ray(wid, task)
            return
        except Exception as exc:  # noqa: BLE001 - the worker's own error, as a Ray call would raise it
            outcome = exc
        self._on_done(task, wid, t0, outcome)

    def _launch_ray(self, wid: str | None, task) -> None:
        method, *args = task.payload
        try:
            if wid is None:
                ref = self._chunk_task(args[0])
            elif method == "pieces":
                ref = self._workers[wid].encode_pieces.remote([args[0]])
            else:
                ref = getattr(self._workers[wid], method).remote(*args)
        except Exception as exc:  # e.g. a handle to an actor already known dead
            self._on_done(task, wid, time.perf_counter(), exc)
            return
        t0 = time.perf_counter()
        req = self._requests.get(task.id)
        if req is not None:
            req.dispatched.set()
            req.ref = ref
        fut = asyncio.wrap_future(ref.future(), loop=self._loop)
        fut.add_done_callback(lambda f: self._on_done(task, wid, t0, f.exception() or f.result()))

    def _on_done(self, task, wid: str | None, t0: float, outcome) -> None:
        ms = (time.perf_counter() - t0) * 1e3
        metrics.record_times(task.kind, self._dispatcher.clock.now_ms() - ms - task.arrival_ms, ms)
        req = self._requests.get(task.id)
        if isinstance(outcome, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)) and wid is not None:
            if self._retire(wid):
                log.warning("worker %s died; retired it and retrying its tasks", wid)
            else:
                with self._lock:
                    if self._dispatcher.fail(task.id, requeue=True) is None and req is not None:
                        self._dispatcher.requeue(task)  # launched on a worker retired meanwhile
            self._pump()
            return
        if not isinstance(outcome, BaseException) and task.payload[0] in ("encode_session", "extend"):
            try:
                outcome = self._splice(task.payload[1], outcome)
            except Exception as exc:  # noqa: BLE001 - surfaced to the caller
                outcome = exc
        with self._lock:
            if isinstance(outcome, BaseException):
                self._dispatcher.fail(task.id)
            else:
                self._dispatcher.complete(task.id, ms)
        self._requests.pop(task.id, None)
        if req is not None and not req.future.done():  # later answers for a failed request are dropped
            if isinstance(outcome, BaseException):
                cause = getattr(outcome, "cause", None)
                req.future.set_exception(cause if isinstance(cause, BaseException) else outcome)
            else:
                req.future.set_result(outcome)
        self._pump()
