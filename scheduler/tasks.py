"""The unit of work the scheduler orders: a small immutable record plus the caller's payload."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from .constants import TASK_KINDS

TaskKind = Literal["session", "stateless", "chunk"]


# eq=False: tasks are compared by identity, never by payload (which may be a numpy array or a big
# string); ordering lives in the queue entries, not in the task.
@dataclass(frozen=True, eq=False)
class Task:
    """One queued or running piece of work.

    ``key`` is the policy's priority (smaller runs first), fixed at arrival so a waiting task never
    needs re-sorting; ``payload`` is opaque to the scheduler (the pool puts the request there).
    """

    id: int
    kind: TaskKind
    session_key: Optional[str]
    n_chars: int
    nonascii_share: float
    arrival_ms: float
    key: float
    payload: Any = None

    def __post_init__(self) -> None:
        if self.kind not in TASK_KINDS:
            raise ValueError(f"unknown task kind {self.kind!r}; known: {', '.join(TASK_KINDS)}")
        if self.kind == "session" and self.session_key is None:
            raise ValueError("a session task needs a session_key (its home worker is derived from it)")
        if self.n_chars < 0:
            raise ValueError(f"n_chars must be >= 0, got {self.n_chars}")
        if not 0.0 <= self.nonascii_share <= 1.0:
            raise ValueError(f"nonascii_share must be in [0, 1], got {self.nonascii_share}")
