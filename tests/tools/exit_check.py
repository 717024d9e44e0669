"""Child of test_clean_exit and tests/tools/exit_runs.py: construct a DeltaTokenizer with the default
engine (the fast tier is then admitted in the background when nothing is cached), check one encode
against the reference, wait and exit while the admission may be mid-call.

Usage: exit_check.py TOKENIZER_JSON DELAY_S [STAGE] [--finalizer]

With STAGE (``guard_probe``, ``fuzz``, ``guard_battery``), the delay starts once a background thread
runs in that module of the admission; with ``native``, once one is inside fastokens' GIL-releasing
encode; otherwise right after the encode. With ``--finalizer``, an object collected while the
runtime finalizes reports on stderr any delta-ray thread still alive then (the invariant: none), and
runs Python until they are gone (30 s at most), as any library's ``__del__`` may: a daemon thread
still in a native call then takes the GIL back during finalization, which used to abort the process
(status 134, "FATAL: exception not rethrown"). DELTA_RAY_CACHE and DELTA_RAY_FAST_BACKGROUND come
from the caller. faulthandler is on (it made the abort more frequent before the fix)."""
import faulthandler
import linecache
import os
import sys
import threading
import time

faulthandler.enable()


class SlowFinalizer:
    """Collected at finalization (module teardown): reports live delta-ray threads, then runs
    Python while any of them lives (so a thread returning from a native call meets a finalizing
    runtime, as with any ``__del__`` that takes a while)."""

    def __init__(self):
        # native ids: Thread.is_alive() says False for every daemon thread once finalization began
        self.threads = {t.native_id: t.name for t in threading.enumerate() if t.name.startswith("delta-ray")}
        self.monotonic, self.write, self.exists = time.monotonic, os.write, os.path.exists

    def alive(self) -> list:
        return [name for tid, name in self.threads.items() if self.exists(f"/proc/self/task/{tid}")]

    def __del__(self):
        alive = self.alive()
        if alive:
            self.write(2, f"delta-ray threads alive at finalization: {alive}\n".encode())
        end = self.monotonic() + 30
        while self.monotonic() < end and self.alive():
            sum(range(1000))


def _line(frame) -> str:
    return linecache.getline(frame.f_code.co_filename, frame.f_lineno)


def in_stage(stage: str) -> bool:
    """Whether a background thread runs in module ``stage``; ``native``: whether one is inside the
    fast engine's native encode now (its innermost Python frame is the backend's encode call)."""
    main = threading.main_thread().ident
    for ident, frame in sys._current_frames().items():
        if ident == main:
            continue
        if stage == "native":
            if (frame.f_code.co_filename.endswith(os.path.join("_engine", "native.py"))
                    and frame.f_code.co_name in ("encode_pieces", "encode_flat")
                    and "encode_batch_flat" in _line(frame)):
                return True
            continue
        while frame is not None:
            if frame.f_code.co_filename.endswith(f"{stage}.py"):
                return True
            frame = frame.f_back
    return False


def wait_for(stage: str, timeout: float = 900) -> None:
    end = time.monotonic() + timeout
    while not in_stage(stage) and time.monotonic() < end:
        time.sleep(0.01)


def main() -> None:
    from tokenizers import Tokenizer

    from delta_ray import DeltaTokenizer

    t0 = time.monotonic()
    args = [a for a in sys.argv[1:] if a != "--finalizer"]
    path, delay = args[0], float(args[1])
    tok = DeltaTokenizer(path)
    text = "Hello, world! Exiting while the fast tier is admitted in the background: 12345 \u00e9\u4e2d"
    got = tok.encode(text).to_pylist()
    want = Tokenizer.from_file(path).encode(text).ids
    if got != want:
        print(f"not the reference's IDs: {got} != {want}", file=sys.stderr)
        sys.exit(3)
    if args[2:]:
        wait_for(args[2])
    time.sleep(delay)
    if "--finalizer" in sys.argv:
        globals()["_finalizer"] = SlowFinalizer()
    print(f"{tok.admission.engine}; exiting after {time.monotonic() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
