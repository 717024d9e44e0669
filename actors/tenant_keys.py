"""The routing header of a tenant's session: what Ray Serve's session router hashes.

The keys state is stored under are made by :mod:`delta_ray._core.keys` on every path; this is only
their digest for a header. Ray-free.
"""
from __future__ import annotations

import hashlib

from delta_ray._core.keys import session_key

ROUTING_PREFIX = "r1:"  # routing header values made by :func:`routing_key` (versioned, so it may change)


def routing_key(session: str | None, tenant: str | None) -> str | None:
    """The ``x-session-id`` value for a session: a digest of its tenant-namespaced key.

    The router only needs a stable string per session; a digest keeps the tenant's ``cache_salt``
    (and the session id) out of headers, proxies' and Serve's request metadata and logs, and is
    always a valid header value. It is not keyed by a server secret (clients compute it), so a
    ``cache_salt`` an observer could guess is still guessable from it: use random salts.
    """
    if session is None:
        return None
    key = session_key(session, tenant)
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16,
                             person=b"delta-ray-route").hexdigest()
    return ROUTING_PREFIX + digest
