"""delta-ray's one on-disk cache: where it lives, how files are written, and records that are checked.

Everything cached (per-code-point tables derived from the reference, guard sets, admission
verdicts, the probe's reference digests) goes under :func:`cache_root`, written by
:func:`atomic_write` alone. Tables (:func:`delta_ray._core.table_cache.cached_table`) are keyed by their
name, a format version and the reference's version, so an upgrade of ``tokenizers`` re-derives every table. A cached
*decision* (a guard set, a verdict) decides which engine encodes a user's text, so it is never trusted blindly:

* the directory must be a real directory owned by this user and writable by nobody else (created
  ``0700``); otherwise caching is off for the process (a warning, then in-memory admission). The
  check is made on an open descriptor of the directory, and files are opened relative to it, so a
  parent directory swapped for a symlink after the check redirects nothing (:func:`private_dir_fd`);
* files are written through a temporary file created exclusively (``O_EXCL | O_NOFOLLOW``, mode
  ``0600``) and renamed into place, and read without following symlinks, so another user cannot
  plant a link or a half-written file;
* a record is bound to its whole key and carries the SHA-256 of its canonical JSON: a record whose
  key differs, whose digest does not match, or that fails the caller's own validation is discarded
  (and the work redone), never half-read.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Any, Callable, Iterator

log = logging.getLogger("delta_ray.cache")

RECORD_FORMAT = 1
_WARNED: set[str] = set()


def cache_root() -> Path:
    """$DELTA_RAY_CACHE, else $XDG_CACHE_HOME/delta_ray, else ~/.cache/delta_ray."""
    base = os.environ.get("DELTA_RAY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "delta_ray")
    return Path(base)


def _warn_once(what: str) -> None:
    if what not in _WARNED:
        _WARNED.add(what)
        log.warning("%s: delta-ray caches nothing there for this process (admission runs in memory)", what)


_O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


@contextlib.contextmanager
def private_dir_fd(sub: str = "", *, create: bool = True) -> Iterator[int | None]:
    """An open descriptor of ``cache_root()/sub`` (created ``0700``), or None (with a warning) when
    that directory is not private to this user.

    The check is made on the descriptor (``fstat``), and every file operation of this module is
    relative to it (``dir_fd``): swapping any component of the path afterwards (a parent directory
    owned by someone else replaced by a symlink) redirects nothing, since the path is resolved once,
    when the descriptor is opened. The last component is opened with ``O_NOFOLLOW``. A reader passes
    ``create=False``: a missing directory then means "nothing cached" and nothing is created, so a
    background poller never makes a cache directory where nothing will be written."""
    path = cache_root() / sub if sub else cache_root()
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, _O_DIR)
    except OSError as exc:
        if not create and isinstance(exc, FileNotFoundError):
            yield None
            return
        _warn_once(f"cache directory {path} is unusable ({exc.strerror})")
        yield None
        return
    try:
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISDIR(st.st_mode):
            problem = f"cache path {path} is not a directory"
        elif hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            problem = f"cache directory {path} belongs to another user"
        elif st.st_mode & 0o022:
            problem = f"cache directory {path} is writable by others"
        if problem is not None:
            _warn_once(problem)
            yield None
        else:
            yield fd
    finally:
        os.close(fd)


def atomic_write(path: Path | str, data: bytes, *, dir_fd: int | None = None) -> bool:
    """Write ``data`` to ``path`` through an exclusive temporary file and a rename; False on failure.

    With ``dir_fd``, ``path`` is a name inside that directory (see :func:`private_dir_fd`)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return True
    except OSError:  # a read-only cache only costs a redo next time
        return False


def read_file(path: Path | str, *, dir_fd: int | None = None) -> bytes | None:
    """The bytes of a regular file, not following a symlink at the last component; None otherwise."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read()
    finally:
        if fd >= 0:
            os.close(fd)


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _record_name(kind: str, key: dict) -> str:
    return f"{kind}-{hashlib.sha256(_canonical(key)).hexdigest()[:40]}.json"


def save_record(kind: str, key: dict, payload: dict, *, sub: str = "guard") -> bool:
    """Store ``payload`` under ``key`` (bound by digest); False when caching is off or failed."""
    body = {"format": RECORD_FORMAT, "kind": kind, "key": key, "payload": payload}
    body["sha256"] = hashlib.sha256(_canonical(body)).hexdigest()
    with private_dir_fd(sub) as dfd:
        if dfd is None:
            return False
        return atomic_write(_record_name(kind, key), _canonical(body), dir_fd=dfd)


def load_record(kind: str, key: dict, *, sub: str = "guard",
                validate: Callable[[dict], bool] | None = None) -> dict | None:
    """The payload stored under exactly ``key``, or None when absent, altered or invalid."""
    with private_dir_fd(sub, create=False) as dfd:
        if dfd is None:
            return None
        raw = read_file(_record_name(kind, key), dir_fd=dfd)
    if raw is None:
        return None
    try:
        body = json.loads(raw)
        digest = body.pop("sha256")
        ok = (isinstance(body, dict) and set(body) == {"format", "kind", "key", "payload"}
              and body["format"] == RECORD_FORMAT and body["kind"] == kind and body["key"] == key
              and isinstance(body["payload"], dict)
              and digest == hashlib.sha256(_canonical(body)).hexdigest())
        if ok and validate is not None:
            ok = bool(validate(body["payload"]))
    except Exception:  # noqa: BLE001 - anything malformed is simply not trusted
        ok = False
    if not ok:
        log.warning("discarding an invalid %s record in %s", kind, cache_root() / sub)
        return None
    return body["payload"]
