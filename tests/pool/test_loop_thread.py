"""The pool's loop thread: every handed-off call is answered, also when the pool closes under it."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from delta_ray import SessionNotFound
from delta_ray._core.errors import PoolClosed
from delta_ray.actors.loop_thread import LoopThread


@pytest.fixture
def lt():
    t = LoopThread("test-loop")
    yield t
    t.close(timeout_s=2)


def _in_thread(fn):
    """Run ``fn`` in a daemon thread; returns (thread, box) where box gets ("ok", v) or ("err", e)."""
    box: list = []

    def run():
        try:
            box.append(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            box.append(("err", exc))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_run_returns_results_and_raises_errors_from_the_loop_thread(lt):
    async def answer(x):
        await asyncio.sleep(0)
        assert threading.current_thread() is lt._thread  # it ran on the loop's thread
        return x * 2

    async def fail():
        raise SessionNotFound("gone")

    assert [lt.run(answer(i)) for i in range(50)] == [2 * i for i in range(50)]
    with pytest.raises(SessionNotFound, match="gone"):
        lt.run(fail())


def test_run_async_returns_results_and_raises_errors(lt):
    async def answer(x):
        return x + 1

    async def fail():
        raise SessionNotFound("gone")

    async def caller():
        got = await asyncio.gather(*(lt.run_async(answer(i)) for i in range(20)))
        with pytest.raises(SessionNotFound):
            await lt.run_async(fail())
        return got

    assert asyncio.run(caller()) == list(range(1, 21))


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_call_in_flight_at_close_gets_pool_closed_not_a_hang(how):
    lt = LoopThread("test-loop")
    started = threading.Event()

    async def forever():
        started.set()
        await asyncio.Event().wait()

    async def caller():
        return await asyncio.wait_for(lt.run_async(forever()), 10)

    t, box = _in_thread((lambda: lt.run(forever())) if how == "sync" else (lambda: asyncio.run(caller())))
    assert started.wait(5)
    lt.close(timeout_s=2)
    t.join(5)
    assert not t.is_alive(), "the caller still waits after close"
    assert box[0][0] == "err" and isinstance(box[0][1], PoolClosed)


def test_a_wedged_loop_still_answers_its_callers_at_close():
    """A coroutine that blocks the loop thread keeps the stop from running; callers are answered anyway."""
    lt = LoopThread("test-loop")
    release = threading.Event()
    started = threading.Event()

    async def wedge():
        started.set()
        release.wait(30)  # blocks the whole loop, as a sync call made on it would
        return "late"

    async def queued():
        return "never reached before close"

    t1, box1 = _in_thread(lambda: lt.run(wedge()))
    assert started.wait(5)
    t2, box2 = _in_thread(lambda: lt.run(queued()))
    t0 = time.monotonic()
    lt.close(timeout_s=0.5)
    assert time.monotonic() - t0 < 5
    for t, box in ((t1, box1), (t2, box2)):
        t.join(5)
        assert not t.is_alive()
        assert isinstance(box[0][1], PoolClosed)
    release.set()


def test_a_call_after_close_is_refused_and_its_coroutine_closed():
    lt = LoopThread("test-loop")
    lt.close()

    async def never():
        return 1

    coro = never()
    with pytest.raises(PoolClosed):
        lt.run(coro)
    assert coro.cr_frame is None  # closed, so no "never awaited" warning
    with pytest.raises(PoolClosed):
        asyncio.run(lt.run_async(never()))
    lt.close()  # closing twice is a no-op


def test_a_cancelled_async_caller_cancels_the_work_on_the_loop(lt):
    began, cancelled = threading.Event(), threading.Event()

    async def slow():
        began.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def caller():
        task = asyncio.ensure_future(lt.run_async(slow()))
        while not began.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(caller())
    assert cancelled.wait(5), "the pool's task kept running after its caller gave up"
