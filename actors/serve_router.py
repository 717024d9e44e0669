"""A Ray Serve request router that sends a session's requests to the replica holding its state.

Serve's HTTP proxy copies the ``x-session-id`` request header (``RAY_SERVE_SESSION_ID_HEADER_KEY``
renames it) into the request's metadata before routing; a ``DeploymentHandle`` sets it with
``handle.options(session_id=...)``. The router never sees the body (the proxy streams it to the
replica after routing), so the key travels in that header. :func:`routing_headers` builds it from
the same ``session_id`` and ``cache_salt`` the body carries: a digest of the tenant-namespaced
session key (``tenant_keys.routing_key``), so two tenants' sessions of one name hash independently
and the ``cache_salt`` never travels in clear in a header (proxies, Serve's request metadata and
logs see only the digest). Any stable string routes: the router only hashes it.

The header only decides *where* a request runs. The replica keys its state by the body's
``session_id`` and ``cache_salt`` alone, so a header naming another tenant's session reaches, at
most, the replica that holds it, never the state: a misrouted or forged header costs a
re-initialization from the whole transcript (exact), or a 409 for an ``append`` (resend whole).

The home is the replica with the highest rendezvous weight over CRC-32 of the key
(``scheduler.routing``): when replicas come or go (autoscaling, failures) only the sessions of the
replicas that left, or that the new ones win, move. Requests without a key go to the less loaded of
two random replicas (Serve's default policy).
"""
from __future__ import annotations

import random
from typing import List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from delta_ray.scheduler.routing import key_hash, node_score

from .tenant_keys import routing_key

SESSION_HEADER = "x-session-id"


def routing_headers(session_id: str | None, cache_salt: str | None = None) -> dict[str, str]:
    """The header that routes a request for this session (with this tenant) to its replica: a
    digest of the tenant-namespaced key (printable ASCII; it reveals neither id nor salt)."""
    key = routing_key(session_id, cache_salt)
    return {} if key is None else {SESSION_HEADER: key}


class SessionRouter(RequestRouter):
    """Rendezvous hashing of ``metadata.session_id`` over the running replicas.

    ``request_router_kwargs``: ``num_fallback_replicas`` (default 1) replicas after the home, in
    rendezvous order, are tried when the home's queue is full (``max_ongoing_requests``); the
    session re-initializes there, exactly. 0 waits for the home (strict affinity).
    """

    def initialize_state(self, num_fallback_replicas: int = 1, **kwargs) -> None:
        if not isinstance(num_fallback_replicas, int) or num_fallback_replicas < 0:
            raise ValueError(f"num_fallback_replicas must be an int >= 0, got {num_fallback_replicas!r}")
        self._fallbacks = num_fallback_replicas

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = pending_request.metadata.session_id if pending_request is not None else ""
        if not key:
            # No session: the less loaded of two random replicas (the base class probes both).
            n = len(candidate_replicas)
            return [random.sample(candidate_replicas, 2) if n > 2 else list(candidate_replicas)]
        # Back off between passes instead of spinning while the home is full.
        pending_request.routing_context.should_backoff = True
        k = key_hash(key)
        ranked = sorted(candidate_replicas, reverse=True,
                        key=lambda r: (node_score(k, r.replica_id.unique_id), r.replica_id.unique_id))
        return [[r] for r in ranked[:1 + getattr(self, "_fallbacks", 1)]]
