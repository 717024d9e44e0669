"""Queues and policies: heap order, ties, FIFO vs shortest-first, aging, the policy registry."""
from __future__ import annotations

import pytest

from delta_ray.scheduler.clock import FakeClock
from delta_ray.scheduler.dispatcher import Dispatcher
from delta_ray.scheduler.policies import POLICIES, FifoPolicy, ShortestFirstPolicy, make_policy
from delta_ray.scheduler.queues import TaskQueue, better_queue
from delta_ray.scheduler.tasks import Task


def _task(task_id: int, key: float, kind: str = "stateless", session_key=None) -> Task:
    return Task(task_id, kind, session_key, 10, 0.0, 0.0, key)


def test_task_queue_orders_by_key_then_insertion():
    q = TaskQueue()
    for task_id, key in [(0, 5.0), (1, 1.0), (2, 5.0), (3, 3.0), (4, 1.0)]:
        q.push(_task(task_id, key))
    assert len(q) == 5 and q.head_key() == 1.0 and q.peek().id == 1
    assert [q.pop().id for _ in range(5)] == [1, 4, 3, 0, 2]
    assert q.peek() is None and q.head_key() is None and not q
    with pytest.raises(IndexError):
        q.pop()


def test_drain_returns_queue_order():
    q = TaskQueue()
    for task_id, key in [(0, 2.0), (1, 1.0), (2, 2.0)]:
        q.push(_task(task_id, key))
    assert [t.id for t in q.drain()] == [1, 0, 2]
    assert len(q) == 0


def test_better_queue_smaller_key_and_tie_to_local():
    local, shared = TaskQueue(), TaskQueue()
    assert better_queue(local, shared) is None
    shared.push(_task(0, 2.0))
    assert better_queue(local, shared) is shared
    local.push(_task(1, 2.0, "session", "s"))
    assert better_queue(local, shared) is local  # tie goes to local
    local.pop()
    local.push(_task(2, 2.5, "session", "s"))
    assert better_queue(local, shared) is shared
    shared.pop()
    assert better_queue(local, shared) is local


def test_registry_and_make_policy():
    assert POLICIES == {"fifo": FifoPolicy, "shortest_first": ShortestFirstPolicy}
    assert isinstance(make_policy("fifo"), FifoPolicy)
    assert isinstance(make_policy("shortest_first"), ShortestFirstPolicy)
    with pytest.raises(ValueError, match="fifo, shortest_first"):
        make_policy("lifo")
    with pytest.raises(ValueError):
        Dispatcher("round_robin")


def test_policy_keys():
    assert FifoPolicy().key(10.0, 99.0) == 10.0
    assert ShortestFirstPolicy().key(10.0, 99.0) == 109.0


LONG = 10_000_000  # stateless estimate 0.2 + 300 ms
SHORT = 1_000  # stateless estimate 0.23 ms


def _order(policy: str) -> list[str]:
    clock = FakeClock()
    d = Dispatcher(policy, workers=["w0"], clock=clock, max_inflight_tasks=0)
    busy = d.submit("stateless", SHORT, payload="busy")
    assert d.next_for_worker("w0") is busy  # keep the worker busy while the others arrive
    d.submit("stateless", LONG, payload="long")
    for i in range(3):
        clock.advance(1.0)
        d.submit("stateless", SHORT, payload=f"short{i}")
    d.complete(busy.id, 0.2)
    order = []
    while (task := d.next_for_worker("w0")) is not None:
        order.append(task.payload)
        d.complete(task.id, 0.2)
    return order


def test_fifo_keeps_arrival_order():
    assert _order("fifo") == ["long", "short0", "short1", "short2"]


def test_shortest_first_lets_short_tasks_overtake_a_long_one():
    assert _order("shortest_first") == ["short0", "short1", "short2", "long"]


def test_shortest_first_ages_a_long_task_until_it_runs():
    clock = FakeClock()
    d = Dispatcher("shortest_first", workers=["w0"], clock=clock, max_inflight_tasks=0)
    long_task = d.submit("stateless", LONG, payload="long")
    long_estimate = long_task.key - long_task.arrival_ms
    assert long_estimate == pytest.approx(300.2)
    # A stream of short tasks, one per 10 ms, each run as it arrives.
    ran = []
    for _ in range(100):
        clock.advance(10.0)
        d.submit("stateless", SHORT, payload=clock.now_ms())
        task = d.next_for_worker("w0")
        ran.append(task.payload)
        d.complete(task.id, 0.2)
        if task is long_task:
            break
    assert ran[-1] == "long", "the long task starved"
    # It waited exactly until arriving short tasks' keys (arrival + 0.23 ms) passed its own
    # (0 + 300.2 ms): 29 short tasks overtook it, the one arriving at t=300 did not.
    assert len(ran) == 30 and clock.now_ms() == 300.0
    assert d.next_for_worker("w0").payload == 300.0
