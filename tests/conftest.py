"""Shared fixtures: the six test tokenizers (SHA-256 checked) and real text that ships with Python."""
from __future__ import annotations

import inspect
import json
import os
import pathlib
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

from delta_ray.apps.bundled import TEST_TOKENIZERS, bundled_tokenizer_path

DATA = pathlib.Path(__file__).parent / "data"
TOOLS = pathlib.Path(__file__).parent / "tools"  # helper modules and check scripts (pyproject: pythonpath)


os.environ.setdefault("DELTA_RAY_FAST_BACKGROUND", "0")  # no background probes in tests


@pytest.fixture
def run_own_process():
    """Run a check script of tests/tools/ in a fresh process (one that starts its own Ray, never joining
    this session's); fail with its output's tail unless it exits 0. Returns its stdout."""
    def run(script: str, *args: str, timeout: int = 600) -> str:
        env = dict(os.environ, RAY_ENABLE_AUTO_CONNECT="0")
        env.pop("RAY_ADDRESS", None)
        proc = subprocess.run([sys.executable, str(TOOLS / script), *args],
                              capture_output=True, text=True, timeout=timeout, env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout
    return run


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A fresh admission cache for one test (verdicts, probes, locks), its warnings not yet given."""
    from delta_ray._runtime import cache_store
    monkeypatch.setenv("DELTA_RAY_CACHE", str(tmp_path / "cache"))
    cache_store._WARNED.clear()
    return tmp_path / "cache"


def pytest_collection_modifyitems(config, items):
    """The slow tier runs with -m slow or DELTA_RAY_SLOW=1; CI runs the default tier."""
    if os.environ.get("DELTA_RAY_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow tier: run with -m slow or DELTA_RAY_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _refused_by_reference() -> dict[str, str]:
    """Test tokenizers the installed reference refuses to load, with its reason (tokenizers 1.x
    refuses qwen-3.5's Split pattern: it needs a system-regex backend). Under 0.x: none, and a load
    failure is an error of the test, not a skip."""
    from delta_ray._core.reference_version import reference_major
    if reference_major() < 1:
        return {}
    out = {}
    for n in TEST_TOKENIZERS:
        try:  # 1.x loads qwen-3.5 and refuses at the first encode
            Tokenizer.from_file(bundled_tokenizer_path(n)).encode("a")
        except Exception as exc:  # noqa: BLE001 - recorded and asserted in test_reference_1x
            out[n] = str(exc)
    return out


REFUSED = _refused_by_reference()
LOADABLE = tuple(n for n in TEST_TOKENIZERS if n not in REFUSED)


@pytest.fixture(scope="session")
def tokenizer_paths() -> dict[str, str]:
    """name -> path of each bundled tokenizer.json the installed reference loads, checked by SHA-256."""
    return {name: bundled_tokenizer_path(name) for name in LOADABLE}


@pytest.fixture(scope="session")
def references(tokenizer_paths) -> dict[str, Tokenizer]:
    """The reference tokenizers, loaded exactly as the contract states."""
    import exactness
    out = {name: Tokenizer.from_file(p) for name, p in tokenizer_paths.items()}
    for name, tok in out.items():  # tokenizers 1.x cannot list added tokens: the tests read tokenizer.json
        exactness.CONFIGS[id(tok)] = json.loads(pathlib.Path(tokenizer_paths[name]).read_text(encoding="utf-8"))
    return out


@pytest.fixture(scope="session", params=TEST_TOKENIZERS)
def name(request) -> str:
    if request.param in REFUSED:
        pytest.skip(f"the installed tokenizers refuses {request.param}: {REFUSED[request.param]}")
    return request.param


def _python_code() -> str:
    import argparse  # noqa: E401 - stable stdlib sources
    import collections
    import json
    import textwrap
    return "\n\n".join(inspect.getsource(m) for m in (json, textwrap, argparse, collections))


def _english() -> str:
    import argparse  # noqa: E401
    import collections
    import json
    import textwrap
    docs = []
    for mod in (json, textwrap, argparse, collections, inspect, pathlib):
        for obj in vars(mod).values():
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and len(doc) > 80:
                docs.append(inspect.cleandoc(doc))
    return "\n\n".join(docs)


@pytest.fixture(scope="session")
def real_texts() -> dict[str, str]:
    """English prose (stdlib docstrings), code (stdlib sources) and multilingual UI messages."""
    return {
        "english": _english(),
        "code": _python_code(),
        "multilingual": (DATA / "multilingual.txt").read_text(encoding="utf-8"),
    }


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the whole test session (ray.init costs seconds); shut down after."""
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    import ray

    started = False
    if not ray.is_initialized():
        # address="local": always a fresh local instance, never another process's cluster.
        from delta_ray.actors.local_ray import local_init_kwargs

        ray.init(address="local", **local_init_kwargs(num_cpus=4, env={"DELTA_RAY_FAST_BACKGROUND": "0"}))
        started = True
    yield ray
    if started:
        ray.shutdown()
