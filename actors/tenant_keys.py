"""Tenant-namespaced keys: the one injective map from (tenant, name) to the key state is stored under.

Every path that keeps state for a request (a Serve replica's sessions, its keyless content reuse,
the pool's content-sticky sessions on its workers) names that state with these functions, so two
tenants never share a key and one tenant's timing can never reveal another's text. Ray-free.
"""
from __future__ import annotations

import hashlib

ROUTING_PREFIX = "r1:"  # routing header values made by :func:`routing_key` (versioned, so it may change)


def _ns(tenant: str | None) -> str:
    """The tenant part of a key, length-prefixed so no (tenant, name) pair can spell another's."""
    return "t-" if tenant is None else f"t{len(tenant)}:{tenant}"


def session_key(session: str | None, tenant: str | None) -> str | None:
    """Namespace a session by tenant, injectively: distinct (tenant, session) pairs never share a key.

    Without a tenant (``cache_salt``) the session id is a name shared by every caller of the
    service: anyone who knows or guesses it reads the same state.
    """
    if session is None:
        return None
    return f"{_ns(tenant)}|s:{session}"


def content_session_key(digest: str, tenant: str | None) -> str:
    """The key under which a keyless prompt is reused by content, inside its tenant's namespace.

    ``digest`` is :func:`delta_ray.scheduler.content_key` of the text. Content keys (``|c:``) and
    session keys (``|s:``) of any tenants never meet.
    """
    return f"{_ns(tenant)}|c:{digest}"


def routing_key(session: str | None, tenant: str | None) -> str | None:
    """The ``x-session-id`` value for a session: a digest of its tenant-namespaced key.

    The router only needs a stable string per session; a digest keeps the tenant's ``cache_salt``
    (and the session id) out of headers, proxies' and Serve's request metadata and logs, and is
    always a valid header value. It is not keyed by a server secret (clients compute it), so a
    ``cache_salt`` an observer could guess is still guessable from it: use random salts.
    """
    key = session_key(session, tenant)
    if key is None:
        return None
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16,
                             person=b"delta-ray-route").hexdigest()
    return ROUTING_PREFIX + digest
