"""The pool's asyncio loop in a background thread, and the hand-off of calls to it.

Every call handed to the loop is answered exactly once: with its result, with its error, or with
``PoolClosed`` when the pool closes first. A call in flight at ``close()``, or one that raced it,
never waits forever (before this module, a synchronous call in flight at close hung its caller).
"""
from __future__ import annotations

import _thread
import asyncio
import contextlib
import logging
import threading
from typing import Any, Callable, Coroutine

from delta_ray._core.errors import PoolClosed

log = logging.getLogger("delta_ray.pool")
_ANSWER_LOCK = _thread.allocate_lock()  # makes "answered at most once" atomic across threads


class _Call:
    """One coroutine handed to the loop, and how its caller is told the outcome."""

    __slots__ = ("coro", "task", "answered", "value", "exc", "notify")

    def __init__(self, coro: Coroutine, notify: Callable[["_Call"], None]):
        self.coro = coro
        self.task: asyncio.Task | None = None
        self.answered = False
        self.value: Any = None
        self.exc: BaseException | None = None
        self.notify = notify

    def answer(self, value: Any = None, exc: BaseException | None = None) -> None:
        """Record the outcome and notify the caller; every later answer is ignored."""
        with _ANSWER_LOCK:
            if self.answered:
                return
            self.answered = True
        self.value, self.exc = value, exc
        self.notify(self)

    def start(self) -> None:
        """On the loop: run the coroutine as a task that answers the caller when it ends."""
        try:
            self.task = asyncio.get_running_loop().create_task(self._run())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.coro.close()
            self.answer(exc=exc)

    async def _run(self) -> None:
        # The answer is given inside the task, not from a done callback: a callback runs one loop
        # iteration later, a share of every synchronous pool call. A task cancelled before its
        # first step never gets here; only close() (which answers every call left) or a caller that
        # gave up (nobody waits) cancels these tasks.
        try:
            value = await self.coro
        except asyncio.CancelledError:
            self.answer(exc=PoolClosed("the pool closed before this call finished"))
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.answer(exc=exc)
        else:
            self.answer(value=value)

    def cancel(self) -> None:
        """On the loop: the caller gave up, so the work stops too."""
        if self.task is not None:
            self.task.cancel()


class LoopThread:
    """An event loop running in a daemon thread; callers in other threads hand it coroutines."""

    def __init__(self, name: str = "delta-ray-pool"):
        self.loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._pending: set[_Call] = set()
        self._closed = False
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed

    def _submit(self, call: _Call) -> None:
        with self._lock:
            if self._closed:
                call.coro.close()
                raise PoolClosed("the pool is closed")
            self._pending.add(call)
        self.loop.call_soon_threadsafe(call.start)

    def _done(self, call: _Call) -> None:
        with self._lock:
            self._pending.discard(call)

    def run(self, coro: Coroutine) -> Any:
        """Run ``coro`` on the loop and wait in this thread for its outcome.

        The hand-back is a bare lock, not ``run_coroutine_threadsafe``'s two chained futures and a
        condition variable: a round trip to an idle loop thread is markedly shorter, and every
        synchronous pool call makes one.
        """
        done = _thread.allocate_lock()
        done.acquire()
        call = _Call(coro, lambda _c: done.release())
        self._submit(call)
        try:
            done.acquire()
        finally:
            self._done(call)
        if call.exc is not None:
            raise call.exc
        return call.value

    async def run_async(self, coro: Coroutine) -> Any:
        """Run ``coro`` on the loop and await its outcome from the caller's own loop.

        If the caller is cancelled (a client went away), the task on the pool's loop is cancelled too.
        """
        caller = asyncio.get_running_loop()
        fut = caller.create_future()

        def settle(c: _Call) -> None:
            if not fut.done():
                if c.exc is not None:
                    fut.set_exception(c.exc)
                else:
                    fut.set_result(c.value)

        def notify(c: _Call) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop is gone: nobody to tell
                caller.call_soon_threadsafe(settle, c)

        call = _Call(coro, notify)
        self._submit(call)
        try:
            return await fut
        except asyncio.CancelledError:
            if not call.answered:
                with contextlib.suppress(RuntimeError):
                    self.loop.call_soon_threadsafe(call.cancel)
            raise
        finally:
            self._done(call)

    def close(self, before_stop: Callable[[], None] | None = None, timeout_s: float = 10.0) -> None:
        """Cancel what runs on the loop, call ``before_stop`` there, stop the loop, and answer every
        call still waiting with ``PoolClosed`` (also when the loop is wedged and misses the stop)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True

        async def shutdown() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout_s / 2)
            if before_stop is not None:
                try:
                    before_stop()
                except Exception:  # noqa: BLE001 - the loop stops and the callers are answered anyway
                    log.warning("closing the pool's transport failed", exc_info=True)

        def begin() -> None:
            self.loop.create_task(shutdown()).add_done_callback(lambda _t: self.loop.stop())

        self.loop.call_soon_threadsafe(begin)
        self._thread.join(timeout_s)
        with self._lock:
            left = list(self._pending)
        for call in left:
            call.answer(exc=PoolClosed("the pool closed before this call finished"))
