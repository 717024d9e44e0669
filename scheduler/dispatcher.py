"""The dispatcher: queues + in-flight limits + worker lifecycle, with no knowledge of Ray.

The pool keeps work here rather than in Ray's own queues, and hands a task to Ray only when a
worker (or the shared task pool) has a free slot. Ray then never holds a backlog, so the order in
which work starts is this module's choice (the policy), and a retired worker's backlog is never
stuck behind a dead actor.
"""
from __future__ import annotations

import bisect
import itertools
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Optional, Union

from .clock import Clock, MonotonicClock
from .constants import DEFAULT_MAX_INFLIGHT_PER_WORKER, DEFAULT_POLICY, SHARED_KINDS
from .estimates import Estimator
from .policies import Policy, make_policy
from .queues import TaskQueue, better_queue
from .routing import home_worker
from .tasks import Task, TaskKind

_MEMO_ENTRIES = 65_536  # session homes remembered between worker-set changes
_MEMO_KEY_CHARS = 1024  # longer keys are routed every time rather than kept alive by the memo


class Assignment(NamedTuple):
    """A task handed out for execution: on ``worker_id``, or on the shared task pool when None."""

    worker_id: Optional[str]
    task: Task


@dataclass
class _Worker:
    queue: TaskQueue = field(default_factory=TaskQueue)  # tasks of the sessions homed here
    running: dict[int, Task] = field(default_factory=dict)


class Dispatcher:
    """Orders tasks by a policy and hands them out within in-flight limits.

    Session tasks wait in their home worker's local queue; stateless tasks and chunks wait in one
    shared queue. An idle worker takes the better head of its local queue and the shared queue
    (a tie goes to local); the shared task pool takes shared heads. A running task is never
    interrupted: a worker gets a new task only when it has a free slot.
    """

    def __init__(
        self,
        policy: Union[Policy, str] = DEFAULT_POLICY,
        *,
        workers: Iterable[str] = (),
        clock: Optional[Clock] = None,
        estimator: Optional[Estimator] = None,
        max_inflight_per_worker: int = DEFAULT_MAX_INFLIGHT_PER_WORKER,
        max_inflight_tasks: Optional[int] = None,
        workers_take_shared: bool = True,
    ) -> None:
        """Create a dispatcher.

        ``max_inflight_tasks`` bounds the shared task pool (default: the CPU count; 0 disables it,
        leaving shared tasks to workers). ``workers_take_shared=False`` keeps workers on their own
        sessions only, for pools that run every stateless task and chunk as a plain Ray task.
        """
        if max_inflight_per_worker < 1:
            raise ValueError(f"max_inflight_per_worker must be >= 1, got {max_inflight_per_worker}")
        if max_inflight_tasks is None:
            max_inflight_tasks = os.cpu_count() or 1
        if max_inflight_tasks < 0:
            raise ValueError(f"max_inflight_tasks must be >= 0, got {max_inflight_tasks}")
        if max_inflight_tasks == 0 and not workers_take_shared:
            raise ValueError("shared tasks could never run: enable the task pool or workers_take_shared")
        self.policy: Policy = make_policy(policy) if isinstance(policy, str) else policy
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.estimator = estimator if estimator is not None else Estimator()
        self.max_inflight_per_worker = max_inflight_per_worker
        self.max_inflight_tasks = max_inflight_tasks
        self.workers_take_shared = workers_take_shared

        self._workers: dict[str, _Worker] = {}
        self._sorted_ids: list[str] = []  # kept sorted: the routing order of home_worker
        self._shared = TaskQueue()
        # Session tasks that arrive (or are re-routed) while no worker is live; placed on add_worker.
        self._homeless = TaskQueue()
        self._shared_running: dict[int, Task] = {}
        self._running_on: dict[int, Optional[str]] = {}  # running task id -> worker id, None = pool
        self._queued_ids: set[int] = set()
        self._ids = itertools.count()
        # Workers that may take a task at the next dispatch (a task queued for them, a slot freed,
        # the worker set changed): dispatch looks at these only, not at every live worker, so a
        # call costs the same on 2 and on 256 workers. A worker outside this set has no free slot
        # or nothing it may take.
        self._ready: set[str] = set()
        # session key -> home among the current workers (cleared whenever the set changes): the
        # pool asks for a session's home several times per call, each an O(workers) rendezvous.
        self._homes: dict[str, str] = {}
        for worker_id in workers:
            self.add_worker(worker_id)

    # --- inspection ------------------------------------------------------------------------------

    @property
    def workers(self) -> tuple[str, ...]:
        """The live worker ids, sorted (the routing order)."""
        return tuple(self._sorted_ids)

    def home_of(self, session_key: str) -> str:
        """Return the current home worker of ``session_key``; ValueError when no worker is live."""
        home = self._homes.get(session_key)
        if home is None:
            home = home_worker(session_key, self._sorted_ids)
            if len(session_key) <= _MEMO_KEY_CHARS:  # huge keys are not kept alive by the memo
                if len(self._homes) >= _MEMO_ENTRIES:
                    del self._homes[next(iter(self._homes))]  # the oldest entry
                self._homes[session_key] = home
        return home

    def queued_count(self) -> int:
        """Return the number of tasks waiting in any queue."""
        return len(self._queued_ids)

    def local_queue_len(self, worker_id: str) -> int:
        """Return how many session tasks wait for ``worker_id``."""
        return len(self._workers[worker_id].queue)

    def queued_on(self, worker_id: str) -> list[Task]:
        """Return the session tasks waiting for ``worker_id``, in no particular order."""
        return list(self._workers[worker_id].queue)

    def shared_queue_len(self) -> int:
        """Return how many stateless tasks and chunks wait in the shared queue."""
        return len(self._shared)

    def running_on(self, worker_id: str) -> list[Task]:
        """Return the tasks ``worker_id`` is running now."""
        return list(self._workers[worker_id].running.values())

    def running_where(self, task_id: int) -> tuple[bool, Optional[str]]:
        """Return (running, worker id); the worker id is None on the shared task pool."""
        if task_id not in self._running_on:
            return False, None
        return True, self._running_on[task_id]

    def shared_inflight_count(self) -> int:
        """Return how many tasks the shared task pool is running now."""
        return len(self._shared_running)

    def idle_worker_count(self) -> int:
        """Return how many workers run nothing and have nothing queued locally (for chunk_count)."""
        return sum(1 for w in self._workers.values() if not w.running and not w.queue)

    # --- work in ---------------------------------------------------------------------------------

    def submit(
        self,
        kind: TaskKind,
        n_chars: int,
        *,
        session_key: Optional[str] = None,
        nonascii_share: float = 0.0,
        payload: Any = None,
        request_chars: Optional[int] = None,
    ) -> Task:
        """Queue a new task and return it (its ``id`` is what complete/fail take).

        Its key is fixed now from the arrival time and the current estimate. Session tasks go to
        their home's local queue, stateless tasks and chunks to the shared queue.

        ``request_chars`` (chunks) is the size of the whole request the task is a piece of: the key
        uses the request's estimate, because the caller waits for the request, not the chunk.
        Keyed by their own size, a long document's chunks would each look short and overtake every
        turn that arrives after them, so chunking would make turns wait for the whole document
        instead of one chunk. The estimator still learns from the task's own size.
        """
        now = self.clock.now_ms()
        if request_chars is not None and request_chars < n_chars:
            raise ValueError(f"request_chars ({request_chars}) is smaller than the task ({n_chars})")
        estimate = self.estimator.estimate(kind, n_chars if request_chars is None else request_chars,
                                           nonascii_share)
        task = Task(
            id=next(self._ids),
            kind=kind,
            session_key=session_key,
            n_chars=n_chars,
            nonascii_share=nonascii_share,
            arrival_ms=now,
            key=self.policy.key(now, estimate),
            payload=payload,
        )
        self._enqueue(task)
        return task

    def requeue(self, task: Task) -> None:
        """Queue ``task`` again with its original key (it keeps its place), e.g. to retry a task
        returned by :meth:`retire_worker`. Its session's home is recomputed."""
        if task.id in self._running_on:
            raise ValueError(f"task {task.id} is still running; fail() it first")
        if task.id in self._queued_ids:
            raise ValueError(f"task {task.id} is already queued")
        self._enqueue(task)

    def _enqueue(self, task: Task) -> None:
        if task.kind in SHARED_KINDS:
            queue = self._shared
        elif not self._sorted_ids:
            queue = self._homeless
        else:
            assert task.session_key is not None  # Task refuses a keyless session task
            home = self.home_of(task.session_key)
            queue = self._workers[home].queue
            self._ready.add(home)
        queue.push(task)
        self._queued_ids.add(task.id)
        if queue is self._shared and self.workers_take_shared:
            self._ready.update(self._sorted_ids)

    # --- work out --------------------------------------------------------------------------------

    def next_for_worker(self, worker_id: str) -> Optional[Task]:
        """Hand ``worker_id`` its next task, or None when it is full or nothing fits.

        A full worker gets nothing (running encodes are never interrupted or oversubscribed).
        Otherwise the better head of its local and the shared queue wins, local on a tie.
        """
        worker = self._workers[worker_id]
        if len(worker.running) >= self.max_inflight_per_worker:
            return None
        if self.workers_take_shared:
            queue = better_queue(worker.queue, self._shared)
        else:
            queue = worker.queue if worker.queue else None
        if queue is None:
            return None
        task = queue.pop()
        self._queued_ids.discard(task.id)
        worker.running[task.id] = task
        self._running_on[task.id] = worker_id
        return task

    def next_shared_task(self) -> Optional[Task]:
        """Hand the shared task pool the head of the shared queue, or None when full or empty."""
        if len(self._shared_running) >= self.max_inflight_tasks or not self._shared:
            return None
        task = self._shared.pop()
        self._queued_ids.discard(task.id)
        self._shared_running[task.id] = task
        self._running_on[task.id] = None
        return task

    def dispatch(self) -> list[Assignment]:
        """Fill every free slot: workers first (sorted order), then the shared task pool.

        Call it after each submit/complete/fail/lifecycle event; it returns what to launch.
        """
        out: list[Assignment] = []
        # The same assignments, in the same order, as visiting every worker in sorted order: a
        # worker outside _ready would get nothing (see __init__).
        ready, self._ready = self._ready, set()
        for worker_id in sorted(ready) if len(ready) > 1 else ready:
            if worker_id not in self._workers:
                continue  # retired since
            while (task := self.next_for_worker(worker_id)) is not None:
                out.append(Assignment(worker_id, task))
        while (task := self.next_shared_task()) is not None:
            out.append(Assignment(None, task))
        return out

    # --- results ---------------------------------------------------------------------------------

    def _release(self, task_id: int) -> Optional[Task]:
        if task_id not in self._running_on:
            return None
        worker_id = self._running_on.pop(task_id)
        if worker_id is None:
            return self._shared_running.pop(task_id)
        self._ready.add(worker_id)  # a slot is free again
        return self._workers[worker_id].running.pop(task_id)

    def complete(self, task_id: int, measured_ms: float) -> Optional[Task]:
        """Record that a running task finished in ``measured_ms`` and teach the estimator.

        Returns the task, or None when it is no longer running here (e.g. its worker was retired
        and the task already returned), so a late result from a dead actor is harmless.
        """
        task = self._release(task_id)
        if task is not None:
            self.estimator.observe(task.kind, task.n_chars, task.nonascii_share, measured_ms)
        return task

    def fail(self, task_id: int, *, requeue: bool = False) -> Optional[Task]:
        """Record that a running task failed; with ``requeue`` it waits again with its old key.

        The estimator learns nothing (a failure's duration says nothing about encoding speed).
        Returns the task, or None when it is no longer running here.
        """
        task = self._release(task_id)
        if task is not None and requeue:
            self._enqueue(task)
        return task

    def take_homeless(self) -> list[Task]:
        """Remove and return the session tasks waiting for a live worker (none is live), so the
        caller can serve them another way instead of letting them wait for a worker that may
        never come."""
        tasks = self._homeless.drain()
        for task in tasks:
            self._queued_ids.discard(task.id)
        return tasks

    # --- worker lifecycle ------------------------------------------------------------------------

    def add_worker(self, worker_id: str) -> None:
        """Make ``worker_id`` live; queued session tasks move to their (possibly new) homes."""
        if worker_id in self._workers:
            raise ValueError(f"worker {worker_id!r} is already live")
        self._workers[worker_id] = _Worker()
        bisect.insort(self._sorted_ids, worker_id)
        self._ready.add(worker_id)
        self._rehome()

    def retire_worker(self, worker_id: str) -> list[Task]:
        """Remove ``worker_id`` and return the tasks it was running, for the caller to retry
        (``requeue``) or fail; its queued tasks move to their sessions' new homes."""
        worker = self._workers.pop(worker_id)
        self._sorted_ids.remove(worker_id)
        for task_id in worker.running:
            del self._running_on[task_id]
        for task in worker.queue.drain():
            self._homeless.push(task)  # still queued; _rehome places it at its new home
        self._rehome()
        return list(worker.running.values())

    def _rehome(self) -> None:
        self._homes.clear()  # the worker set changed: homes are recomputed on demand
        # Rendezvous moves only the sessions of a worker that left or that a new one takes, but
        # re-routing every queued session task is simple and keeps one invariant: a queued task
        # always waits at its session's current home, where that session's next requests also go.
        pending = self._homeless.drain()
        for worker in self._workers.values():
            pending.extend(worker.queue.drain())
        pending.sort(key=lambda t: t.key)  # stable: equal keys keep their order within a queue
        for task in pending:
            self._queued_ids.discard(task.id)
            self._enqueue(task)
