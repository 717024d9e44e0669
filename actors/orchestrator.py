"""The pool's orchestrator: routing, plans, the session mirrors and locks, and the failure policy.

It runs on one asyncio loop and reaches workers only through a
:class:`~delta_ray.actors.transport.WorkerTransport`, so it holds no Ray handle and its fault
handling (dead worker, hung worker, lost connection, timeout) is tested in milliseconds on an
in-process fake transport. Requests follow the core's one path: :class:`delta_ray.core.plan.Router`
decides, ``TokenizerCore.plan`` / ``plan_session_init`` cut, the dispatcher runs the pieces, and
``TokenizerCore.finish`` / ``session_arrow`` assemble, exactly as in process.

Every failure costs time, never exactness: a dead worker's calls are retried on the session's new
home; a call with no answer within ``request_timeout_s`` is encoded in this process; an extend
that may or may not have been applied is refused with ``SessionNotFound`` (send the whole text).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from delta_ray.core import constants as C
from delta_ray.core.assembly import concat_ids, to_arrow
from delta_ray.core.config import PoolConfig
from delta_ray.core.plan import CHUNKED, REFERENCE, SESSION, Router
from delta_ray.core.repair import finish_repair
from delta_ray.core.session_store import (SessionNotFound, merge_id_parts, merge_text_parts, prefix_parts,
                                     rope_is_prefix)
from delta_ray.core.state_seal import seal_state
from delta_ray.tokenizer_core import TokenizerCore
from delta_ray.scheduler import Dispatcher, PlacementModel, content_key, nonascii_share

from . import metrics
from .calls import (DROP_SESSION, ENCODE_PIECES, ENCODE_SESSION, ENCODE_WHOLE, EXTEND, INSTALL, Call, DropArgs,
                    ExtendArgs, InstallArgs, PiecesArgs, SessionArgs, WholeArgs)
from .session_table import SessionTable, key_id
from .tenant_keys import content_session_key
from .transport import ConnectionLost, NoAnswer, WorkerDead, WorkerTransport

log = logging.getLogger("delta_ray.pool")


class _NoWorkers(Exception):
    """Set on a queued session request's future when the pool has no live worker left."""


class _Request:
    """A future, whether its task was handed to a transport (for the timeout), and the running call."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.future: asyncio.Future = loop.create_future()
        self.dispatched = asyncio.Event()
        self.running: asyncio.Task | None = None  # cancelled when the call hangs


class _KeyLock:
    """Serializes one session's requests (extend order matters); forgets idle keys."""

    def __init__(self, locks: dict, key: str):
        self._locks, self._key = locks, key_id(key)

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


class PoolOrchestrator:
    """Everything the pool decides, on one event loop, over a transport.

    ``local`` is the caller-side tokenizer (planning, short texts, the in-process fail-over);
    ``config`` a resolved :class:`~delta_ray.core.config.PoolConfig`. Coroutines must run on ``loop``.
    """

    def __init__(self, local: TokenizerCore, transport: WorkerTransport, worker_ids: Sequence[str],
                 config: PoolConfig, loop: asyncio.AbstractEventLoop, secret: bytes, *,
                 record: Any = metrics, clock=None):
        self.local = local
        self.transport = transport
        self.config = config
        self.secret = secret
        self._loop = loop
        self._record = record
        self.admitted = bool(local.admission)
        # Keyless texts under the cut threshold are sticky by content on a worker (inside their
        # tenant), so a repeated prompt finds its state; longer ones are chunked over the cluster.
        self.router = Router(self.admitted, local.config.cut_threshold, content_reuse=True,
                             content_below=local.config.cut_threshold)
        self.dispatcher = Dispatcher(config.policy, workers=list(worker_ids),
                                     max_inflight_tasks=config.max_inflight_tasks,
                                     workers_take_shared=config.workers_take_shared, clock=clock)
        self._lock = threading.Lock()  # guards the dispatcher against the loop and callers
        self._requests: dict[int, _Request] = {}
        self._session_locks: dict[bytes, list] = {}
        # One record per session (actors/session_table.py), evicted whole, bounded by count and bytes;
        # each view below reads and writes one of its fields.
        self.sessions = SessionTable(C.MIRROR_BYTES + C.TEXT_MIRROR_BYTES, C.KNOWN_SESSIONS)
        self._known = self.sessions.field("worker")  # the worker believed to hold it
        self._mirror = self.sessions.field("ids")  # (state version, IDs) this pool last returned
        # the version of the state this pool last saw: an extend must extend exactly that one
        self._versions = self.sessions.field("version")
        self._texts = self.sessions.field("text")  # (version, text parts) last sent, to ship deltas
        self._starts = self.sessions.field("start")  # the first ID that changed in its last answer
        self.placement = PlacementModel()
        self._fast_seen = False
        self.stats: dict[str, int] = {}

    # -- what callers use --------------------------------------------------------------------------
    @property
    def num_workers(self) -> int:
        return len(self.dispatcher.workers)

    def runs_here(self, text: str) -> bool:
        """Stateless placement: short texts always run in the caller; longer ones where the cost
        model (scheduler/placement.py) expects them to finish first."""
        if self.router.is_small(text):
            return True
        if not self.admitted or not self.config.placement:
            return False
        if self.local.uses_fast_engine and not self._fast_seen:
            self._fast_seen = True  # the caller's engine just became the fast tier: start from its speed
            self.placement.local_chars_per_ms = max(self.placement.local_chars_per_ms, C.FAST_CHARS_PER_MS)
        return self.placement.run_local(len(text), self._slots())

    def encode_here(self, text: str, add: bool) -> pa.Int32Array:
        t0 = time.perf_counter()
        out = self.local.encode(text, add_special_tokens=add)
        self.placement.observe_local(len(text), (time.perf_counter() - t0) * 1e3)
        self.placement.remote_chars_per_ms = self.placement.local_chars_per_ms  # workers run the same engine
        self.count("placed_here")
        return out

    async def encode(self, text: str, session: str | None, add: bool, *, tenant: str | None = None):
        """A text's IDs: its session, or keyless (chunked, whole, or sticky by content inside ``tenant``)."""
        path = self.router.route(text, session)
        if path is SESSION:
            return await self._session(session, text, add)
        if path is CHUNKED:
            return await self._stateless_chunked(text, add)
        if path is REFERENCE:
            return to_arrow(await self._whole(text, add))
        # The content key carries the tenant (the one injective namespace Serve's replicas use too):
        # a keyless prompt never finds another tenant's state on a worker, so timing reveals nothing.
        return await self._session(content_session_key(content_key(text), tenant), text, add)

    async def extend(self, key: str, delta: str, add: bool):
        def no_fallback():
            raise SessionNotFound(f"session {key!r} timed out on its worker: send the whole text "
                                  "with encode(text, session=...)")
        async with _KeyLock(self._session_locks, key):
            if not self.admitted:
                return to_arrow(await self._extend_unadmitted(key, delta, add))
            known = self._mirror.get(key)
            sent = self._texts.get(key)
            version = self._versions.get(key)
            call = Call(EXTEND, ExtendArgs(key, delta, known_version=known[0] if known else None, expect_version=version), key)
            ids = await self._run("session", len(delta), call, fallback=no_fallback, share_of=delta)
            if sent is not None and sent[0] == version:
                self._texts.put(key, self._versions.get(key), merge_text_parts(sent[1] + (delta,)))
            else:
                self._texts.pop(key)
            self.count("extend")
            return self.local.session_arrow(ids, add)

    async def extend_tail(self, key: str, delta: str, add: bool) -> tuple[int, int, np.ndarray]:
        """Extend, answering only what changed: (start, count, IDs from start on)."""
        ids = await self.extend(key, delta, add)
        k = self._starts.pop(key, 0)
        start = self.local.template.when(add).start(k)
        return start, len(ids), ids.slice(start).to_numpy()  # copies the tail only

    async def encode_batch(self, texts: list[str], add: bool) -> list[pa.Int32Array]:
        async def one(t: str) -> pa.Int32Array:
            if self.router.is_small(t):
                return await asyncio.to_thread(self.local.encode, t, add_special_tokens=add)
            path = self.router.route(t, None)
            if path is REFERENCE:
                return to_arrow(await self._whole(t, add))
            if path is CHUNKED:
                return await self._stateless_chunked(t, add)
            return await self._stateless(t, add)  # no content reuse for batches: each text once
        return list(await asyncio.gather(*(one(t) for t in texts)))

    def count(self, path: str) -> None:
        self.stats[path] = self.stats.get(path, 0) + 1
        self._record.record_path(path)

    # -- request paths -------------------------------------------------------------------------------
    def _slots(self) -> int:
        """Parallel execution slots for planning chunks: Ray task slots, plus the live workers
        when they take shared work too."""
        workers = self.num_workers if self.config.workers_take_shared else 0
        return max(1, workers + self.config.max_inflight_tasks)

    async def _stateless_chunked(self, text: str, add: bool) -> pa.Int32Array:
        t0 = time.perf_counter()
        try:
            return await self._stateless(text, add)
        finally:
            self.placement.observe_remote(len(text), self._slots(), (time.perf_counter() - t0) * 1e3)

    async def _stateless(self, text: str, add: bool) -> pa.Int32Array:
        slots = self._slots()
        plan = self.local.plan(text, slots)
        self._record.record_cut_misses(self.local.missed_cuts(text, plan, slots))
        arrays = await self._pieces(plan.pieces)
        self.count("chunked" if plan.cuts else "whole")
        return to_arrow(self.local.finish(concat_ids(arrays), add))

    async def _whole(self, text: str, add: bool) -> np.ndarray:
        """An unadmitted configuration's plan: the reference encodes the text whole, template included."""
        call = Call(ENCODE_WHOLE, WholeArgs(text, add_special_tokens=add))
        out = await self._run("chunk", len(text), call, share_of=text,
                              fallback=lambda: self.local.encode_by_reference(text, add))
        self.count("reference")
        return out

    async def _extend_unadmitted(self, key: str, delta: str, add: bool) -> np.ndarray:
        sent = self._texts.get(key)
        if sent is None:
            raise SessionNotFound(f"session {key!r} is not held (unknown or evicted): "
                                  "send the whole text with encode(text, session=...)")
        parts = merge_text_parts(sent[1] + (delta,))
        ids = await self._whole("".join(parts), add)
        self._texts.put(key, 0, parts)
        self.count("extend")
        return ids

    async def _session(self, key: str, text: str, add: bool):
        async with _KeyLock(self._session_locks, key):
            if not self.admitted:  # no repairs: one whole encode; the text is kept for extend
                ids = await self._whole(text, add)
                self._texts.put(key, 0, (text,))
                return to_arrow(ids)
            home = self.dispatcher.home_of(key) if self.dispatcher.workers else None
            if home is not None and len(text) >= self.local.config.cut_threshold and self._known.get(key) != home:
                parts = await self._chunked_init(key, text)
                self.count("chunked_init")
                return self.local.session_arrow(parts, add)
            known = self._mirror.get(key)
            sent = self._texts.get(key)
            version = self._versions.get(key)
            sent_chars = sum(map(len, sent[1])) if sent is not None else 0
            if sent is not None and version is not None and sent[0] == version and len(text) > sent_chars \
                    and rope_is_prefix(sent[1], sent_chars, text):
                # The text extends what this session last sent: ship only the suffix, as extend does.
                delta = text[sent_chars:]
                call = Call(EXTEND, ExtendArgs(key, delta, known_version=known[0] if known else None, expect_version=version), key)
                try:
                    ids = await self._run("session", len(delta), call, share_of=delta,
                                          fallback=lambda: self._encode_fallback(key, text))
                except SessionNotFound:  # evicted, moved or changed on the worker: send it whole
                    self._texts.pop(key)
                else:
                    # text == recorded + delta (checked above): keep the caller's string, no join
                    self._texts.put(key, self._versions.get(key), (text,))
                    self.count("session_delta")
                    return self.local.session_arrow(ids, add)
                known = self._mirror.get(key)
            call = Call(ENCODE_SESSION, SessionArgs(key, text, known_version=known[0] if known else None), key)
            ids = await self._run("session", len(text), call, share_of=text,
                                  fallback=lambda: self._encode_fallback(key, text))
            self._texts.put(key, self._versions.get(key), (text,))
            self.count("session")
            return self.local.session_arrow(ids, add)

    def _encode_fallback(self, key: str, text: str) -> tuple:
        return (self.local.encode_ids(text, session=key, add_special_tokens=False),)

    async def _chunked_init(self, key: str, text: str) -> tuple:
        """A long session's first encode: chunks in parallel, then the home worker adopts the state."""
        plan = self.local.plan_session_init(text, self._slots())
        arrays = await self._pieces(plan.pieces)
        res = finish_repair(plan, arrays)
        self._mirror.pop(key, None)
        try:
            seal = seal_state(self.secret, key, res.state)
            await self._run("session", 0, Call(INSTALL, InstallArgs(key, res.state, seal), key), fallback=lambda: True)
            self._remember(key, self.dispatcher.home_of(key), res.state.version)
            self._mirror.put(key, res.state.version, res.state.id_parts)
            self._texts.put(key, res.state.version, (text,))
        except Exception:  # the next request re-initializes on whichever worker is home then
            log.warning("installing session %r failed; it will re-initialize", key, exc_info=True)
            self._forget(key)
        return res.state.id_parts

    async def _pieces(self, pieces: list[str]) -> list[np.ndarray]:
        total = sum(map(len, pieces))

        async def one(piece: str) -> np.ndarray:
            out = await self._run("chunk", len(piece), Call(ENCODE_PIECES, PiecesArgs([piece])), request_chars=max(1, total),
                                  fallback=lambda: self.local.run_pieces([piece]), share_of=piece)
            return out[0]
        return list(await asyncio.gather(*(one(p) for p in pieces)))

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
        self._remember(key, self.dispatcher.home_of(key), version)
        self._starts.put(key, k)  # IDs before k are the ones this pool returned last time
        return parts

    def _remember(self, key: str, wid: str, version: int) -> None:
        self._known.put(key, wid)
        self._versions.put(key, version)

    def _forget(self, key: str) -> None:
        """Drop what this pool believes about a session's worker state (it is unknown now)."""
        self.sessions.forget(key)

    # -- dispatch and the failure policy ------------------------------------------------------------
    async def _run(self, kind: str, n_chars: int, call: Call, *, fallback: Callable[[], Any],
                   share_of: str = "", request_chars: int | None = None):
        """Queue one call, wait for it; past the timeout after dispatch, run ``fallback`` in-process."""
        if not self.dispatcher.workers and (kind == "session" or self.config.max_inflight_tasks == 0):
            self.count("no_workers_fallback")
            return await asyncio.to_thread(fallback)
        req = _Request(self._loop)
        with self._lock:
            task = self.dispatcher.submit(kind, max(1, n_chars), session_key=call.key,
                                          nonascii_share=nonascii_share(share_of) if share_of else 0.0,
                                          payload=call, request_chars=request_chars)
            self._requests[task.id] = req
        self._pump()
        await req.dispatched.wait()
        # A timer rather than wait_for(shield(...)): two fewer tasks and loop turns per request,
        # which is a measurable share of a 1 ms extend.
        timer = self._loop.call_later(self.config.request_timeout_s, self._expire, req)
        try:
            return await req.future
        except (_NoWorkers, NoAnswer) as exc:
            if isinstance(exc, _NoWorkers):
                self.count("no_workers_fallback")
            else:
                self.count("timeout_fallback")
                log.warning("task %s had no answer after %.0f s; encoding in-process", task.id,
                            self.config.request_timeout_s)
                self._requests.pop(task.id, None)
                self._free_hung(task, req)
            if call.key is not None:
                self._forget(call.key)
            return await asyncio.to_thread(fallback)
        finally:
            timer.cancel()

    @staticmethod
    def _expire(req: _Request) -> None:
        if not req.future.done():
            req.future.set_exception(NoAnswer())

    def _pump(self) -> None:
        while True:
            with self._lock:
                assignments = self.dispatcher.dispatch()
                # A task whose request is gone (it timed out while re-queued, or had no worker
                # left) must not run late: release its slot instead, and fill the slot again.
                abandoned = [t for _, t in assignments if t.id not in self._requests]
                for t in abandoned:
                    self.dispatcher.fail(t.id)
            for wid, task in assignments:
                req = self._requests.get(task.id)
                if req is None:
                    continue
                req.running = self._loop.create_task(self._execute(wid, task))
                req.dispatched.set()
            if not abandoned:
                return

    async def _execute(self, wid: str | None, task) -> None:
        call: Call = task.payload
        t0 = time.perf_counter()
        try:
            outcome = await self.transport.call(wid, call)
        except asyncio.CancelledError:
            return  # abandoned as hung: _free_hung took the task off its slot
        except WorkerDead:
            self._worker_died(wid, task)
            return
        except ConnectionLost:
            outcome = await self._lost_mid_call(wid, call)
        except Exception as exc:  # noqa: BLE001 - the worker's own error, for the caller
            outcome = exc
        self._on_done(task, wid, t0, outcome)

    def _worker_died(self, wid: str | None, task) -> None:
        """A dead worker is retired and what it ran is retried on the sessions' new homes."""
        if wid is not None and self._retire(wid):
            log.warning("worker %s died; retired it and retrying its tasks", wid)
        else:
            with self._lock:
                if self.dispatcher.fail(task.id, requeue=True) is None and task.id in self._requests:
                    self.dispatcher.requeue(task)  # launched on a worker retired meanwhile
        self._pump()

    async def _lost_mid_call(self, wid: str, call: Call) -> BaseException:
        """An extend may or may not have been applied: the worker drops the session and the caller
        gets SessionNotFound (send the whole text), never a guess."""
        self._forget(call.key)
        try:
            await self.transport.call(wid, Call(DROP_SESSION, DropArgs(call.key), call.key))
        except Exception:  # noqa: BLE001 - died since: its sessions are gone anyway
            pass
        return SessionNotFound(f"session {call.key!r}: the connection to its worker was lost mid-extend; "
                               "send the whole text with encode(text, session=...)")

    def _free_hung(self, task, req: _Request) -> None:
        """Take a task with no answer off its slot, so nothing queues behind it forever.

        A worker that holds a task this long is hung (or far slower than any encode should be):
        it is retired like a dead one (killed if this pool started it) and its sessions move to
        their new homes. A hung chunk task is abandoned (cancelled) and its slot freed.
        """
        with self._lock:
            running, wid = self.dispatcher.running_where(task.id)
            if not running:
                return
            self.dispatcher.fail(task.id)
        if req.running is not None:
            req.running.cancel()
        if wid is not None and self._retire(wid, kill=True):
            log.warning("retired worker %s: no answer within %.0f s", wid, self.config.request_timeout_s)
        self._pump()

    def _retire(self, wid: str, *, kill: bool = False) -> bool:
        """Retire a dead or hung worker: its queue moves to the sessions' new homes and what it was
        running is retried there. Returns False when it was retired already."""
        with self._lock:
            if wid not in self.dispatcher.workers:
                return False
            for t in self.dispatcher.retire_worker(wid):
                self.dispatcher.requeue(t)
        self.transport.retire(wid, kill=kill)
        self.count("worker_retired")
        self._orphans()
        return True

    def _orphans(self) -> None:
        """With no live worker left, queued session requests are served in-process, not kept
        waiting for a worker that will not come."""
        if self.dispatcher.workers:
            return
        log.error("the pool has no live worker left; session requests are encoded in-process")
        with self._lock:
            tasks = self.dispatcher.take_homeless()
        for t in tasks:
            req = self._requests.pop(t.id, None)
            if req is not None:
                req.dispatched.set()
                if not req.future.done():
                    req.future.set_exception(_NoWorkers())

    def _on_done(self, task, wid: str | None, t0: float, outcome) -> None:
        ms = (time.perf_counter() - t0) * 1e3
        self._record.record_times(task.kind, self.dispatcher.clock.now_ms() - ms - task.arrival_ms, ms)
        call: Call = task.payload
        req = self._requests.pop(task.id, None)
        # Only an answer its caller still waits for is spliced into the pool's tables: a late one
        # (the caller timed out and was answered in-process, and its session forgotten) would
        # record a state version and IDs the caller never received.
        waiting = req is not None and not req.future.done()
        if waiting and not isinstance(outcome, BaseException) and call.kind.session_delta:
            try:
                outcome = self._splice(call.key, outcome)
            except Exception as exc:  # noqa: BLE001 - surfaced to the caller
                outcome = exc
        with self._lock:
            if isinstance(outcome, BaseException):
                self.dispatcher.fail(task.id)
            else:
                self.dispatcher.complete(task.id, ms)
        if waiting:  # later answers for a failed request are dropped
            if isinstance(outcome, BaseException):
                req.future.set_exception(outcome)
            else:
                req.future.set_result(outcome)
        self._pump()
