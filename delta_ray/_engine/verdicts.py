"""The admission record of an engine: read, written, rejected and watched at run time.

An admission is one record (:mod:`delta_ray._runtime.cache_store`) bound to the tokenizer's SHA-256, the
engine's name and version, the reference's version, delta-ray's version, the probe's and the
battery's formats (the key, :func:`delta_ray._verify.admit.verdict_key`), and carrying the guard set
with its own digest. A record that fails validation is discarded and the admission re-run; a
rejection (failed battery, a shadow mismatch) is persisted so that no later process admits the
engine again for the same versions. The engine persists a rejection when it leaves its fast tier and
watches the record of the engine it uses, so a rejection written by another process reaches it.
"""
from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Protocol, Sequence

from .._runtime import cache_store
from .._runtime.exit_guard import start_thread
from .guard import ranges_digest, valid_guard_payload


def _valid_verdict(p: dict[str, Any]) -> bool:
    return (isinstance(p.get("ok"), bool) and isinstance(p.get("reason"), str)
            and isinstance(p.get("at"), (int, float)) and valid_guard_payload(p))


# A rejection lives in its own record, which no admission ever writes: a passing verdict written
# late (a slow admission finishing after another process's shadow verifier caught the engine) can
# therefore never replace it, whatever the interleaving, without a lock.
REJECTION_KIND = "verdict-rejected"


def load_verdict(key: dict[str, Any]) -> dict[str, Any] | None:
    """The validated admission record for ``key``, or None (absent, altered, or caching off).

    A persisted rejection wins over any passing record for the same key."""
    rejected = cache_store.load_record(REJECTION_KIND, key, validate=_valid_verdict)
    if rejected is not None and not rejected["ok"]:
        return rejected
    return cache_store.load_record("verdict", key, validate=_valid_verdict)


def save_verdict(key: dict[str, Any], ok: bool, reason: str, ranges: Sequence[Sequence[int]],
                 stats: dict[str, Any] | None = None) -> bool:
    """Persist an admission verdict; a rejection (``ok=False``) goes to its own record, which a later
    passing verdict cannot overwrite. False when caching is off or the write failed."""
    ranges = [list(map(int, r)) for r in ranges]
    payload = {"ok": bool(ok), "reason": str(reason), "at": time.time(),
               "ranges": ranges, "ranges_sha256": ranges_digest(ranges), "stats": stats or {}}
    if ok:
        old = cache_store.load_record("verdict", key, validate=_valid_verdict)
        if old is not None and not old["ok"]:  # a rejection written before rejections had their own record
            return False
    return cache_store.save_record("verdict" if ok else REJECTION_KIND, key, payload)


def reject_verdict(key: dict[str, Any] | None, reason: str) -> None:
    """Persist that this engine must not be admitted again for these versions (a caught mismatch)."""
    if key is not None:
        save_verdict(key, False, reason, [], {"rejected_at_run_time": True})


VERDICT_POLL_S = 2.0  # how often a process using the fast tier re-reads its verdict


class WatchedEngine(Protocol):
    """What the watch reads of its engine (:class:`~delta_ray._engine.engine.Engine`)."""

    @property
    def disabled_reason(self) -> str | None: ...

    def back_to_reference(self, reason: str) -> None: ...


def watch_verdict(engine: WatchedEngine, key: dict[str, Any]) -> None:
    """Poll the admission record of ``engine``'s fast tier (an :class:`~delta_ray._engine.engine.Engine`):
    a rejection persisted by another process (a pool worker whose shadow verifier caught the engine)
    disables the fast tier here too, with the same purge."""
    ref = weakref.ref(engine)
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(VERDICT_POLL_S):
            sw = ref()
            if sw is None or sw.disabled_reason is not None:
                return
            rec = load_verdict(key)
            if rec is not None and not rec["ok"]:
                sw.back_to_reference(f"rejected elsewhere: {rec['reason']}")
                return
            del sw

    start_thread(run, "delta-ray-verdict-watch", stop=stop.set)
