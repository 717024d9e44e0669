"""How the pool's calls are executed: queue, dispatch, timers, retries, retired workers, orphans.

:class:`CallRunner` takes a :class:`~delta_ray.actors.calls.Call` and returns its answer; what the
call means (which call a request needs, how its answer becomes the session's IDs) is the
orchestrator's (actors/orchestrator.py), handed in as three hooks: ``merge`` turns a worker's
session answer into what its caller gets, ``forget`` drops what the pool believed about a
session whose worker state became unknown, ``count`` records a path.

Every failure costs time, never exactness: a dead worker is retired and its calls are retried on
the sessions' new homes; a call with no answer within ``request_timeout_s`` runs its in-process
``fallback`` (and its hung worker is retired); an extend whose connection dropped mid-call is
refused with ``SessionNotFound`` (it may or may not have been applied); with no live worker left,
queued session calls run their fallbacks instead of waiting.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable

from delta_ray._core.config import PoolConfig
from delta_ray._core.keys import describe
from delta_ray._core.session_store import SessionNotFound
from delta_ray.scheduler import Dispatcher, nonascii_share

from .calls import DROP_SESSION, Call, DropArgs
from .transport import HUNG, ConnectionLost, NoAnswer, WorkerDead, WorkerTransport

log = logging.getLogger("delta_ray.pool")


class _NoWorkers(Exception):
    """Set on a queued session request's future when the pool has no live worker left."""


class _Request:
    """A future, whether its task was handed to a transport (for the timeout), and the running call."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.future: asyncio.Future = loop.create_future()
        self.dispatched = asyncio.Event()
        self.running: asyncio.Task | None = None  # cancelled when the call hangs


class CallRunner:
    """Runs calls on the dispatcher's workers over a transport, on one event loop.

    ``merge(call, answer, wid)`` is applied to worker ``wid``'s successful answer while its caller still
    waits (a late answer is never merged: it would record a state its caller never received);
    ``forget(key)`` is called when a session's worker state became unknown; ``count(path)``
    records a path; ``record`` takes the timings (actors/metrics.py).
    """

    def __init__(self, transport: WorkerTransport, dispatcher: Dispatcher, config: PoolConfig,
                 loop: asyncio.AbstractEventLoop, *, merge: Callable[[Call, Any, str | None], Any],
                 forget: Callable[[str], None], count: Callable[[str], None], record: Any):
        self.transport = transport
        self.dispatcher = dispatcher
        self.config = config  # read per call: request_timeout_s, max_inflight_tasks
        self._loop = loop
        self._merge, self._forget, self._count, self._record = merge, forget, count, record
        self._lock = threading.Lock()  # guards the dispatcher against the loop and callers
        self._requests: dict[int, _Request] = {}

    async def run(self, kind: str, n_chars: int, call: Call, *, fallback: Callable[[], Any],
                  share_of: str = "", request_chars: int | None = None):
        """Queue one call, wait for it; past the timeout after dispatch, run ``fallback`` in-process."""
        if not self.dispatcher.workers and (kind == "session" or self.config.max_inflight_tasks == 0):
            self._count("no_workers_fallback")
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
                self._count("no_workers_fallback")
            else:
                self._count("timeout_fallback")
                log.warning("task %s had no answer after %.0f s; encoding in-process", task.id,
                            self.config.request_timeout_s)
                self._requests.pop(task.id, None)
                self._free_hung(task, req)
            if call.key is not None:
                self._forget(call.key)
            return await asyncio.to_thread(fallback)
        finally:
            timer.cancel()

    def waiting(self) -> int:
        """How many calls are queued or running for a caller that still waits."""
        return len(self._requests)

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
        return SessionNotFound(f"{describe(call.key)}: the connection to its worker was lost mid-extend; "
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
            req.running.cancel(HUNG)
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
        self._count("worker_retired")
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
        # Only an answer its caller still waits for is merged into the pool's tables: a late one
        # (the caller timed out and was answered in-process, and its session forgotten) would
        # record a state version and IDs the caller never received.
        waiting = req is not None and not req.future.done()
        if waiting and not isinstance(outcome, BaseException):
            try:
                outcome = self._merge(call, outcome, wid)
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
