"""Clean exit: no delta-ray background thread is inside a native call when the interpreter finalizes.

delta-ray runs work off the caller's path in daemon threads (the fast tier's background admission,
the shadow verifier, the verdict watcher). Several of their calls drop the GIL inside a native
extension (fastokens' encode, the reference's batch encode). A daemon thread that is inside such a
call when finalization begins is ended by CPython when it takes the GIL back, with a forced unwind
through the extension's frames; the extension's panic guard swallows that unwind and glibc aborts
the process ("FATAL: exception not rethrown", status 134). A thread that submits to a
``ThreadPoolExecutor`` after ``concurrent.futures`` has shut down gets "cannot schedule new futures
after interpreter shutdown" instead.

So every such thread is started with :func:`start_thread`, and one exit hook, registered with
``threading._register_atexit``, runs before either can happen: it sets the exit flag, asks each
thread to stop (its ``stop`` callback), and joins it. Joining is bounded by one native call because
the threads check the flag between native calls (:func:`checkpoint` raises :class:`ExitCancelled`
in them). Why this hook: ``Py_FinalizeEx`` (CPython 3.9-3.13) calls ``threading._shutdown`` first,
which runs the ``_register_atexit`` callbacks, most recent first, before it joins the non-daemon
threads; ``atexit`` callbacks come later, and only then is the runtime marked as finalizing (the
point after which a daemon thread taking the GIL is ended). ``concurrent.futures.thread`` registers
its own callback (it stops every executor) at import; this module imports it first, so its hook is
registered later and runs earlier: a thread being joined can still finish its executor's work.
"""
from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 - imported before our hook is registered: see above
import logging
import os
import threading
import time
from typing import Callable, cast

log = logging.getLogger("delta_ray.exit")

JOIN_TIMEOUT_S = float(os.environ.get("DELTA_RAY_EXIT_JOIN_S", "120"))  # a hung native call must not hang exit forever

_exiting = False
_lock = threading.Lock()
_threads: dict[int, tuple[threading.Thread, Callable[[], None] | None]] = {}  # ident -> (thread, stop)


class ExitCancelled(BaseException):
    """Raised by :func:`checkpoint` in a registered background thread once the process exits.

    A ``BaseException``: the ``except Exception`` handlers on the way (a battery that turns an
    engine's exception into a failed verdict) must not record an exit as a finding."""


def exiting() -> bool:
    """Whether the exit hook has run (the process is finalizing)."""
    return _exiting


def checkpoint() -> None:
    """Raise :class:`ExitCancelled` if the process exits and this is a registered background thread.

    Call it before each native call of a background job. Costs one global read while running; other
    threads (the caller's, a user's non-daemon thread, an ``atexit`` handler) are never cancelled."""
    if _exiting and threading.get_ident() in _threads:
        raise ExitCancelled()


def start_thread(target: Callable[[], None], name: str,
                 stop: Callable[[], None] | None = None) -> threading.Thread | None:
    """Start ``target`` in a daemon thread that the exit hook stops and joins; None once exiting.

    ``stop`` wakes the thread if it may be blocked outside a checkpoint (a queue, an event)."""
    def run() -> None:
        try:
            target()
        except ExitCancelled:
            pass
        finally:
            with _lock:
                _threads.pop(threading.get_ident(), None)

    with _lock:
        if _exiting:
            return None
        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        _threads[cast(int, t.ident)] = (t, stop)  # a started thread has its ident
    return t


def _at_exit() -> None:
    """Stop and join every registered thread (runs before finalization; see the module docstring)."""
    global _exiting
    with _lock:
        _exiting = True
        pending = list(_threads.values())
    for _, stop in pending:
        if stop is not None:
            try:
                stop()
            except Exception:  # noqa: BLE001 - one failing stop must not skip the joins
                log.debug("a stop callback failed", exc_info=True)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for t, _ in pending:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            log.warning("delta-ray thread %s did not stop within %.0f s at exit", t.name, JOIN_TIMEOUT_S)


if hasattr(threading, "_register_atexit"):  # CPython 3.9+: a third-party seam, see the module docstring
    threading._register_atexit(_at_exit)  # type: ignore[attr-defined]  # third-party seam: see the module docstring
else:  # pragma: no cover - other interpreters: atexit still runs before finalization
    import atexit
    atexit.register(_at_exit)
