"""Starting Ray for delta-ray: join a running cluster, or start a local one tuned for the pool.

Ray keeps idle worker processes only up to a soft limit that defaults to the node's CPU count, and
kills idle ones above it after about a second. A pool already holds one worker actor per core, so
the processes that run chunk tasks sit above that limit: between two bursts Ray would kill them, and
the next burst would pay a cold process start and a tokenizer load on the
request path. A local Ray started here raises the limit; on a cluster, set the same value with
``RAY_num_workers_soft_limit`` before ``ray start`` (see cluster.yaml).

A local Ray started here for a pool, a job or the demo also runs without metrics collection: with
it on, the node's agent takes up to a core in bursts under load, which shows in a pool's tail
latency (``bench/bench_ray_metrics.py`` runs both side by side). The dashboard, where those
metrics would show, is off here anyway; whoever wants Ray's metrics starts Ray themselves, and the
pool joins it. ``delta-ray serve`` keeps them on: a service's metrics go to Ray's
Prometheus export (README).
"""
from __future__ import annotations

import os
from typing import Optional

import ray

# Per-process Rust thread pools: the pool parallelizes with processes, one encode per core.
WORKER_ENV = {"RAYON_NUM_THREADS": "1", "FASTOKENS_BPE_THREADS": "1", "RAY_ENABLE_AUTO_CONNECT": "0"}


def soft_limit(num_cpus: int) -> int:
    """Idle worker processes a node keeps: one worker actor and one chunk-task process per core,
    plus a few for Serve replicas and Data actors."""
    return 2 * num_cpus + 4


def local_init_kwargs(num_cpus: Optional[int] = None, env: Optional[dict] = None, *, metrics: bool = False) -> dict:
    """``ray.init`` keyword arguments for a fresh local instance (never for joining a cluster);
    ``metrics`` keeps Ray's metrics collection on, for a service whose metrics are scraped."""
    cpus = num_cpus or os.cpu_count() or 1
    kw = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False,
          "runtime_env": {"env_vars": {**WORKER_ENV, **(env or {})}},
          "_system_config": {"num_workers_soft_limit": soft_limit(cpus), "enable_metrics_collection": metrics}}
    if num_cpus is not None:
        kw["num_cpus"] = num_cpus
    return kw


def ensure_ray() -> bool:
    """Join a running cluster (``RAY_ADDRESS``), or start a local Ray; returns whether this call
    started it (and so should shut it down)."""
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"])
        return False
    ray.init(**local_init_kwargs())
    return True
