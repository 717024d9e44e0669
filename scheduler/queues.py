"""Priority queues of tasks, and the choice an idle worker makes between its two queues."""
from __future__ import annotations

import heapq
import itertools
from typing import Iterator, Optional

from .tasks import Task


class TaskQueue:
    """A min-heap of tasks by ``task.key``; equal keys leave in insertion order.

    The sequence number breaks ties so the heap never compares Task objects and equal keys stay
    FIFO (under the fifo policy, tasks arriving in the same millisecond keep their order).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Task]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Task]:
        """Iterate over queued tasks in no particular order (for inspection)."""
        return (entry[2] for entry in self._heap)

    def push(self, task: Task) -> None:
        """Queue ``task`` by its key."""
        heapq.heappush(self._heap, (task.key, next(self._seq), task))

    def peek(self) -> Optional[Task]:
        """Return the next task without removing it, or None when empty."""
        return self._heap[0][2] if self._heap else None

    def head_key(self) -> Optional[float]:
        """Return the key of the next task, or None when empty."""
        return self._heap[0][0] if self._heap else None

    def pop(self) -> Task:
        """Remove and return the next task; IndexError when empty."""
        return heapq.heappop(self._heap)[2]

    def drain(self) -> list[Task]:
        """Remove and return all tasks in queue order (so re-pushing them keeps their order)."""
        entries = sorted(self._heap)  # (key, seq) pairs are unique, so Tasks are never compared
        self._heap = []
        return [entry[2] for entry in entries]


def better_queue(local: TaskQueue, shared: TaskQueue) -> Optional[TaskQueue]:
    """Return the queue whose head should run next on an idle worker, or None when both are empty.

    The smaller head key wins; a tie goes to the local queue, since only this worker (the home of
    those sessions) can run local tasks while any worker or the task pool can run shared ones.
    """
    local_key, shared_key = local.head_key(), shared.head_key()
    if local_key is None:
        return shared if shared_key is not None else None
    if shared_key is None or local_key <= shared_key:
        return local
    return shared
