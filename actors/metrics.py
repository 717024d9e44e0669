"""Pool and service metrics through ``ray.util.metrics`` (exported by Ray's Prometheus endpoint).

Created lazily in whichever process records first; recording never raises (metrics must not fail
a request) and costs a deque append: the events reach Ray from a background thread.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque

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


# Recording only appends to a bounded deque (atomic, no lock); a daemon thread pushes the events to
# Ray's metrics once a second. Ray's own calls cost tens of microseconds each, a measurable share
# of a sub-millisecond pool call, so they stay off the request path.
FLUSH_S = 1.0
_EVENTS: deque = deque(maxlen=100_000)  # under sustained overload the oldest events are dropped
_FLUSHER: list = []
_FLUSH_LOCK = threading.Lock()


def _record(event: tuple) -> None:
    _EVENTS.append(event)
    if not _FLUSHER:
        _start_flusher()


def _start_flusher() -> None:
    with _FLUSH_LOCK:
        if _FLUSHER:
            return
        t = threading.Thread(target=_flush_forever, name="delta-ray-metrics", daemon=True)
        _FLUSHER.append(t)
        t.start()


def _flush_forever() -> None:
    while True:
        time.sleep(FLUSH_S)
        flush()


def flush() -> None:
    """Push the recorded events to Ray's metrics now (counters aggregated); never raises."""
    counts: Counter = Counter()
    observations = []
    while True:
        try:
            event = _EVENTS.popleft()
        except IndexError:
            break
        if event[0] == "inc":
            counts[event[1:3]] += event[3]
        else:
            observations.append(event[1:])
    try:
        m = _metrics()
        for (name, tags), n in counts.items():
            m[name].inc(n, tags=dict(tags) if tags else None)
        for name, tags, value in observations:
            m[name].observe(value, tags=dict(tags))
    except Exception:  # noqa: BLE001 - metrics must not fail anything
        log.debug("metric failed", exc_info=True)


def record_path(path: str) -> None:
    _record(("inc", "requests", (("path", path),), 1))


def record_cut_misses(n: int) -> None:
    if n > 0:
        _record(("inc", "cut_misses", (), n))


def record_times(kind: str, wait_ms: float, service_ms: float) -> None:
    tags = (("kind", kind),)
    _record(("obs", "queue_wait", tags, max(0.0, wait_ms)))
    _record(("obs", "service", tags, max(0.0, service_ms)))


def record_http(endpoint: str, status: int) -> None:
    _record(("inc", "http", (("endpoint", endpoint), ("status", str(status))), 1))


def record_shadow(same: bool) -> None:
    _record(("inc", "shadow", (("outcome", "match" if same else "mismatch"),), 1))
