"""Engine selection: the fastest encoder proven exact for a tokenizer, the reference elsewhere.

``engine="reference"`` always encodes with the reference and never reads or writes the admission
cache. ``engine="fast"`` admits the fast tier now (load the native engine, derive or load its guard
set, fuzz it, run the verification battery; blocking, cached on disk) and raises
:class:`FastEngineUnavailable` if it fails. ``engine="auto"`` (default) uses the fast tier at once
when a passing admission for this tokenizer and these versions is cached; otherwise it starts with
the reference and admits the fast tier in a background thread (one process per machine does the
probe, under a lock file), switching when it passes. The cuts, repairs, store and pool never care
which encoder ran.

An admission is one record (:mod:`delta_ray.runtime.cache_store`) bound to the tokenizer's SHA-256, the
engine's name and version, the reference's version, delta-ray's version, the probe's and the
battery's formats, and carrying the guard set with its own digest. A record that fails validation is
discarded and the admission re-run; a rejection (failed battery, a shadow mismatch) is persisted so
that no later process admits the engine again for the same versions.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, NamedTuple

from delta_ray.core import constants as C
from ..core.encoder import Encoder, ReferenceEncoder
from ..runtime.exit_guard import checkpoint, start_thread
from .shadow import ShadowVerifier

log = logging.getLogger("delta_ray.verify.engines")
BATTERY_FORMAT = 2  # bump when the battery or the admission fuzz changes
ADMISSION_FUZZ_SECONDS = 4.0  # fuzzing at admission (DELTA_RAY_ADMISSION_FUZZ_SECONDS overrides)


def _delta_ray_version() -> str:
    from .fast_engine import package_version
    return package_version("delta-ray") or "0+unknown"


def verdict_key(config_bytes: bytes, backend: str, backend_version: str | None) -> dict:
    """The whole key of an admission record (cheap: package metadata, no tokenizer.json parse)."""
    from .guard_probe import guard_key
    return {**guard_key(config_bytes, backend=backend, backend_version=backend_version),
            "delta_ray": _delta_ray_version(), "battery": BATTERY_FORMAT}


def _valid_verdict(p: dict) -> bool:
    from .guard_runtime import valid_guard_payload
    return (isinstance(p.get("ok"), bool) and isinstance(p.get("reason"), str)
            and isinstance(p.get("at"), (int, float)) and valid_guard_payload(p))


# A rejection lives in its own record, which no admission ever writes: a passing verdict written
# late (a slow admission finishing after another process's shadow verifier caught the engine) can
# therefore never replace it, whatever the interleaving, without a lock.
REJECTION_KIND = "verdict-rejected"


def load_verdict(key: dict) -> dict | None:
    """The validated admission record for ``key``, or None (absent, altered, or caching off).

    A persisted rejection wins over any passing record for the same key."""
    from ..runtime.cache_store import load_record
    rejected = load_record(REJECTION_KIND, key, validate=_valid_verdict)
    if rejected is not None and not rejected["ok"]:
        return rejected
    return load_record("verdict", key, validate=_valid_verdict)


def save_verdict(key: dict, ok: bool, reason: str, ranges: list, stats: dict | None = None) -> bool:
    """Persist an admission verdict; a rejection (``ok=False``) goes to its own record, which a later
    passing verdict cannot overwrite. False when caching is off or the write failed."""
    from ..runtime.cache_store import save_record
    from .guard_runtime import ranges_digest
    ranges = [list(map(int, r)) for r in ranges]
    payload = {"ok": bool(ok), "reason": str(reason), "at": time.time(),
               "ranges": ranges, "ranges_sha256": ranges_digest(ranges), "stats": stats or {}}
    if ok:
        from ..runtime.cache_store import load_record
        old = load_record("verdict", key, validate=_valid_verdict)
        if old is not None and not old["ok"]:  # a rejection written before rejections had their own record
            return False
    return save_record("verdict" if ok else REJECTION_KIND, key, payload)


def reject_verdict(key: dict | None, reason: str) -> None:
    """Persist that this engine must not be admitted again for these versions (a caught mismatch)."""
    if key is not None:
        save_verdict(key, False, reason, [], {"rejected_at_run_time": True})


def _fuzz_at_admission(config_bytes: bytes, reference: ReferenceEncoder, fast, guard) -> tuple[set[int], list[str]]:
    """Fuzz the guarded engine; returns (code points to guard, disagreements with nothing to guard)."""
    import json

    from .fuzz import fuzz, fuzz_alphabet
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


def admit_fast(config_bytes: bytes, reference: ReferenceEncoder, backend: str = "auto") -> Encoder:
    """Load, guard, fuzz and verify the fast engine (cached); a GuardedEncoder or FastEngineUnavailable."""
    from .fast_engine import FastEngineUnavailable, cached_fast_encoder
    from .guard_battery import verify_fast_engine
    from .guard_probe import guard_set_for
    from .guard_runtime import GuardedEncoder, GuardSet, guard_from_ranges

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
            import json
            ok, reason = verify_fast_engine(reference.tokenizer, fast, guard=guard, config=json.loads(config_bytes))
        checkpoint()  # an admission cut short by the exit records nothing
        save_verdict(key, ok, reason, [list(r) for r in guard.ranges()], guard.stats)
        if ok:  # a rejection persisted meanwhile (another process's shadow verifier) wins
            latest = load_verdict(key)
            if latest is not None and not latest["ok"]:
                ok, reason = False, latest["reason"]
    if not ok:
        raise FastEngineUnavailable(f"{fast.backend} {fast.backend_version} is not admitted: {reason}")
    enc = GuardedEncoder(fast, guard, reference, verdict_key=key)
    enc.description = f"fast ({fast.backend} {fast.backend_version}, {len(guard)} guarded code points)"
    return enc


def cached_admission_exists(config_bytes: bytes, backend: str = "auto") -> bool:
    """Whether a passing, valid admission for this tokenizer and the installed versions is on disk.

    Computed from package metadata alone (loading an engine costs seconds).
    """
    from .fast_engine import FAST_BACKENDS, package_version
    for cand in (FAST_BACKENDS if backend == "auto" else (backend,)):
        version = package_version(cand)
        if version is None:
            continue
        rec = load_verdict(verdict_key(config_bytes, cand, version))
        return bool(rec and rec["ok"])
    return False


class FastPath(NamedTuple):
    """What the engine in use offers a caller that runs it directly (a session turn), bound to one
    generation of :class:`EngineSwitch`: the caller re-reads the generation before it stores what
    it computed, as every path does."""

    generation: int
    engine: Any  # the guarded encoder in use: its counters, and what the shadow checks answers against
    encode: Callable[[list[str]], tuple[bytes, bytes]]  # native flat call: LE int32 IDs, LE int64 offsets
    allows: Callable[[str], bool] | None  # the guard's test of a piece; None when nothing is guarded
    shadow: ShadowVerifier  # its sampling step runs once per call


class EngineSwitch:
    """The engine a tokenizer uses now: the reference or the admitted fast tier, switchable at run
    time (admission, a shadow mismatch), with the generation every switch bumps, the shadow
    verifier that samples the fast tier's answers and the guard of the engine in use.

    Implements the Encoder protocol by delegating, so every path picks up a switch at its next call;
    :meth:`fast_path` is the same engine for a caller that runs it directly. ``on_disable``
    callbacks run once when the fast tier is disabled: the owners discard every state the engine
    produced (sessions, content entries, mirrors).
    """

    def __init__(self, reference: ReferenceEncoder, shadow_rate: float = 0.0):
        self.reference = reference
        self.current: Encoder = reference
        self.reason = "reference"
        self.disabled_reason: str | None = None
        self.generation = 0  # bumped on every switch: states tagged with an older one are stale
        self._lock = threading.Lock()
        self._on_disable: list[Callable[[str], None]] = []
        self.shadow = ShadowVerifier(self, shadow_rate)  # re-checks a share of the fast tier's answers
        self._fast_path: tuple[int, FastPath | None] = (-1, None)  # (generation, its fast path)

    def fast_path(self) -> FastPath | None:
        """The engine in use now for a caller that runs it itself: its native flat call, its guard's
        test and the shadow's sampling step, or None where only the layered path serves (the
        reference, a disabled tier, an engine without a native flat call). Made once per generation."""
        generation, fp = self._fast_path
        if generation == self.generation:
            return fp
        with self._lock:
            enc = self.current
            fast, guard = getattr(enc, "fast", None), getattr(enc, "guard", None)
            raw = getattr(fast, "raw_flat", None)
            fp = None
            if self.disabled_reason is None and enc is not self.reference and guard is not None and raw is not None:
                fp = FastPath(self.generation, enc, raw, guard.allows if len(guard) else None, self.shadow)
            self._fast_path = (self.generation, fp)
            return fp

    @property
    def name(self) -> str:
        return self.current.name

    def encode_pieces(self, texts):
        return self.current.encode_pieces(texts)

    def encode_flat(self, texts):
        from ..core.encoder import encode_flat
        return encode_flat(self.current, texts)

    def add_disable_listener(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(reason)`` when the fast tier is disabled (at once if it already was)."""
        with self._lock:
            self._on_disable.append(fn)
            disabled = self.disabled_reason
        if disabled is not None:
            fn(disabled)

    def use(self, enc: Encoder, reason: str) -> None:
        with self._lock:
            if self.disabled_reason is None:
                self.current, self.reason = enc, reason
                self.generation += 1
        if getattr(enc, "verdict_key", None) is not None:
            _watch_verdict(self, enc.verdict_key)

    def back_to_reference(self, reason: str) -> None:
        """Permanently return to the reference, persist the rejection, and purge what the engine made."""
        with self._lock:
            if self.disabled_reason is not None:
                return
            wrong = self.current
            self.disabled_reason = reason
            self.current, self.reason = self.reference, f"reference (fast tier disabled: {reason})"
            self.generation += 1
            listeners = list(self._on_disable)
        reject_verdict(getattr(wrong, "verdict_key", None), reason)
        for fn in listeners:
            try:
                fn(reason)
            except Exception:  # noqa: BLE001 - one failing listener must not keep the others' states
                log.warning("a purge listener failed", exc_info=True)


VERDICT_POLL_S = 2.0  # how often a process using the fast tier re-reads its verdict


def _watch_verdict(switch: EngineSwitch, key: dict) -> None:
    """Poll the admission record: a rejection persisted by another process (a pool worker whose
    shadow verifier caught the engine) disables the fast tier here too, with the same purge."""
    import weakref
    ref = weakref.ref(switch)
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


_BG_LOCK = threading.Lock()
_BG_STARTED: set[str] = set()


def select_engine(engine: str, config_bytes: bytes, switch: EngineSwitch, *, digest: str,
                  on_ready: Callable[[str], None] | None = None) -> str:
    """Configure ``switch`` for ``engine``; returns a human-readable reason."""
    if engine not in C.ENGINES:
        raise ValueError(f"engine must be one of {C.ENGINES}, got {engine!r}")
    if engine == "reference":
        switch.reason = "reference (requested)"
        return switch.reason
    from .fast_engine import FastEngineUnavailable
    if engine == "fast" or cached_admission_exists(config_bytes):
        try:
            enc = admit_fast(config_bytes, switch.reference)
        except FastEngineUnavailable as exc:
            if engine == "fast":
                raise
            switch.reason = f"reference (fast tier unavailable: {exc})"
            return switch.reason
        switch.use(enc, enc.description)
        return switch.reason
    # auto, nothing cached: admit in the background unless disabled (tests, tiny jobs)
    if os.environ.get("DELTA_RAY_FAST_BACKGROUND", "1") == "0":
        switch.reason = "reference (fast tier not admitted yet; background admission disabled)"
        return switch.reason
    switch.reason = "reference (fast tier admission running in the background)"
    _start_background(config_bytes, switch, digest, on_ready)
    return switch.reason


def _start_background(config_bytes: bytes, switch: EngineSwitch, digest: str, on_ready) -> None:
    """Admit the fast tier in a background thread (see :mod:`delta_ray.runtime.exit_guard` for how it ends
    when the process exits: at its next checkpoint, before finalization, recording nothing)."""
    def waiting(msg: str) -> None:  # shown by DeltaTokenizer.admission.engine while the lock is busy
        if switch.disabled_reason is None:
            switch.reason = f"reference (fast tier admission {msg})"

    def run():
        from ..runtime.cache_lock import bounded_lock
        from .fast_engine import FastEngineUnavailable
        try:
            # one probing process per machine; a stopped or hung holder is waited for with a bound
            with bounded_lock(f"admitting-{digest[:16]}.lock", on_wait=waiting) as lock:
                if switch.disabled_reason is None:
                    switch.reason = ("reference (fast tier admission running in the background)" if lock.held
                                     else f"reference (fast tier admission running: {lock.reason})")
                enc = admit_fast(config_bytes, switch.reference)
            switch.use(enc, enc.description)
            log.info("fast tier admitted: %s", enc.description)
        except FastEngineUnavailable as exc:
            switch.reason = f"reference (fast tier unavailable: {exc})"
        except Exception as exc:  # noqa: BLE001 - the reference keeps serving
            switch.reason = f"reference (fast tier admission failed: {type(exc).__name__}: {exc})"
            log.warning("fast tier admission failed", exc_info=True)
        if on_ready is not None:
            on_ready(switch.reason)

    with _BG_LOCK:
        key = f"{digest}:{id(switch)}"
        if key in _BG_STARTED:
            return
        _BG_STARTED.add(key)
    start_thread(run, "delta-ray-fast-admission")
