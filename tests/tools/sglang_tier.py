"""The SGLang tier (opt-in): build .venv-sglang and run tests/apps/test_dropin_sglang.py in it.

    python3 tests/tools/sglang_tier.py [pytest args...]

SGLang's server needs its CUDA kernels (sgl-kernel, flashinfer) and a GPU, so it cannot start on
these machines; what delta-ray hooks can still be imported and exercised: its tokenizer manager,
OpenAI chat layer, request objects, dynamic batch tokenizer and plugin hook registry. The tier tests
delta-ray under SGLang's own pins, the versions a user's SGLang server runs: SGLang 0.5.23's
METADATA pins ``transformers==5.19.0`` and ``tokenizers==0.23.2`` (and ``torch==2.14.1``). One
environment cannot hold both engines (vLLM 0.34 wants ``transformers>=5.16.1,<5.23`` with
``tokenizers>=0.23.3``; this project's ``test`` extra pins transformers 5.23), so .venv-sglang
(``DELTA_RAY_SGLANG_VENV`` moves it) is a venv of its own, independent of the vLLM tier's: this
checkout (editable, with its runtime dependencies and the ``test`` extra's pytest and bundled
tokenizers, not the extra's transformers), ``sglang==0.5.23 --no-deps`` (its requirements name the
GPU stack), and SGLang's pins of what its tokenizer manager, OpenAI layer and plugin registry import:
transformers, tokenizers, the torch and torchvision its configs import (about 5.5 GB) and the pure-
Python packages below, at SGLang's own versions where its METADATA pins one. fastokens and gigatoken
stay out: delta-ray works without them. The tests run there (the default tier runs the same hooks
over stand-ins). A failed install prints why and exits 0 with "skipped". The first build takes a few
minutes; later runs reuse the environment while this file's lists and pyproject.toml are unchanged.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_tier  # noqa: E402  (its _run; its environment is not used)

ROOT = vllm_tier.ROOT
VENV = Path(os.environ.get("DELTA_RAY_SGLANG_VENV", ROOT / ".venv-sglang"))
SGLANG = "sglang==0.5.23"
# SGLang 0.5.23's own pins (its METADATA's Requires-Dist) of the tokenizer stack delta-ray wraps.
PINS = ["transformers==5.19.0", "tokenizers==0.23.2"]
# SGLang pins torch 2.14.1; its configs import torchvision, which needs a torch of its own build:
# 0.29.1 with 2.14.1 (both lie on disk where this project's machines keep wheels; elsewhere a
# download of a few GB).
TORCH = os.environ.get("DELTA_RAY_SGLANG_TORCH", "torch==2.14.1 torchvision==0.29.1").split()
# What SGLang's tokenizer manager, OpenAI layer, request objects and plugin registry import (found by
# importing them: tests/apps/test_dropin_sglang.py), at SGLang's pins where its METADATA has one;
# python-dateutil is not imported there, but pinned so the environment keeps SGLang's bound.
IMPORTS = [
    "fastapi", "uvicorn>=0.51", "uvloop", "pyzmq>=25.1.2", "pybase64", "orjson", "pydantic", "aiohttp",
    "requests", "psutil", "msgspec", "pillow", "einops", "ipython", "gguf", "dill", "python-multipart",
    "partial_json_parser", "tiktoken", "openai==2.8.0", "sentencepiece==0.2.1", "compressed-tensors==0.18.0",
    "xgrammar==0.2.7", "apache-tvm-ffi==0.1.11", "python-dateutil<3",
]
# The `test` extra but for its transformers pin (SGLang's wins) and the linters and plots, unused here.
TEST_SKIP = ("transformers", "ruff", "mypy", "matplotlib")


def _test_extra() -> list[str]:
    import tomllib  # Python 3.11 or newer (the venv's Python is this one, and SGLang needs 3.11)
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = doc["project"]["optional-dependencies"]["test"]
    return [r for r in extra if re.split(r"[\[<>=!~; ]", r)[0] not in TEST_SKIP]


def _wanted() -> str:
    """What the environment is built from: a change to these lists, or to pyproject.toml (this
    checkout's dependencies and entry points), reinstalls."""
    pyproject = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    return "\n".join([SGLANG, *PINS, *TORCH, *IMPORTS, f"pyproject.toml {pyproject}", sys.version.split()[0]]) + "\n"


def ensure_env() -> Path:
    py = VENV / "bin" / "python"
    marker = VENV / ".delta-ray-sglang-ready"
    wanted = _wanted()
    if marker.exists() and marker.read_text() == wanted and py.exists():
        return py
    if not py.exists():
        vllm_tier._run([sys.executable, "-m", "venv", str(VENV)])
    marker.unlink(missing_ok=True)
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # One resolve: this checkout and its dependencies, the test extra, SGLang's pins and imports.
    vllm_tier._run(pip + ["-e", str(ROOT), *_test_extra(), *PINS, *TORCH, *IMPORTS])
    vllm_tier._run(pip + ["--no-deps", SGLANG])
    marker.write_text(wanted)
    return py


def main(argv: list[str]) -> int:
    try:
        py = ensure_env()
    except (subprocess.CalledProcessError, OSError, ImportError) as exc:
        print(f"SGLang tier skipped: could not build {VENV} ({exc})")
        return 0
    env = dict(os.environ, DELTA_RAY_FAST_BACKGROUND="0")
    return subprocess.run([str(py), "-m", "pytest", str(ROOT / "tests" / "apps" / "test_dropin_sglang.py"), "-q",
                           *argv], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
