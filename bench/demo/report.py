"""What the demo prints: aligned tables, verdict lines, progress for anything slow, quiet logs.

Everything goes to stdout; stderr stays empty. Python logging (delta-ray's and Ray's driver-side
loggers) goes to one file the demo names, so a warning is kept, not lost, and never interleaved
with the tables.
"""
from __future__ import annotations

import logging
import os
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence


def out(line: str = "") -> None:
    """One line on stdout, flushed (progress lines and tables share the terminal)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def timed(fn: Callable[..., object], *args: object) -> tuple[object, float]:
    """``fn(*args)``'s result and its wall time in seconds."""
    t0 = time.perf_counter()
    r = fn(*args)
    return r, time.perf_counter() - t0


def size_label(n: int) -> str:
    """A text size as a table shows it: ``1M``, ``100K`` (``1500K`` for sizes between millions)."""
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}K"


def ms(seconds: float | None) -> str:
    """A duration in ms, with the precision a reader needs at that size ("-" when not measured)."""
    if seconds is None:
        return "-"
    v = seconds * 1e3
    if v < 1:
        return f"{v:.2f} ms"
    if v < 10:
        return f"{v:.1f} ms"
    return f"{v:,.0f} ms"


def ratio(base: float | None, ours: float | None) -> str:
    """``base / ours`` as "12x" (or "-" when either side is missing)."""
    if not base or not ours:
        return "-"
    r = base / ours
    return f"{r:,.0f}x" if r >= 10 else f"{r:.1f}x"


def best(*xs: float | None) -> float | None:
    """The fastest of the figures that were measured (None when none was)."""
    got = [x for x in xs if x]
    return min(got) if got else None


def median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


class Table:
    """One aligned table: first column left-aligned, the others right-aligned."""

    def __init__(self, title: str, columns: Sequence[str]):
        self.title = title
        self.columns = list(columns)
        self.rows: list[list[str]] = []

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def print(self) -> None:
        widths = [max(len(r[i]) for r in [self.columns, *self.rows]) for i in range(len(self.columns))]

        def fmt(row):
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        out()
        out(self.title)
        out("  " + fmt(self.columns))
        out("  " + "  ".join("-" * w for w in widths))
        for r in self.rows:
            out("  " + fmt(r))


def verdict(text: str) -> None:
    out(f"  => {text}")


@contextmanager
def progress(label: str, estimate_s: float | None = None, *, transient: bool = False) -> Iterator[None]:
    """Show that something slow is running: a bar against ``estimate_s`` (or a clock) on a
    terminal, refreshed from a thread; one line before and one after otherwise (logs, tests).
    ``transient``: erased when done on a terminal, nothing printed otherwise (the table follows)."""
    t0 = time.perf_counter()
    tty = sys.stdout.isatty()
    stop = threading.Event()

    def draw(final: bool = False) -> None:
        el = time.perf_counter() - t0
        if estimate_s:
            frac = 1.0 if final else min(el / estimate_s, 0.95)
            bar = "#" * int(24 * frac) + "." * (24 - int(24 * frac))
            tail = f"{el:5.0f} s" + ("" if final else f" of ~{estimate_s:.0f} s")
            line = f"  {label} [{bar}] {tail}"
        else:
            line = f"  {label} ... {el:.1f} s"
        if final and transient:
            sys.stdout.write("\r" + " " * 78 + "\r")
        else:
            sys.stdout.write("\r" + line.ljust(78) + ("\n" if final else ""))
        sys.stdout.flush()

    ticker = None
    if tty:
        def tick():
            while not stop.wait(0.25):
                draw()
        ticker = threading.Thread(target=tick, name="delta-ray-demo-progress", daemon=True)
        ticker.start()
    elif not transient:
        out(f"  {label} ..." + (f" (about {estimate_s:.0f} s)" if estimate_s else ""))
    try:
        yield
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()
            draw(final=True)
        elif not transient:
            out(f"  {label}: done in {time.perf_counter() - t0:.1f} s")


class Steps:
    """A counter bar for loops of timed calls ("chat 1M: turns 3/12"), on a terminal only; erased
    when done (the table replaces it)."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.n = label, total, 0
        self.tty = sys.stdout.isatty()

    def step(self) -> None:
        self.n += 1
        if self.tty:
            sys.stdout.write(f"\r  {self.label} {self.n}/{self.total}".ljust(78))
            if self.n >= self.total:
                sys.stdout.write("\r" + " " * 78 + "\r")
            sys.stdout.flush()


def log_to_file(path: str) -> None:
    """Send every Python log record (delta-ray's, Ray's driver-side) to ``path``, none to stderr.

    Ray's import installs a stderr handler on the ``ray`` logger; :func:`quiet_ray_loggers` must
    run again after ``import ray``.
    """
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.lastResort = handler  # a record no handler takes goes to the file too, not to stderr
    _FILE_HANDLER[0] = handler


_FILE_HANDLER: list[logging.Handler | None] = [None]


def quiet_ray_loggers() -> None:
    """Point Ray's own Python loggers (``ray``, ``ray.serve``, ``ray.data``...) at the log file."""
    handler = _FILE_HANDLER[0]
    names = [n for n in list(logging.Logger.manager.loggerDict) if n == "ray" or n.startswith("ray.")]
    for name in ["ray", *names]:
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            # Ray's console handlers go; its own file handlers (Serve's, in the session's logs) stay.
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                lg.removeHandler(h)
        if handler is not None and (not lg.propagate or name == "ray") and handler not in lg.handlers:
            lg.addHandler(handler)
        if name == "ray":
            lg.propagate = False


def demo_log_path() -> str:
    """Where the demo's Python log records go: the cache directory when private, else /tmp."""
    import tempfile

    from delta_ray._runtime.cache_store import cache_root
    d = str(cache_root())
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
    except OSError:
        d = tempfile.gettempdir()
    return os.path.join(d, "demo.log")
