"""Dispatcher: routing to homes, in-flight limits, no interruption, lifecycle and rehoming."""
from __future__ import annotations

import pytest

from delta_ray.scheduler.clock import FakeClock
from delta_ray.scheduler.dispatcher import Assignment, Dispatcher
from delta_ray.scheduler.routing import home_worker, rendezvous_order

WORKERS = ["w0", "w1", "w2"]


def _dispatcher(policy: str = "fifo", **kw) -> tuple[Dispatcher, FakeClock]:
    clock = FakeClock()
    kw.setdefault("workers", WORKERS)
    kw.setdefault("max_inflight_tasks", 2)
    return Dispatcher(policy, clock=clock, **kw), clock


def _keys_homed_at(worker: str, workers=WORKERS, count: int = 3) -> list[str]:
    keys = (f"s{i}" for i in range(10_000))
    return [k for k in keys if home_worker(k, workers) == worker][:count]


def test_session_tasks_queue_at_their_rendezvous_home():
    d, _ = _dispatcher()
    for i in range(30):
        key = f"sess-{i}"
        task = d.submit("session", 100, session_key=key)
        home = rendezvous_order(key, WORKERS)[0]
        assert d.home_of(key) == home
        assert any(t is task for t in d.queued_on(home))
    assert sum(d.local_queue_len(w) for w in WORKERS) == 30
    assert d.shared_queue_len() == 0 and d.queued_count() == 30


def test_worker_runs_only_its_own_sessions_and_shared_tasks():
    d, _ = _dispatcher()
    (k0,) = _keys_homed_at("w0", count=1)
    (k1,) = _keys_homed_at("w1", count=1)
    d.submit("session", 10, session_key=k1)
    assert d.next_for_worker("w0") is None  # w1's session is not w0's to run
    chunk = d.submit("chunk", 10)
    assert d.next_for_worker("w0") is chunk  # shared work is anyone's
    d.complete(chunk.id, 1.0)
    mine = d.submit("session", 10, session_key=k0)
    assert d.next_for_worker("w0") is mine
    assert d.next_for_worker("w1").session_key == k1


def test_tie_goes_to_local_task():
    d, _ = _dispatcher()
    (k0,) = _keys_homed_at("w0", count=1)
    shared = d.submit("stateless", 10)  # same arrival time: equal fifo keys
    local = d.submit("session", 10, session_key=k0)
    assert shared.key == local.key
    assert d.next_for_worker("w0") is local
    d.complete(local.id, 1.0)
    assert d.next_for_worker("w0") is shared


def test_smaller_key_wins_across_queues():
    d, clock = _dispatcher()
    (k0,) = _keys_homed_at("w0", count=1)
    shared = d.submit("stateless", 10)
    clock.advance(1.0)
    local = d.submit("session", 10, session_key=k0)
    assert d.next_for_worker("w0") is shared
    d.complete(shared.id, 1.0)
    assert d.next_for_worker("w0") is local


def test_per_worker_inflight_limit_and_no_interruption():
    d, clock = _dispatcher("shortest_first")
    k0a, k0b = _keys_homed_at("w0", count=2)
    long_task = d.submit("session", 10_000_000, session_key=k0a)
    assert d.next_for_worker("w0") is long_task
    # A much shorter task arrives: it waits, the running encode is not interrupted or doubled up.
    short = d.submit("session", 10, session_key=k0b)
    d.submit("stateless", 10)
    assert d.next_for_worker("w0") is None
    assert d.running_on("w0") == [long_task]
    clock.advance(50.0)
    assert d.next_for_worker("w0") is None
    assert d.complete(long_task.id, 100.0) is long_task
    assert d.next_for_worker("w0") is short


def test_higher_per_worker_limit():
    d, _ = _dispatcher(max_inflight_per_worker=2, workers=["w0"])
    tasks = [d.submit("session", 10, session_key=f"k{i}") for i in range(3)]
    assert d.next_for_worker("w0") is tasks[0]
    assert d.next_for_worker("w0") is tasks[1]
    assert d.next_for_worker("w0") is None
    d.complete(tasks[0].id, 1.0)
    assert d.next_for_worker("w0") is tasks[2]


def test_shared_pool_inflight_limit():
    d, _ = _dispatcher(max_inflight_tasks=2)
    tasks = [d.submit("chunk", 10) for _ in range(4)]
    assert d.next_shared_task() is tasks[0]
    assert d.next_shared_task() is tasks[1]
    assert d.next_shared_task() is None  # pool full
    assert d.shared_inflight_count() == 2
    d.complete(tasks[1].id, 1.0)
    assert d.next_shared_task() is tasks[2]
    assert d.next_shared_task() is None
    # Workers' slots are separate from the pool's.
    assert d.next_for_worker("w0") is tasks[3]
    assert d.next_shared_task() is None


def test_dispatch_fills_every_free_slot():
    d, _ = _dispatcher(max_inflight_tasks=1)
    (k1,) = _keys_homed_at("w1", count=1)
    local = d.submit("session", 10, session_key=k1)
    chunks = [d.submit("chunk", 10) for _ in range(5)]
    out = d.dispatch()
    assert out == [
        Assignment("w0", chunks[0]),
        Assignment("w1", local),
        Assignment("w2", chunks[1]),
        Assignment(None, chunks[2]),
    ]
    assert d.dispatch() == []
    assert d.queued_count() == 2


def test_workers_take_shared_false():
    d, _ = _dispatcher(workers_take_shared=False)
    d.submit("chunk", 10)
    assert d.next_for_worker("w0") is None
    assert d.next_shared_task() is not None
    with pytest.raises(ValueError):
        Dispatcher(workers=WORKERS, max_inflight_tasks=0, workers_take_shared=False)


def test_complete_teaches_the_estimator_and_fail_does_not():
    d, _ = _dispatcher()
    b0 = d.estimator.ms_per_char("chunk")
    task = d.submit("chunk", 100_000)
    assert d.next_shared_task() is task
    assert d.fail(task.id, requeue=True) is task
    assert d.estimator.ms_per_char("chunk") == b0
    assert d.queued_count() == 1
    assert d.next_shared_task() is task  # same task, same key
    d.complete(task.id, 0.2 + 1e-3 * 100_000)
    assert d.estimator.ms_per_char("chunk") == pytest.approx(b0 + 0.05 * (1e-3 - b0))
    assert d.complete(task.id, 1.0) is None  # already settled
    assert d.fail(12345) is None


def test_retire_rehomes_queued_tasks_and_returns_running_one():
    d, _ = _dispatcher()
    keys = _keys_homed_at("w1", count=4)
    tasks = [d.submit("session", 10, session_key=k) for k in keys]
    running = d.next_for_worker("w1")
    assert running is tasks[0]
    returned = d.retire_worker("w1")
    assert returned == [running]
    assert d.workers == ("w0", "w2")
    remaining = ["w0", "w2"]
    for task in tasks[1:]:
        home = rendezvous_order(task.session_key, remaining)[0]
        assert any(t is task for t in d.queued_on(home))
    assert d.queued_count() == 3
    # The caller retries the returned task; it goes to its session's new home with its old key.
    d.requeue(returned[0])
    assert d.queued_count() == 4
    new_home = d.home_of(running.session_key)
    assert d.next_for_worker(new_home).id in {t.id for t in tasks}
    # A late result from the retired worker is harmless.
    assert d.complete(12345, 1.0) is None
    with pytest.raises(KeyError):
        d.next_for_worker("w1")


def test_requeue_refuses_running_or_queued_tasks():
    d, _ = _dispatcher()
    task = d.submit("chunk", 10)
    with pytest.raises(ValueError):
        d.requeue(task)
    d.next_shared_task()
    with pytest.raises(ValueError):
        d.requeue(task)


def test_all_queued_tasks_follow_homes_when_workers_change():
    d, _ = _dispatcher()
    tasks = [d.submit("session", 10, session_key=f"s{i}") for i in range(60)]

    def check():
        for task in tasks:
            home = d.home_of(task.session_key)
            assert any(t is task for t in d.queued_on(home))

    check()
    d.add_worker("w3")
    check()
    d.retire_worker("w0")
    check()
    assert d.queued_count() == 60
    with pytest.raises(ValueError):
        d.add_worker("w3")


def test_sessions_wait_while_no_worker_is_live():
    d, _ = _dispatcher(workers=[])
    task = d.submit("session", 10, session_key="k")
    with pytest.raises(ValueError):
        d.home_of("k")
    assert d.queued_count() == 1
    d.add_worker("solo")
    assert d.next_for_worker("solo") is task
    assert d.retire_worker("solo") == [task]
    d.requeue(task)
    d.add_worker("again")
    assert d.next_for_worker("again") is task


def test_idle_worker_count():
    d, _ = _dispatcher()
    assert d.idle_worker_count() == 3
    (k0,) = _keys_homed_at("w0", count=1)
    d.submit("session", 10, session_key=k0)
    assert d.idle_worker_count() == 2  # queued work counts as busy
    d.next_for_worker("w0")
    assert d.idle_worker_count() == 2


def test_chunks_are_keyed_by_their_whole_request():
    # Shortest-first: a turn arriving after a long document's chunks overtakes them, as it would
    # overtake the whole document; keyed by their own size the chunks would all run first.
    d, clock = _dispatcher("shortest_first", workers=["w0"], max_inflight_tasks=0)
    (k0,) = _keys_homed_at("w0", workers=["w0"], count=1)
    b = d.estimator.ms_per_char("chunk")
    chunks = [d.submit("chunk", 65_536, request_chars=16 * 65_536) for _ in range(16)]
    assert all(c.key == pytest.approx(0.2 + b * 16 * 65_536) for c in chunks)
    clock.advance(10 * b * 65_536)  # later than one chunk's own estimate, well within the document's
    turn = d.submit("session", 1_300, session_key=k0)
    assert d.next_for_worker("w0") is turn
    alone = d.submit("chunk", 65_536)  # without request_chars a chunk is keyed by its own size,
    assert alone.key < chunks[0].key  # so it would overtake the document it arrived after
    with pytest.raises(ValueError, match="request_chars"):
        d.submit("chunk", 100, request_chars=10)


def test_running_where_and_take_homeless():
    d, _ = _dispatcher(workers=["w0"], max_inflight_tasks=1)
    session = d.submit("session", 10, session_key="a")
    chunk = d.submit("chunk", 10)
    assert d.running_where(session.id) == (False, None)
    d.dispatch()
    assert d.running_where(session.id) == (True, "w0")
    assert d.running_where(chunk.id) == (True, None)
    queued = d.submit("session", 10, session_key="a")
    assert d.retire_worker("w0") == [session]
    assert d.take_homeless() == [queued]  # no live worker: the caller serves it another way
    assert d.queued_count() == 0 and d.take_homeless() == []
