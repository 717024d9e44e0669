"""The dispatcher's per-call work does not grow with the worker count, and its decisions are unchanged.

``dispatch`` visits only the workers that may take a task, and ``home_of`` remembers homes between
changes of the worker set; both must give exactly what visiting every worker and routing every call
from scratch gives. A random sequence of submits, completions, failures, retirements and additions
is run on two dispatchers, one of them made to visit every worker and forget every home before each
step, and every assignment must agree.
"""
from __future__ import annotations

import random

import pytest

from delta_ray.scheduler import Dispatcher, FakeClock
from delta_ray.scheduler.routing import home_worker, rendezvous_order


def _full_scan(d: Dispatcher) -> None:
    """Make ``d`` behave as before: every live worker visited, every home routed afresh."""
    d._ready = set(d.workers)
    d._homes.clear()


@pytest.mark.parametrize("take_shared,slots,per_worker", [(False, 3, 1), (True, 0, 1), (True, 2, 2)])
@pytest.mark.parametrize("seed", range(6))
def test_incremental_dispatch_equals_visiting_every_worker(seed, take_shared, slots, per_worker):
    rng = random.Random(seed)
    clocks = [FakeClock(), FakeClock()]
    workers = [f"w{i:02d}" for i in range(12)]
    ds = [Dispatcher("shortest_first", workers=workers, clock=c, max_inflight_tasks=slots,
                     max_inflight_per_worker=per_worker, workers_take_shared=take_shared) for c in clocks]
    fast, full = ds
    spare = [f"x{i:02d}" for i in range(6)]
    running: list[int] = []
    for step in range(400):
        dt = rng.random()
        for c in clocks:
            c.advance(dt)
        op = rng.random()
        if op < 0.45:
            kind = rng.choice(["session", "session", "stateless", "chunk"])
            key = f"s{rng.randrange(40)}" if kind == "session" else None
            n = rng.randrange(1, 100_000)
            for d in ds:
                d.submit(kind, n, session_key=key)
        elif op < 0.8 and running:
            tid = running.pop(rng.randrange(len(running)))
            how = rng.random()
            for d in ds:
                if how < 0.8:
                    d.complete(tid, 1.0)
                else:
                    d.fail(tid, requeue=how < 0.9)
        elif op < 0.87 and len(fast.workers) > 1:
            wid = rng.choice(fast.workers)
            back = [d.retire_worker(wid) for d in ds]
            assert [t.id for t in back[0]] == [t.id for t in back[1]]
            for t0, t1 in zip(*back):
                running.remove(t0.id)
                if rng.random() < 0.5:
                    fast.requeue(t0)
                    full.requeue(t1)
        elif op < 0.92 and spare:
            wid = spare.pop()
            for d in ds:
                d.add_worker(wid)
        _full_scan(full)
        a, b = fast.dispatch(), full.dispatch()
        assert [(w, t.id) for w, t in a] == [(w, t.id) for w, t in b], f"step {step}"
        running.extend(t.id for _, t in a)
        assert fast.queued_count() == full.queued_count()


def test_home_of_is_rendezvous_over_the_current_workers():
    d = Dispatcher(workers=[f"w{i}" for i in range(8)], clock=FakeClock())
    keys = [f"session-{i}" for i in range(200)]
    assert all(d.home_of(k) == home_worker(k, d.workers) for k in keys)
    d.add_worker("w9")  # the memo must not answer with homes of the old set
    assert all(d.home_of(k) == home_worker(k, d.workers) for k in keys)
    d.retire_worker("w3")
    assert all(d.home_of(k) == home_worker(k, d.workers) for k in keys)
    assert "w3" not in {d.home_of(k) for k in keys}
    huge = "k" * 100_000  # routed, not kept alive by the memo
    assert d.home_of(huge) == home_worker(huge, d.workers) and huge not in d._homes


def test_home_worker_is_the_first_of_the_rendezvous_order():
    nodes = [f"node-{i}" for i in range(50)] + ["node-7"]  # a repeated id changes nothing
    for i in range(300):
        key = f"t{i}|s:{i * 7919}"
        assert home_worker(key, nodes) == rendezvous_order(key, nodes)[0]
        assert home_worker(key, list(reversed(nodes))) == home_worker(key, nodes)
