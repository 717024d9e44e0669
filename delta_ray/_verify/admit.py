"""Engine selection: the fastest encoder proven exact for a tokenizer, the reference elsewhere.

``engine="reference"`` always encodes with the reference and never reads or writes the admission
cache. ``engine="fast"`` admits the fast tier now (load the native engine, derive or load its guard
set, fuzz it, run the verification battery; blocking, cached on disk) and raises
:class:`FastEngineUnavailable` if it fails. ``engine="auto"`` (default) uses the fast tier at once
when a passing admission for this tokenizer and these versions is cached; otherwise it starts with
the reference and admits the fast tier in a background thread (one process per machine does the
probe, under a lock file), switching when it passes. The cuts, repairs, store and pool never care
which encoder ran.

An admission is one record (:mod:`delta_ray._engine.verdicts`), keyed by :func:`verdict_key`; a
rejection is persisted so that no later process admits the engine again for the same versions.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from typing import Callable

from delta_ray._core import constants as C

from .._core.encoder import ReferenceEncoder
from .._engine.engine import Engine, FastTier
from .._engine.guard import GuardSet, guard_from_ranges
from .._engine.native import FAST_BACKENDS, FastEngineUnavailable, cached_fast_encoder, package_version
from .._engine.verdicts import load_verdict, save_verdict
from .._runtime.cache_lock import bounded_lock
from .._runtime.exit_guard import checkpoint, start_thread
from .fuzz import fuzz, fuzz_alphabet
from .guard_battery import verify_fast_engine
from .guard_probe import guard_key, guard_set_for

log = logging.getLogger("delta_ray.verify")
BATTERY_FORMAT = 2  # bump when the battery or the admission fuzz changes
ADMISSION_FUZZ_SECONDS = 4.0  # fuzzing at admission (DELTA_RAY_ADMISSION_FUZZ_SECONDS overrides)


def _delta_ray_version() -> str:
    return package_version("delta-ray") or "0+unknown"


def verdict_key(config_bytes: bytes, backend: str, backend_version: str | None) -> dict:
    """The whole key of an admission record (cheap: package metadata, no tokenizer.json parse)."""
    return {**guard_key(config_bytes, backend=backend, backend_version=backend_version),
            "delta_ray": _delta_ray_version(), "battery": BATTERY_FORMAT}


def _fuzz_at_admission(config_bytes: bytes, reference: ReferenceEncoder, fast, guard) -> tuple[set[int], list[str]]:
    """Fuzz the guarded engine; returns (code points to guard, disagreements with nothing to guard)."""
    seconds = float(os.environ.get("DELTA_RAY_ADMISSION_FUZZ_SECONDS", ADMISSION_FUZZ_SECONDS))
    if seconds <= 0:
        return set(), []
    cfg = json.loads(config_bytes)
    added = [t["content"] for t in cfg.get("added_tokens") or []]

    def checked(encode):  # a checkpoint before each native call (see exit_guard)
        def run(texts):
            checkpoint()
            return encode(texts)
        return run

    res = fuzz(checked(reference.encode_pieces), checked(fast.encode_pieces), fuzz_alphabet(cfg, added),
               allows=guard.allows, seconds=seconds)
    extra: set[int] = set()
    unguardable: list[str] = []
    for text in res.disagreements:
        cps = {ord(ch) for ch in text if ord(ch) >= 0x80}
        if cps:
            extra |= cps
        else:
            unguardable.append(text)
    return extra, unguardable


def admit_fast(config_bytes: bytes, reference: ReferenceEncoder, backend: str = "auto") -> FastTier:
    """Load, guard, fuzz and verify the fast engine (cached); a FastTier or FastEngineUnavailable."""
    checkpoint()
    fast = cached_fast_encoder(config_bytes, backend)
    checkpoint()
    key = verdict_key(config_bytes, fast.backend, fast.backend_version)
    rec = load_verdict(key)
    if rec is not None:
        guard = guard_from_ranges(rec["ranges"], key, {**rec["stats"], "cached": True})
        ok, reason = rec["ok"], rec["reason"]
    else:
        guard = guard_set_for(config_bytes, fast, ref_tokenizer=reference.tokenizer)
        checkpoint()
        extra, unguardable = _fuzz_at_admission(config_bytes, reference, fast, guard)
        if extra:
            guard = GuardSet(guard.code_points | frozenset(extra), key=guard.key,
                             stats={**guard.stats, "fuzz_guarded": len(extra)})
        if unguardable:
            ok, reason = False, f"the fuzzer found an ASCII text the engine gets wrong: {unguardable[0][:80]!r}"
        else:
            ok, reason = verify_fast_engine(reference.tokenizer, fast, guard=guard, config=json.loads(config_bytes))
        checkpoint()  # an admission cut short by the exit records nothing
        save_verdict(key, ok, reason, [list(r) for r in guard.ranges()], guard.stats)
        if ok:  # a rejection persisted meanwhile (another process's shadow verifier) wins
            latest = load_verdict(key)
            if latest is not None and not latest["ok"]:
                ok, reason = False, latest["reason"]
    if not ok:
        raise FastEngineUnavailable(f"{fast.backend} {fast.backend_version} is not admitted: {reason}")
    return FastTier(fast, guard, verdict_key=key,
                    description=f"fast ({fast.backend} {fast.backend_version}, {len(guard)} guarded code points)")


def cached_admission_exists(config_bytes: bytes, backend: str = "auto") -> bool:
    """Whether a passing, valid admission for this tokenizer and the installed versions is on disk.

    Computed from package metadata alone (loading an engine costs seconds).
    """
    for cand in (FAST_BACKENDS if backend == "auto" else (backend,)):
        version = package_version(cand)
        if version is None:
            continue
        rec = load_verdict(verdict_key(config_bytes, cand, version))
        return bool(rec and rec["ok"])
    return False


_BG_LOCK = threading.Lock()
_BG_STARTED: set[str] = set()


def select_engine(engine: str, config_bytes: bytes, target: Engine, *, digest: str,
                  on_ready: Callable[[str], None] | None = None) -> str:
    """Configure ``target`` for ``engine``; returns a human-readable reason."""
    if engine not in C.ENGINES:
        raise ValueError(f"engine must be one of {C.ENGINES}, got {engine!r}")
    if engine == "reference":
        target.reason = "reference (requested)"
        return target.reason
    if engine == "fast" or cached_admission_exists(config_bytes):
        try:
            enc = admit_fast(config_bytes, target.reference)
        except FastEngineUnavailable as exc:
            if engine == "fast":
                raise
            target.reason = f"reference (fast tier unavailable: {exc})"
            return target.reason
        target.use(enc, enc.description)
        return target.reason
    # auto, nothing cached: admit in the background unless disabled (tests, tiny jobs)
    if os.environ.get("DELTA_RAY_FAST_BACKGROUND", "1") == "0":
        target.reason = "reference (fast tier not admitted yet; background admission disabled)"
        return target.reason
    target.reason = "reference (fast tier admission running in the background)"
    _start_background(config_bytes, target, digest, on_ready)
    return target.reason


def _start_background(config_bytes: bytes, target: Engine, digest: str, on_ready) -> None:
    """Admit the fast tier in a background thread (see :mod:`delta_ray._runtime.exit_guard` for how it ends
    when the process exits: at its next checkpoint, before finalization, recording nothing)."""
    def waiting(msg: str) -> None:  # shown by DeltaTokenizer.admission.engine while the lock is busy
        if target.disabled_reason is None:
            target.reason = f"reference (fast tier admission {msg})"

    def run():
        try:
            # one probing process per machine; a stopped or hung holder is waited for with a bound
            with bounded_lock(f"admitting-{digest[:16]}.lock", on_wait=waiting) as lock:
                if target.disabled_reason is None:
                    target.reason = ("reference (fast tier admission running in the background)" if lock.held
                                     else f"reference (fast tier admission running: {lock.reason})")
                enc = admit_fast(config_bytes, target.reference)
            target.use(enc, enc.description)
            log.info("fast tier admitted: %s", enc.description)
        except FastEngineUnavailable as exc:
            target.reason = f"reference (fast tier unavailable: {exc})"
        except Exception as exc:  # noqa: BLE001 - the reference keeps serving
            target.reason = f"reference (fast tier admission failed: {type(exc).__name__}: {exc})"
            log.warning("fast tier admission failed", exc_info=True)
        if on_ready is not None:
            on_ready(target.reason)

    with _BG_LOCK:
        key = f"{digest}:{id(target)}"
        if key in _BG_STARTED:
            return
        _BG_STARTED.add(key)
    start_thread(run, "delta-ray-fast-admission")
