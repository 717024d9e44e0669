"""Ray-free queue policy for the delta-ray actor pool: routing, estimates, queues, dispatch.

Pure Python and stdlib only, so it can be tested with a fake clock and no Ray, and reused by any
pool. See :class:`Dispatcher` for how a pool drives it.
"""
from .clock import Clock as Clock
from .clock import FakeClock as FakeClock
from .clock import MonotonicClock as MonotonicClock
from .dispatcher import Assignment as Assignment
from .dispatcher import Dispatcher as Dispatcher
from .estimates import Estimator as Estimator
from .estimates import nonascii_share as nonascii_share
from .placement import PlacementModel as PlacementModel
from .policies import POLICIES as POLICIES
from .policies import FifoPolicy as FifoPolicy
from .policies import Policy as Policy
from .policies import ShortestFirstPolicy as ShortestFirstPolicy
from .policies import make_policy as make_policy
from .queues import TaskQueue as TaskQueue
from .queues import better_queue as better_queue
from .routing import home_worker as home_worker
from .routing import worker_name as worker_name
from .tasks import Task as Task
from .tasks import TaskKind as TaskKind

__all__ = [
    "Assignment",
    "Clock",
    "Dispatcher",
    "Estimator",
    "FakeClock",
    "FifoPolicy",
    "MonotonicClock",
    "POLICIES",
    "PlacementModel",
    "Policy",
    "ShortestFirstPolicy",
    "Task",
    "TaskKind",
    "TaskQueue",
    "better_queue",
    "home_worker",
    "make_policy",
    "nonascii_share",
    "worker_name",
]
