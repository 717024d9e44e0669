"""Typed options: frozen dataclasses validated once, then sent as they are to workers, tasks and actors.

``TokenizerConfig`` holds what a :class:`~delta_ray.DeltaTokenizer` needs (the planner's knobs, the
session store's bounds, the engine); ``PoolConfig`` what a pool adds (workers, tasks, timeouts) plus
the ``TokenizerConfig`` its workers and chunk tasks run with. Both are hashable, so a process's
tokenizer cache can key on them, and both pickle as plain values for Ray.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from delta_ray._core import constants as C

from .planner import PlannerConfig

REUSE_MODES = ("session", "content", "none")


def _positive_int(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int{' or None' if allow_none else ''}, got {value!r}")


def _non_negative(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")


@dataclass(frozen=True)
class TokenizerConfig:
    """Options of one in-process tokenizer (:class:`~delta_ray.DeltaTokenizer`)."""

    chunk_size: int = C.CHUNK_SIZE
    cut_threshold: int = C.CUT_THRESHOLD
    max_chunks: int = C.MAX_CHUNKS
    threads: int | None = None  # encode threads and chunks per long text; None: the CPU count
    reuse: str = "session"  # "session", "content" (keyless texts reuse a matching prefix) or "none"
    max_session_bytes: int = C.MAX_SESSION_BYTES
    max_sessions: int = C.MAX_SESSIONS
    engine: str = "auto"
    shadow_rate: float = C.SHADOW_RATE
    strict: bool = False  # raise NotAdmitted for a tokenizer the exactness argument does not cover

    def __post_init__(self) -> None:
        self.planner  # PlannerConfig validates the planner's three knobs
        _positive_int("threads", self.threads, allow_none=True)
        if self.reuse not in REUSE_MODES:
            raise ValueError(f"reuse must be one of {REUSE_MODES}, got {self.reuse!r}")
        _positive_int("max_session_bytes", self.max_session_bytes)
        _positive_int("max_sessions", self.max_sessions)
        if self.engine not in C.ENGINES:
            raise ValueError(f"engine must be one of {C.ENGINES}, got {self.engine!r}")
        if not isinstance(self.shadow_rate, (int, float)) or not 0.0 <= self.shadow_rate <= 1.0:
            raise ValueError(f"shadow_rate must be in [0, 1], got {self.shadow_rate!r}")
        if not isinstance(self.strict, bool):
            raise ValueError(f"strict must be a bool, got {self.strict!r}")

    @property
    def planner(self) -> PlannerConfig:
        return PlannerConfig(chunk_size=self.chunk_size, cut_threshold=self.cut_threshold,
                             max_chunks=self.max_chunks)


@dataclass(frozen=True)
class PoolConfig:
    """Options of a :class:`~delta_ray.TokenizerPool`; ``tokenizer`` is what its workers run with.

    ``None`` fields are resolved against the cluster when the pool starts (:meth:`resolved`).
    """

    num_workers: int | None = None  # default: the cluster's CPUs
    policy: str = "shortest_first"
    worker_cpus: float = C.WORKER_CPUS
    task_cpus: float = C.TASK_CPUS
    max_inflight_tasks: int | None = None  # chunk tasks at once; default: the cluster's CPUs
    workers_take_shared: bool | None = None  # default: only when there is no task pool
    side_channel: bool = True
    task_nice: int = C.TASK_NICE
    request_timeout_s: float = C.REQUEST_TIMEOUT_S
    startup_timeout_s: float = C.STARTUP_TIMEOUT_S
    placement: bool = True
    tokenizer: TokenizerConfig = field(default_factory=lambda: TokenizerConfig(
        threads=1, shadow_rate=C.POOL_SHADOW_RATE))

    def __post_init__(self) -> None:
        _positive_int("num_workers", self.num_workers, allow_none=True)
        if not isinstance(self.policy, str):  # the scheduler checks the name (policies are pluggable)
            raise ValueError(f"policy must be a policy's config name, got {self.policy!r}")
        _non_negative("worker_cpus", self.worker_cpus)
        _non_negative("task_cpus", self.task_cpus)
        if self.max_inflight_tasks is not None and (isinstance(self.max_inflight_tasks, bool) or
                                                    not isinstance(self.max_inflight_tasks, int)
                                                    or self.max_inflight_tasks < 0):
            raise ValueError(f"max_inflight_tasks must be a non-negative int or None, got {self.max_inflight_tasks!r}")
        if not isinstance(self.task_nice, int) or not 0 <= self.task_nice <= 19:
            raise ValueError(f"task_nice must be an int in [0, 19], got {self.task_nice!r}")
        for name in ("request_timeout_s", "startup_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not isinstance(self.tokenizer, TokenizerConfig):
            raise TypeError(f"tokenizer must be a TokenizerConfig, got {type(self.tokenizer).__name__}")

    def resolved(self, cluster_cpus: int) -> "PoolConfig":
        """Fill the cluster-dependent defaults (workers, in-flight tasks, who takes shared work)."""
        cpus = max(1, int(cluster_cpus))
        inflight = cpus if self.max_inflight_tasks is None else self.max_inflight_tasks
        # Measured on bursts (bench_pool): a worker running a chunk makes its sessions' next turn wait
        # for the whole chunk, while a chunk in a task process only shares the cores. So workers take
        # shared work only when there is no task pool.
        take = (inflight == 0) if self.workers_take_shared is None else self.workers_take_shared
        return replace(self, num_workers=self.num_workers or cpus, max_inflight_tasks=inflight,
                       workers_take_shared=take)


_TOKENIZER_FIELDS = frozenset(f.name for f in fields(TokenizerConfig))
_POOL_FIELDS = frozenset(f.name for f in fields(PoolConfig)) - {"tokenizer"}


def tokenizer_config(config: TokenizerConfig | None = None,
                     options: Mapping[str, Any] | None = None) -> TokenizerConfig:
    """``config`` (default: the defaults) with keyword ``options`` applied; unknown names raise TypeError."""
    options = dict(options or {})
    unknown = set(options) - _TOKENIZER_FIELDS
    if unknown:
        raise TypeError(f"unknown tokenizer option(s) {sorted(unknown)}; known: {sorted(_TOKENIZER_FIELDS)}")
    if config is not None and not isinstance(config, TokenizerConfig):
        raise TypeError(f"config must be a TokenizerConfig, got {type(config).__name__}")
    base = config or TokenizerConfig()
    return replace(base, **options) if options else base


def pool_config(config: PoolConfig | None = None, options: Mapping[str, Any] | None = None) -> PoolConfig:
    """``config`` with keyword ``options`` applied: pool fields to the pool, tokenizer fields to the
    workers' :class:`TokenizerConfig` (the knobs a caller passes once reach every process)."""
    options = dict(options or {})
    unknown = set(options) - _POOL_FIELDS - _TOKENIZER_FIELDS
    if unknown:
        raise TypeError(f"unknown pool option(s) {sorted(unknown)}; known: "
                        f"{sorted(_POOL_FIELDS | _TOKENIZER_FIELDS)}")
    if config is not None and not isinstance(config, PoolConfig):
        raise TypeError(f"config must be a PoolConfig, got {type(config).__name__}")
    base = config or PoolConfig()
    tok = {k: v for k, v in options.items() if k in _TOKENIZER_FIELDS}
    if "threads" in tok:
        raise TypeError("threads is per worker (1): set the pool's parallelism with num_workers")
    pool = {k: v for k, v in options.items() if k in _POOL_FIELDS}
    if tok:
        pool["tokenizer"] = replace(base.tokenizer, **tok)
    return replace(base, **pool) if pool else base
