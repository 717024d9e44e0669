"""Serving tokenization over HTTP: the public home of the server's entry points.

A one-process server (:func:`run_local`, :func:`local_app`, :func:`local_server`: uvicorn, no Ray)
or a Ray Serve application (:func:`serve_app`), and what a client or load balancer needs to send a
session to the replica that holds it (:func:`routing_headers`, or :func:`routing_key` with
:func:`rendezvous_order` over :func:`replica_endpoints`). Each is imported on first use: Ray,
Serve and uvicorn load only when what needs them is asked for. ``docs/serving.md`` says how to use them.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names' own homes, for type checkers; at run time each loads on first use
    from delta_ray.actors.serve import replica_endpoints, serve_app
    from delta_ray.actors.serve_router import routing_headers
    from delta_ray.actors.tenant_keys import routing_key
    from delta_ray.scheduler.routing import rendezvous_order
    from delta_ray.server.local import local_app, local_server, run_local

__all__ = ["local_app", "local_server", "rendezvous_order", "replica_endpoints", "routing_headers", "routing_key",
           "run_local", "serve_app"]

_HOMES = {
    "local_app": "delta_ray.server.local",
    "local_server": "delta_ray.server.local",
    "run_local": "delta_ray.server.local",
    "serve_app": "delta_ray.actors.serve",
    "replica_endpoints": "delta_ray.actors.serve",
    "routing_headers": "delta_ray.actors.serve_router",
    "routing_key": "delta_ray.actors.tenant_keys",
    "rendezvous_order": "delta_ray.scheduler.routing",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'delta_ray.serving' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
