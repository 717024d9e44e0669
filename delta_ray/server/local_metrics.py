"""The request counters of a server without Ray, in Prometheus' text format.

A Serve replica records through ``actors/metrics.py`` into Ray's metrics export; the one-process
server has no Ray, so :class:`Counters` keeps the same two counters in process (a dict increment
per request) and ``GET /metrics`` renders them. Ray-free.
"""
from __future__ import annotations

import threading
from collections import Counter

# name -> (help, label names), the same counters and labels as actors/metrics.py's
COUNTERS = {
    "delta_ray_requests": ("Requests by path (serve_session_held, serve_session_new, serve_append, ...)",
                           ("path",)),
    "delta_ray_http_responses": ("HTTP responses by endpoint and status", ("endpoint", "status")),
}


class Counters:
    """What :class:`~delta_ray.server.serve_handler.RequestHandler` records, counted here."""

    def __init__(self):
        self._lock = threading.Lock()  # the handler records from its loop and from worker threads
        self._counts: Counter = Counter()

    def record_path(self, path: str) -> None:
        with self._lock:
            self._counts[("delta_ray_requests", (path,))] += 1

    def record_http(self, endpoint: str, status: int) -> None:
        with self._lock:
            self._counts[("delta_ray_http_responses", (endpoint, str(status)))] += 1

    def value(self, name: str, *labels: str) -> int:
        """One counter's value (0 if never recorded)."""
        with self._lock:
            return self._counts.get((name, tuple(labels)), 0)

    def render(self) -> bytes:
        """All counters in Prometheus' text exposition format (version 0.0.4)."""
        with self._lock:
            counts = dict(self._counts)
        lines = []
        for name, (help_text, labels) in COUNTERS.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            for (n, values), count in sorted(counts.items()):
                if n == name:
                    tags = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(labels, values))
                    lines.append(f"{name}{{{tags}}} {count}")
        return ("\n".join(lines) + "\n").encode()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
