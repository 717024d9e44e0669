"""A process exits cleanly while delta-ray's background threads work (issue 21, item 1).

Before exit_guard, a process that exited while the fast tier was being admitted in a daemon thread
could abort (status 134, "FATAL: exception not rethrown": the thread was inside fastokens'
GIL-releasing encode when finalization began, and took the GIL back during it) or print "cannot
schedule new futures after interpreter shutdown". The children (exit_check*.py) exit at the moment
that used to fail: while a background thread is inside a native call, with an object whose
``__del__`` runs Python during finalization (as any library's may) and reports on stderr any
delta-ray thread still alive then. Every run must exit 0 with nothing on stderr.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest

from delta_ray._runtime import exit_guard
from delta_ray._runtime.cache_store import cache_root

TOOLS = pathlib.Path(__file__).parents[1] / "tools"  # the child scripts
HAS_FAST = importlib.util.find_spec("fastokens") is not None


def fresh_cache(tmp: pathlib.Path, name: str) -> pathlib.Path:
    """A new private (0700) cache holding no admission record, only the per-code-point tables
    derived from the reference (minutes to rebuild on a busy machine, and not what is tested)."""
    d = tmp / name
    d.mkdir(mode=0o700)
    for f in cache_root().glob("*.npy"):
        shutil.copy(f, d / f.name)
    assert not (d / "guard").exists()
    return d


def run_child(script: str, args: list[str], cache: pathlib.Path, timeout: float = 1200) -> subprocess.CompletedProcess:
    env = dict(os.environ, DELTA_RAY_CACHE=str(cache), DELTA_RAY_FAST_BACKGROUND="1")
    return subprocess.run([sys.executable, str(TOOLS / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def qwen3(tokenizer_paths) -> str:
    from delta_ray import DeltaTokenizer
    DeltaTokenizer(tokenizer_paths["qwen-3"], engine="reference")  # derives (or finds) the tables
    return tokenizer_paths["qwen-3"]


def _check(results):
    bad = [(args, p.returncode, p.stdout[-300:], p.stderr[-1500:]) for args, p in results
           if p.returncode != 0 or p.stderr]
    assert not bad, bad


@pytest.mark.skipif(not HAS_FAST, reason="fastokens is not installed")
def test_exit_inside_a_native_call_of_the_background_admission_is_clean(qwen3, tmp_path):
    """Default engine, nothing cached: exit while the admission thread is inside fastokens' encode
    (the guard probe), and once right after the first encode. Before the fix, every run with the
    finalizer failed: the thread was alive at finalization (and the process aborted, 134)."""
    runs = [[qwen3, "0", "native", "--finalizer"], [qwen3, "0.2", "native", "--finalizer"], [qwen3, "0"]]
    results = [(args, run_child("exit_check.py", args, fresh_cache(tmp_path, f"c{i}")))
               for i, args in enumerate(runs)]
    _check(results)


@pytest.mark.skipif(not HAS_FAST, reason="fastokens is not installed")
def test_exit_while_the_shadow_verifier_encodes_is_clean(qwen3, tmp_path):
    """The shadow verifier's thread is stopped and joined before finalization (it was still alive,
    inside the reference's batch encode, before the fix)."""
    _check([([qwen3], run_child("exit_check_shadow.py", [qwen3], fresh_cache(tmp_path, f"s{i}")))
            for i in range(2)])


def test_exit_hook_stops_and_joins_a_thread_blocked_outside_a_checkpoint():
    """The hook's order of work: flag, stop callbacks, joins; checkpoint raises in the thread only."""
    stop = threading.Event()
    seen = []

    def work():
        stop.wait(30)
        seen.append("woken")
        exit_guard.checkpoint()
        seen.append("not cancelled")  # reached only without the flag

    t = exit_guard.start_thread(work, "test-exit-guard", stop=stop.set)
    try:
        exit_guard._exiting = True
        with exit_guard._lock:
            mine = [v for k, v in exit_guard._threads.items() if k == t.ident]
        for _, fn in mine:
            fn()
        t.join(10)
        assert not t.is_alive() and seen == ["woken"]
        exit_guard.checkpoint()  # the main thread is never cancelled
        assert exit_guard.start_thread(lambda: None, "late") is None  # nothing starts once exiting
    finally:
        exit_guard._exiting = False
    assert t.ident not in exit_guard._threads


@pytest.mark.slow
def test_acceptance_runs():
    """The issue's acceptance: 50 script runs exiting after 0-15 s and 8 `delta-ray tokenize` runs,
    each on a fresh private cache, all exit 0 with nothing on stderr (tests/tools/exit_runs.py)."""
    proc = subprocess.run([sys.executable, str(TOOLS / "exit_runs.py")], capture_output=True, text=True,
                          timeout=6 * 3600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
