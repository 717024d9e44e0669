"""The admission lock is waited for with a bound and says whom it waits for (issue 21, item 11).

Before: a process holding the lock but stopped (SIGSTOP, a debugger) or hung blocked the fast tier's
admission for every process on the machine, and nothing said why."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from delta_ray._core.reference_api import tokenizer_from_str
from delta_ray._engine.engine import Engine
from delta_ray._engine.native import FastEngineUnavailable
from delta_ray._verify import admit
from delta_ray._verify.admit import select_engine

HOLD_RAW = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""

HOLD_RECORDED = """
import sys, time
from delta_ray._runtime.cache_lock import bounded_lock
with bounded_lock(sys.argv[1]) as lock:
    assert lock.held
    print("held", flush=True)
    time.sleep(600)
"""


pytestmark = pytest.mark.usefixtures("private_cache")  # a fresh admission cache per test


@pytest.fixture
def switch(tokenizer_paths):
    from delta_ray._core.encoder import ReferenceEncoder
    data = open(tokenizer_paths["glm-4"], "rb").read()
    return Engine(ReferenceEncoder(tokenizer_from_str(data.decode()))), data


def _holder(code: str, arg: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code, arg], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    assert proc.stdout.readline().strip() == "held"
    return proc


def _admit_in_background(switch_and_data, monkeypatch) -> tuple[Engine, threading.Event, list]:
    """select_engine("auto") with nothing cached: the background admission, with a stand-in for the
    (minutes-long) probe that records that it ran."""
    sw, data = switch_and_data
    ran = []

    def fake_admit(config_bytes, reference, backend="auto"):
        ran.append(time.monotonic())
        raise FastEngineUnavailable("stand-in admission for the lock test")

    monkeypatch.setattr(admit, "admit_fast", fake_admit)
    monkeypatch.setattr(admit, "cached_admission_exists", lambda *a, **k: False)
    monkeypatch.setenv("DELTA_RAY_FAST_BACKGROUND", "1")
    done = threading.Event()
    digest = "ab" * 32
    select_engine("auto", data, sw, digest=f"{digest}-{id(sw)}", on_ready=lambda reason: done.set())
    return sw, done, ran


def _lock_path(tmp_path, sw) -> str:
    (tmp_path / "cache" / "guard").mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(tmp_path / "cache", 0o700)
    return str(tmp_path / "cache" / "guard" / f"admitting-{('ab' * 32 + '-' + str(id(sw)))[:16]}.lock")


def test_a_hung_holder_is_waited_for_with_a_bound_and_the_reason_is_shown(switch, tmp_path, monkeypatch):
    monkeypatch.setenv("DELTA_RAY_ADMISSION_LOCK_TIMEOUT_S", "3")
    holder = _holder(HOLD_RAW, _lock_path(tmp_path, switch[0]))
    try:
        sw, done, ran = _admit_in_background(switch, monkeypatch)
        seen = []
        end = time.monotonic() + 60
        while not done.is_set() and time.monotonic() < end:
            seen.append(sw.reason)
            time.sleep(0.05)
        assert done.is_set(), f"the admission is still blocked on the lock: {sw.reason}"
        assert ran, "the admission never ran"
        assert any("waiting for the lock" in r for r in seen), set(seen)
    finally:
        holder.kill()
        holder.wait()


def test_a_stopped_holder_is_detected_and_named(switch, tmp_path, monkeypatch):
    monkeypatch.setenv("DELTA_RAY_ADMISSION_LOCK_TIMEOUT_S", "600")  # only the detection can end the wait
    from delta_ray._runtime import cache_lock
    sw0, _ = switch
    name = os.path.basename(_lock_path(tmp_path, sw0))
    holder = _holder(HOLD_RECORDED, name)
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        with cache_lock.bounded_lock(name, stale_after=0.5) as lock:
            assert not lock.held
            assert f"pid {holder.pid} (stopped" in lock.reason and lock.waited_s < 60
        os.kill(holder.pid, signal.SIGCONT)  # a running holder is waited for (until the timeout)
        t0 = time.monotonic()
        with cache_lock.bounded_lock(name, timeout=1.0, stale_after=0.5) as lock:
            assert not lock.held and "more than 1 s" in lock.reason and f"pid {holder.pid}" in lock.reason
        assert time.monotonic() - t0 >= 1.0
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait()
    with cache_lock.bounded_lock(name, timeout=5) as lock:  # the holder is gone: the kernel released it
        assert lock.held
