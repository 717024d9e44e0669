"""The chunk-task warm-up waits until n distinct processes hold the tokenizer (Ray-free)."""
from delta_ray.actors.chunk_task import warm_distinct


class FakeNode:
    """One warm process at t=0; Ray starts another for each task queued while none is idle, and a
    new process needs ``start_s`` before it runs anything (a busy node). A round's tasks each hold
    their process ``hold_s``; the round ends when the last task ends."""

    def __init__(self, start_s: float):
        self.t, self.start_s = 0.0, start_s
        self.ready_at = {1: 0.0}  # pid -> when it can take a task
        self.rounds = []

    def clock(self) -> float:
        return self.t

    def run_round(self, n: int, hold_s: float) -> list[int]:
        free_at = {pid: max(at, self.t) for pid, at in self.ready_at.items()}
        for _ in range(n - len(free_at)):  # queued tasks make Ray start processes
            pid = max(self.ready_at) + 1
            self.ready_at[pid] = free_at[pid] = self.t + self.start_s
        pids, end = [], self.t
        for _ in range(n):  # each task runs on the process free first
            pid = min(free_at, key=free_at.get)
            pids.append(pid)
            free_at[pid] += hold_s
            end = max(end, free_at[pid])
        self.t = end
        self.rounds.append((hold_s, len(set(pids))))
        return pids


def test_a_slow_process_start_is_waited_for():
    node = FakeNode(start_s=3.0)
    got = warm_distinct(node.run_round, 2, 16.0, clock=node.clock)
    assert got == 2
    # a fixed 0.5 s hold (the old warm-up) ran both tasks in the one warm process
    assert node.rounds[0] == (0.5, 1)
    assert node.rounds[-1][1] == 2 and len(node.rounds) <= 4


def test_warm_processes_take_one_round():
    node = FakeNode(start_s=0.0)
    assert warm_distinct(node.run_round, 4, 16.0, clock=node.clock) == 4
    assert len(node.rounds) == 1


def test_the_wait_is_bounded():
    node = FakeNode(start_s=1e9)  # a node that never starts another process
    assert warm_distinct(node.run_round, 2, 16.0, clock=node.clock) == 1
    assert node.t < 40.0
    node = FakeNode(start_s=1e9)
    assert warm_distinct(node.run_round, 2, 0.0, clock=node.clock) == 1  # no budget: one round
    assert len(node.rounds) == 1
