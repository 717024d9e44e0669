"""A machine-wide lock file in the private cache, waited for with a bound and a visible reason.

The fast tier's admission takes one such lock so that one process per machine probes a tokenizer
while the others keep serving with the reference. The lock only saves duplicate work (verdicts are
written atomically, and a rejection cannot be overwritten: :mod:`delta_ray._engine.verdicts`), so a waiter
never waits without bound: after ``timeout`` seconds, or as soon as the holder is seen to be stopped
(``SIGSTOP``, a debugger), a zombie, or gone while the lock is still held (an inherited descriptor),
it goes on without the lock. Its holder writes ``pid start-ticks acquired-at`` into the file so that
a waiter can say whom it waits for (:attr:`LockWait.reason`), and tell a reused pid from the holder.

``flock`` locks are released by the kernel when their holder dies, so a dead holder never blocks;
what this module adds is the stopped or hung holder, which used to block admission on the whole
machine, silently.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from .cache_store import private_dir_fd
from .exit_guard import checkpoint

log = logging.getLogger("delta_ray.cache")

LOCK_TIMEOUT_S = 600.0  # DELTA_RAY_ADMISSION_LOCK_TIMEOUT_S overrides: longer than any admission seen
STALE_AFTER_S = 5.0  # a holder stopped (or gone) for this long is not waited for


@dataclass
class LockWait:
    """How taking the lock went: ``held`` (this process holds it) or why it goes on without it."""

    held: bool
    reason: str = ""
    waited_s: float = 0.0


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 on), or None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def _start_ticks(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks): a pid's identity across reuse."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def _state(pid: int) -> str | None:
    """The one-letter process state from /proc (R, S, D, T, t, Z, ...), or None when unknown/gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_holder(fd: int) -> tuple[str, bool]:
    """(a description of the lock's holder, whether it is stale: stopped, a zombie or gone)."""
    try:
        info = os.pread(fd, 128, 0).decode("ascii", "replace").split()
        pid, ticks, since = int(info[0]), info[1], float(info[2])
    except (OSError, ValueError, IndexError):
        return "an unknown process (no holder recorded yet)", False
    ago = f"{max(0.0, time.time() - since):.0f} s ago"
    if not _alive(pid) or (_start_ticks(pid) not in (None, ticks)):
        return f"pid {pid} (gone; taken {ago})", True
    state = _state(pid)
    if state in ("T", "t"):
        return f"pid {pid} (stopped; taken {ago})", True
    if state in ("Z", "X"):
        return f"pid {pid} (a zombie; taken {ago})", True
    return f"pid {pid} (taken {ago})", False


def _try_flock(fd: int) -> bool:
    import fcntl  # lazy: Unix only; the module imports elsewhere
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextlib.contextmanager
def bounded_lock(name: str, *, sub: str = "guard", timeout: float | None = None,
                 stale_after: float = STALE_AFTER_S, poll: float = 0.2,
                 on_wait: Callable[[str], None] | None = None) -> Iterator[LockWait]:
    """Hold the lock file ``name`` of the private cache, waiting at most ``timeout`` seconds.

    Yields a :class:`LockWait`: ``held=True``, or ``held=False`` with the reason it goes on without
    the lock (caching off, timeout, a stale holder). ``on_wait(reason)`` is called when the wait
    starts and whenever the holder's description changes (the caller shows it: ``admission``).
    A background thread's wait ends at the process's exit (:func:`delta_ray._runtime.exit_guard.checkpoint`).
    """
    if timeout is None:
        timeout = float(os.environ.get("DELTA_RAY_ADMISSION_LOCK_TIMEOUT_S", LOCK_TIMEOUT_S))
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    with private_dir_fd(sub) as dfd:
        if dfd is None:
            yield LockWait(False, "caching is off")
            return
        try:
            fd = os.open(name, flags, 0o600, dir_fd=dfd)
        except OSError as exc:
            yield LockWait(False, f"the lock file cannot be opened ({exc.strerror})")
            return
    try:
        t0 = time.monotonic()
        stale_since: float | None = None
        last = None
        outcome = None
        while not _try_flock(fd):
            now = time.monotonic()
            holder, stale = describe_holder(fd)
            stale_since = (stale_since or now) if stale else None
            if holder != last:
                last = holder
                msg = f"waiting for the lock {name}, held by {holder}"
                log.info(msg)
                if on_wait is not None:
                    on_wait(msg)
            if stale_since is not None and now - stale_since >= stale_after:
                outcome = LockWait(False, f"went on without the lock {name}: its holder, {holder}, "
                                          f"is stale", now - t0)
                break
            if now - t0 >= timeout:
                outcome = LockWait(False, f"went on without the lock {name}: held by {holder} for "
                                          f"more than {timeout:.0f} s", now - t0)
                break
            checkpoint()
            time.sleep(poll)
        if outcome is not None:
            log.warning("%s", outcome.reason)
            yield outcome
            return
        # Who holds it, for waiters' messages: pid, its start time (a reused pid differs), when.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {_start_ticks(os.getpid())} {time.time():.3f}\n".encode(), 0)
        try:
            yield LockWait(True, "", time.monotonic() - t0)
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # nobody holds it now: no stale name for the next waiter
    finally:
        os.close(fd)  # releases the flock
