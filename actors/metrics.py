"""Pool and service metrics through ``ray.util.metrics`` (exported by Ray's Prometheus endpoint).

Created lazily in whichever process records first; recording never raises (metrics must not fail
a request).
"""
from __future__ import annotations

import logging

log = logging.getLogger("delta_ray.metrics")
_M: dict = {}
_BOUNDARIES_MS = [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]


def _metrics() -> dict:
    if not _M:
        from ray.util import metrics as m
        _M["requests"] = m.Counter("delta_ray_requests", "Requests by path (repair, init, chunked, "
                                   "content_hit, reference, ...)", tag_keys=("path",))
        _M["cut_misses"] = m.Counter("delta_ray_cut_misses", "Planner targets with no safe cut in their window")
        _M["queue_wait"] = m.Histogram("delta_ray_queue_wait_ms", "Time a task waited in the scheduler",
                                       boundaries=_BOUNDARIES_MS, tag_keys=("kind",))
        _M["service"] = m.Histogram("delta_ray_service_ms", "Time from dispatch to answer",
                                    boundaries=_BOUNDARIES_MS, tag_keys=("kind",))
        _M["shadow"] = m.Counter("delta_ray_shadow_comparisons", "Fast-tier answers re-checked by the "
                                 "reference, by outcome", tag_keys=("outcome",))
        _M["http"] = m.Counter("delta_ray_http_responses", "HTTP responses by endpoint and status",
                               tag_keys=("endpoint", "status"))
    return _M


def record_path(path: str) -> None:
    try:
        _metrics()["requests"].inc(1, tags={"path": path})
    except Exception:  # noqa: BLE001
        log.debug("metric failed", exc_info=True)


def record_cut_misses(n: int) -> None:
    if n > 0:
        try:
            _metrics()["cut_misses"].inc(n)
        except Exception:  # noqa: BLE001
            log.debug("metric failed", exc_info=True)


def record_times(kind: str, wait_ms: float, service_ms: float) -> None:
    try:
        m = _metrics()
        m["queue_wait"].observe(max(0.0, wait_ms), tags={"kind": kind})
        m["service"].observe(max(0.0, service_ms), tags={"kind": kind})
    except Exception:  # noqa: BLE001
        log.debug("metric failed", exc_info=True)


def record_http(endpoint: str, status: int) -> None:
    try:
        _metrics()["http"].inc(1, tags={"endpoint": endpoint, "status": str(status)})
    except Exception:  # noqa: BLE001
        log.debug("metric failed", exc_info=True)


def record_shadow(same: bool) -> None:
    try:
        _metrics()["shadow"].inc(1, tags={"outcome": "match" if same else "mismatch"})
    except Exception:  # noqa: BLE001
        log.debug("metric failed", exc_info=True)
