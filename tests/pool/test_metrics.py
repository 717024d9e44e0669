"""Metrics recording stays off the request path: an append per event, aggregated when flushed."""
from __future__ import annotations

from delta_ray.actors import metrics


class _Sink:
    def __init__(self):
        self.incs, self.observations = [], []

    def inc(self, n, tags=None):
        self.incs.append((n, tags))

    def observe(self, value, tags=None):
        self.observations.append((value, tags))


def test_flush_aggregates_counters_and_keeps_every_observation(monkeypatch):
    sinks = {name: _Sink() for name in ("requests", "cut_misses", "queue_wait", "service", "shadow", "http")}
    monkeypatch.setattr(metrics, "_metrics", lambda: sinks)
    metrics.flush()  # whatever earlier tests recorded
    for s in sinks.values():
        s.incs.clear(), s.observations.clear()
    for _ in range(5):
        metrics.record_path("session")
    metrics.record_path("extend")
    metrics.record_times("session", 1.5, -1.0)
    metrics.record_cut_misses(0)
    metrics.flush()
    assert (sorted(sinks["requests"].incs, key=str)
            == sorted([(5, {"path": "session"}), (1, {"path": "extend"})], key=str))
    assert sinks["queue_wait"].observations == [(1.5, {"kind": "session"})]
    assert sinks["service"].observations == [(0.0, {"kind": "session"})]  # clamped, never negative
    assert sinks["cut_misses"].incs == []


def test_a_failing_backend_never_raises(monkeypatch):
    def broken():
        raise RuntimeError("no metrics backend")
    monkeypatch.setattr(metrics, "_metrics", broken)
    metrics.record_http("/tokenize", 200)
    metrics.flush()
