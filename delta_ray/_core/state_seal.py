"""Sealing session states: a worker adopts only states its own pool computed.

A pool initializes a long session by encoding chunks elsewhere and installing the assembled state
on the session's home worker. The worker's ``install`` is a Ray method any job on the cluster could
call, so a state carries an HMAC-SHA256 seal made with the pool secret over the session key and
everything that decides IDs (text, IDs, checkpoints, version); the worker refuses a state whose
seal does not verify. Ray-free.
"""
from __future__ import annotations

import hashlib
import hmac

import numpy as np

from .session_store import SessionState


def _digest(state: SessionState, key: str) -> bytes:
    h = hashlib.sha256()
    for part in (key.encode("utf-8", "surrogatepass"), state.text.encode("utf-8", "surrogatepass")):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    for arr, dtype in ((state.ids, "<i4"), (state.cp_pos, "<i8"), (state.cp_tok, "<i8"), (state.cp_ext, "<i8")):
        data = np.ascontiguousarray(arr, dtype=dtype).tobytes()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    h.update(int(state.version).to_bytes(16, "little", signed=True))
    return h.digest()


def seal_state(secret: bytes, key: str, state: SessionState) -> bytes:
    """The seal of ``state`` as session ``key`` under ``secret``."""
    return hmac.new(secret, b"state:" + _digest(state, key), hashlib.sha256).digest()


def verify_state(secret: bytes, key: str, state: SessionState, seal: bytes) -> bool:
    """True when ``seal`` was made by :func:`seal_state` with the same secret, key and state."""
    if not isinstance(seal, bytes) or not isinstance(state, SessionState):
        return False
    return hmac.compare_digest(seal, seal_state(secret, key, state))
