"""The vLLM tier (opt-in): build .venv-vllm and run tests/apps/test_dropin_vllm.py in it.

    python3 tests/tools/vllm_tier.py [pytest args...]

vLLM pins a CUDA torch and GPU kernels among its requirements, none of which its tokenizer and
renderer need, so the tier installs ``vllm==0.33.0 --no-deps``, a torch (``torch==2.14.0`` from
PyPI by default, whose import loads its CUDA libraries but needs no GPU; set
``DELTA_RAY_VLLM_TORCH`` to another requirement, e.g. a CPU build from a mirror you use) and the
packages vLLM imports on the tokenizer/renderer path and in its OpenAI chat serving layer (built on
the CPU with a stub engine client: ``VLLM_TARGET_DEVICE=cpu``, set here, lets vLLM build its
config without a GPU; vLLM's compiled kernels are never loaded), then delta-ray from this checkout
with its ``test`` and ``fast`` extras (its ``vllm.general_plugins`` entry point is what registers
``tokenizer_mode="delta_ray"``; fastokens is a peer of ``bench/bench_frontend.py``).
The default torch is 2.13.0, which pip takes from a CPU wheel where this project's machines keep
one, and from PyPI elsewhere; vLLM 0.33.0 pins 2.14.0, which its tokenizer, renderer and serving
layer do not need.
A failed install prints why and exits 0 with "skipped": the default tier never depends on it.
About 2-4 GB and a few minutes on the first run; later runs reuse the environment (and install what
this file's lists gained since).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("DELTA_RAY_VLLM_VENV", ROOT / ".venv-vllm"))
VLLM = "vllm==0.33.0"
TORCH = os.environ.get("DELTA_RAY_VLLM_TORCH", "torch==2.13.0")
# vLLM's own pins of what its config and OpenAI serving layer import (structured outputs, on import).
SERVING = ["xgrammar==0.2.8", "llguidance"]
# What `import vllm` and its tokenizer/renderer modules import (vLLM 0.33.0), without the GPU stack.
PURE_PYTHON = [
    "transformers==5.23.*", "safetensors>=0.8.0", "cbor2", "psutil", "pyzmq", "oss-harmony", "openai>=2.25.0",
    "pybase64", "cachetools", "blake3", "py-cpuinfo", "sentencepiece", "tiktoken", "msgspec", "cloudpickle",
    "pydantic>=2.12", "fastapi", "prometheus_client", "partial-json-parser", "einops", "pillow", "pyyaml",
    "requests", "tqdm", "watchfiles", "python-json-logger", "setproctitle", "ijson", "mistral_common",
    "jsonschema", "lark==1.2.2", "anthropic", "aiohttp", "filelock", "protobuf",
]


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _wanted() -> str:
    """What the environment is built from: a change to these lists rebuilds what changed."""
    return "\n".join([VLLM, TORCH, *PURE_PYTHON, *SERVING, "extras: test,fast"]) + "\n"


def ensure_env() -> Path:
    py = VENV / "bin" / "python"
    marker = VENV / ".delta-ray-vllm-ready"
    pip = [str(py), "-m", "pip", "install", "-q"]
    if marker.exists() and marker.read_text() == _wanted():
        _run(pip + ["--no-deps", "-e", str(ROOT)])  # this checkout's code
        return py
    if not py.exists():
        _run([sys.executable, "-m", "venv", str(VENV)])
    _run(pip + ["-e", f"{ROOT}[test,fast]"])
    _run(pip + ["--no-deps", VLLM])
    _run(pip + [TORCH])
    _run(pip + PURE_PYTHON + SERVING)
    marker.write_text(_wanted())
    return py


def main(argv: list[str]) -> int:
    try:
        py = ensure_env()
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"vLLM tier skipped: could not build {VENV} ({exc})")
        return 0
    env = dict(os.environ, DELTA_RAY_FAST_BACKGROUND="0", VLLM_TARGET_DEVICE="cpu")
    return subprocess.run([str(py), "-m", "pytest", str(ROOT / "tests" / "apps" / "test_dropin_vllm.py"), "-q", *argv],
                          cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
