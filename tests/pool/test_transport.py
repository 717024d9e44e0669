"""The Ray transport's cancellation rule, without a Ray cluster.

Only a chunk task abandoned as hung is force-cancelled. Any other cancellation (the pool closing
with calls in flight, a caller that went away) must leave the task alone: ``ray.cancel`` racing a
task's own completion aborts the calling process inside Ray 2.60 (task_manager.cc "Tried to complete
task that was not pending"), which is how closing a busy pool once took a whole test run down.
"""
from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

ray = pytest.importorskip("ray")

from actors.calls import Call  # noqa: E402
from actors.transport import HUNG, RayTransport  # noqa: E402


class _Ref:
    """An ObjectRef stand-in whose answer never comes (a task still running)."""

    def __init__(self):
        self._future = concurrent.futures.Future()

    def future(self):
        return self._future


def _cancel_in_flight(monkeypatch, *cancel_args) -> list:
    cancelled: list = []
    monkeypatch.setattr(ray, "cancel", lambda ref, force=False: cancelled.append((ref, force)))
    ref = _Ref()
    transport = RayTransport({}, lambda call: ref, owner=True)

    async def scenario():
        task = asyncio.ensure_future(transport.call(None, Call.__new__(Call)))
        await asyncio.sleep(0)  # the call now waits on the task's answer
        task.cancel(*cancel_args)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    return [(r is ref, force) for r, force in cancelled]


def test_a_chunk_task_cancelled_by_close_is_left_to_finish(monkeypatch):
    assert _cancel_in_flight(monkeypatch) == []


def test_a_hung_chunk_task_is_force_cancelled_to_free_its_process(monkeypatch):
    assert _cancel_in_flight(monkeypatch, HUNG) == [(True, True)]
