"""The SGLang tier (opt-in): build .venv-sglang and run tests/apps/test_dropin_sglang.py in it.

    python3 tests/tools/sglang_tier.py [pytest args...]

SGLang's server needs its CUDA kernels (sgl-kernel, flashinfer) and a GPU, so it cannot start on
these machines; what delta-ray hooks can still be imported and exercised: its tokenizer manager,
OpenAI chat layer, request objects, dynamic batch tokenizer and plugin hook registry. The tier
builds .venv-sglang on top of the vLLM tier's environment (``vllm_tier.py``: torch, transformers,
the serving packages; a ``.pth`` file puts its site-packages on the path), installs
``sglang==0.5.23 --no-deps``, the torch and torchvision its modules import (about 5.5 GB) and the few
packages they import beyond those, and runs the SGLang
tests there (the default tier runs the same hooks over stand-ins). A failed install prints why and
exits 0 with "skipped".
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_tier  # noqa: E402

ROOT = vllm_tier.ROOT
VENV = Path(os.environ.get("DELTA_RAY_SGLANG_VENV", ROOT / ".venv-sglang"))
SGLANG = "sglang==0.5.23"
# What SGLang's modules import beyond the vLLM environment. Its configs import torchvision, which
# needs a torch of its own build: 2.14.1 with 0.29.1 (both lie on disk where this project's machines
# keep wheels; elsewhere a download of a few GB), installed here over the vLLM tier's CPU torch.
TORCH = os.environ.get("DELTA_RAY_SGLANG_TORCH", "torch==2.14.1 torchvision==0.29.1").split()
EXTRA = ["ipython", "gguf", "dill", "compressed-tensors"]


def ensure_env() -> Path:
    base = vllm_tier.ensure_env()  # also refreshes this checkout's install (its entry points) there
    py = VENV / "bin" / "python"
    marker = VENV / ".delta-ray-sglang-ready"
    wanted = "\n".join([SGLANG, *TORCH, *EXTRA, str(base)]) + "\n"
    if marker.exists() and marker.read_text() == wanted:
        return py
    if not py.exists():
        vllm_tier._run([sys.executable, "-m", "venv", str(VENV)])
    base_site = subprocess.run([str(base), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    own_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    Path(own_site, "delta_ray_vllm_tier.pth").write_text(base_site + "\n")
    pip = [str(py), "-m", "pip", "install", "-q"]
    vllm_tier._run(pip + ["--no-deps", SGLANG])
    vllm_tier._run(pip + TORCH)
    vllm_tier._run(pip + EXTRA)
    marker.write_text(wanted)
    return py


def main(argv: list[str]) -> int:
    try:
        py = ensure_env()
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"SGLang tier skipped: could not build {VENV} ({exc})")
        return 0
    env = dict(os.environ, DELTA_RAY_FAST_BACKGROUND="0", VLLM_TARGET_DEVICE="cpu")
    return subprocess.run([str(py), "-m", "pytest", str(ROOT / "tests" / "apps" / "test_dropin_sglang.py"), "-q",
                           *argv], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
