"""Engine selection: the fastest encoder proven exact for a tokenizer, the reference elsewhere.

``engine="reference"`` always encodes with the reference. ``engine="fast"`` admits the fast tier
now (load the native engine, derive or load its guard set, run the verification battery; blocking,
cached on disk) and raises :class:`FastEngineUnavailable` if it fails. ``engine="auto"`` (default)
uses the fast tier at once when an admission for this tokenizer and these package versions is
already cached on disk; otherwise it starts with the reference and admits the fast tier in a
background thread (one process per machine does the probe, under a lock file), switching when it
passes. The cuts, repairs, store and pool never care which encoder ran.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from .encoder import Encoder, ReferenceEncoder

log = logging.getLogger("delta_ray.engines")
ENGINES = ("auto", "reference", "fast")


def _verdict_path(cache_key: str) -> Path:
    from .guard import _cache_root
    safe = cache_key.replace(":", "_").replace("/", "_")
    return _cache_root() / f"admitted-{safe}.json"


def admit_fast(config_bytes: bytes, reference: ReferenceEncoder, backend: str = "auto") -> Encoder:
    """Load, guard and verify the fast engine (cached); a GuardedEncoder or FastEngineUnavailable."""
    from .fast_engine import FastEngineUnavailable, cached_fast_encoder
    from .guard import GuardedEncoder, guard_set_for, verify_fast_engine

    fast = cached_fast_encoder(config_bytes, backend)
    guard = guard_set_for(config_bytes, fast, ref_tokenizer=reference.tokenizer)
    path = _verdict_path(fast.cache_key)
    try:
        verdict = json.loads(path.read_text())
    except (OSError, ValueError):
        ok, reason = verify_fast_engine(reference.tokenizer, fast, guard=guard)
        verdict = {"ok": ok, "reason": reason, "at": time.time()}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(verdict))
        os.replace(tmp, path)
    if not verdict.get("ok"):
        raise FastEngineUnavailable(f"{fast.backend} {fast.backend_version} failed the battery: {verdict.get('reason')}")
    enc = GuardedEncoder(fast, guard, reference)
    enc.description = f"fast ({fast.backend} {fast.backend_version}, {len(guard)} guarded code points)"
    return enc


def cached_admission_exists(config_bytes: bytes, backend: str = "auto") -> bool:
    """Whether a passing admission for this tokenizer and the installed versions is on disk.

    Computed from package metadata alone (loading an engine costs seconds): the key is the one
    ``FastEncoder.cache_key`` gives the first installed backend.
    """
    import hashlib

    from .fast_engine import FAST_BACKENDS, _version
    digest = hashlib.sha256(config_bytes).hexdigest()
    for cand in (FAST_BACKENDS if backend == "auto" else (backend,)):
        version = _version(cand)
        if version is None:
            continue
        key = f"{digest}:{cand}-{version}:tokenizers-{_version('tokenizers')}"
        try:
            return bool(json.loads(_verdict_path(key).read_text()).get("ok"))
        except (OSError, ValueError):
            return False
    return False


class EngineSwitch:
    """The encoder a DeltaTokenizer uses now, switchable at run time (admission, shadow mismatch).

    Implements the Encoder protocol by delegating, so every path picks up a switch at its next call.
    """

    def __init__(self, reference: ReferenceEncoder):
        self.reference = reference
        self.current: Encoder = reference
        self.reason = "reference"
        self.disabled_reason: str | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.current.name

    def encode_pieces(self, texts):
        return self.current.encode_pieces(texts)

    def use(self, enc: Encoder, reason: str) -> None:
        with self._lock:
            if self.disabled_reason is None:
                self.current, self.reason = enc, reason

    def back_to_reference(self, reason: str) -> None:
        """Permanently return to the reference (e.g. the shadow verifier found a mismatch)."""
        with self._lock:
            self.disabled_reason = reason
            self.current, self.reason = self.reference, f"reference (fast tier disabled: {reason})"


_BG_LOCK = threading.Lock()
_BG_STARTED: set[str] = set()


def select_engine(engine: str, config_bytes: bytes, switch: EngineSwitch, *, digest: str,
                  on_ready: Callable[[str], None] | None = None) -> str:
    """Configure ``switch`` for ``engine``; returns a human-readable reason."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
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
    def run():
        from .fast_engine import FastEngineUnavailable
        from .guard import _cache_root
        lock_path = _cache_root() / f"admitting-{digest[:16]}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
            with open(lock_path, "w") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)  # one probing process per machine; others wait, then hit the cache
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
    threading.Thread(target=run, name="delta-ray-fast-admission", daemon=True).start()
