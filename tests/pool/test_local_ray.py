"""The local Ray delta-ray starts for a user: its settings, each with a measured reason
(actors/local_ray.py). No Ray is started: only the keyword arguments are checked."""
from __future__ import annotations

from delta_ray.actors.local_ray import local_init_kwargs, soft_limit


def test_a_local_ray_keeps_the_chunk_processes_idle_between_bursts():
    assert local_init_kwargs(num_cpus=8)["_system_config"]["num_workers_soft_limit"] == soft_limit(8) == 20


def test_a_local_ray_runs_without_metrics_collection_or_dashboard():
    # its agent's aggregation took a core for about a second every ten seconds under load
    kw = local_init_kwargs()
    assert kw["_system_config"]["enable_metrics_collection"] is False
    assert kw["include_dashboard"] is False
    # a service's metrics go to Ray's Prometheus export: `delta-ray serve` keeps them
    assert local_init_kwargs(metrics=True)["_system_config"]["enable_metrics_collection"] is True


def test_a_callers_environment_reaches_the_workers_beside_the_thread_limits():
    env = local_init_kwargs(env={"X": "1"})["runtime_env"]["env_vars"]
    assert env["X"] == "1" and env["RAYON_NUM_THREADS"] == "1"
