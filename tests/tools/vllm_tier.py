"""The vLLM tier (opt-in): build a venv per vLLM release and run tests/apps/test_dropin_vllm.py in it.

    python3 tests/tools/vllm_tier.py [--vllm 0.33|0.34|all] [pytest args...]

``--vllm`` picks the release (default 0.33; ``all`` runs each in turn): vLLM 0.33.0 in .venv-vllm
(``DELTA_RAY_VLLM_VENV`` moves it), 0.34.0 in .venv-vllm-0.34 (that path with ``-0.34`` appended).
vLLM pins a CUDA torch and GPU kernels among its requirements, none of which its tokenizer and
renderer need, so the tier installs ``vllm --no-deps``, a torch (``torch==2.13.0`` by default, a CPU
wheel where this project's machines keep one, from PyPI elsewhere; set ``DELTA_RAY_VLLM_TORCH`` to
another requirement; both releases pin 2.14.0, which their tokenizer, renderer and serving layer do
not need), each release's transformers pin, and the packages vLLM imports on the tokenizer/renderer
path and in its OpenAI chat serving layer (built on the CPU with a stub engine client:
``VLLM_TARGET_DEVICE=cpu``, set here, lets vLLM build its config without a GPU; vLLM's compiled
kernels are never loaded), then delta-ray from this checkout with its ``test`` and ``fast`` extras
(its ``vllm.general_plugins`` entry point is what registers ``tokenizer_mode="delta_ray"``; fastokens
is a peer of ``bench/bench_frontend.py``).
A failed install prints why and exits 0 with "skipped": the default tier never depends on it.
About 2-4 GB and a few minutes per release on the first run; later runs reuse the environment (and
install what this file's lists gained since).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("DELTA_RAY_VLLM_VENV", ROOT / ".venv-vllm"))  # the default release's
DEFAULT = "0.33"
# release -> its own requirements: vLLM itself (installed --no-deps) and the pins of its METADATA that
# the shared list below leaves open (transformers: 0.33.0 declares <5.21 but runs on 5.23, the
# `test` extra's pin; 0.34.0 declares >=5.16.1,<5.23.0).
RELEASES = {
    "0.33": ["vllm==0.33.0", "transformers==5.23.*"],
    "0.34": ["vllm==0.34.0", "transformers>=5.16.1,<5.23.0", "mistral_common>=1.13.0", "filelock>=4.2.4"],
}
TORCH = os.environ.get("DELTA_RAY_VLLM_TORCH", "torch==2.13.0")
# vLLM's own pins of what its config and OpenAI serving layer import (structured outputs, on import).
SERVING = ["xgrammar==0.2.8", "llguidance"]
# What `import vllm` and its tokenizer/renderer modules import (vLLM 0.33.0 and 0.34.0), without the GPU stack.
PURE_PYTHON = [
    "safetensors>=0.8.0", "cbor2", "psutil", "pyzmq", "oss-harmony", "openai>=2.25.0",
    "pybase64", "cachetools", "blake3", "py-cpuinfo", "sentencepiece", "tiktoken", "msgspec", "cloudpickle",
    "pydantic>=2.12", "fastapi", "prometheus_client", "partial-json-parser", "einops", "pillow", "pyyaml",
    "requests", "tqdm", "watchfiles", "python-json-logger", "setproctitle", "ijson", "mistral_common",
    "jsonschema", "lark==1.2.2", "anthropic", "aiohttp", "filelock", "protobuf",
]


def venv(release: str = DEFAULT) -> Path:
    return VENV if release == DEFAULT else VENV.with_name(f"{VENV.name}-{release}")


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _wanted(release: str) -> str:
    """What the environment is built from: a change to these lists rebuilds what changed."""
    return "\n".join([*RELEASES[release], TORCH, *PURE_PYTHON, *SERVING, "extras: test,fast"]) + "\n"


def ensure_env(release: str = DEFAULT) -> Path:
    vllm, *pins = RELEASES[release]
    py = venv(release) / "bin" / "python"
    marker = venv(release) / ".delta-ray-vllm-ready"
    pip = [str(py), "-m", "pip", "install", "-q"]
    if marker.exists() and marker.read_text() == _wanted(release):
        _run(pip + ["--no-deps", "-e", str(ROOT)])  # this checkout's code
        return py
    if not py.exists():
        _run([sys.executable, "-m", "venv", str(venv(release))])
    _run(pip + ["-e", f"{ROOT}[test,fast]"])
    _run(pip + ["--no-deps", vllm])
    _run(pip + [TORCH])
    _run(pip + pins + PURE_PYTHON + SERVING)  # after the extras: the release's transformers pin wins
    marker.write_text(_wanted(release))
    return py


def run_tier(release: str, argv: list[str]) -> int:
    try:
        py = ensure_env(release)
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"vLLM {release} tier skipped: could not build {venv(release)} ({exc})")
        return 0
    env = dict(os.environ, DELTA_RAY_FAST_BACKGROUND="0", VLLM_TARGET_DEVICE="cpu")
    return subprocess.run([str(py), "-m", "pytest", str(ROOT / "tests" / "apps" / "test_dropin_vllm.py"), "-q", *argv],
                          cwd=ROOT, env=env).returncode


def main(argv: list[str]) -> int:
    release, rest = DEFAULT, list(argv)
    for i, arg in enumerate(rest):
        if arg == "--vllm" or arg.startswith("--vllm="):
            value = arg.partition("=")[2] if "=" in arg else (rest[i + 1] if i + 1 < len(rest) else "")
            del rest[i:i + (1 if "=" in arg else 2)]
            release = value
            break
    if release != "all" and release not in RELEASES:
        print(f"--vllm takes one of {', '.join(RELEASES)} or all, not {release!r}", file=sys.stderr)
        return 2
    codes = {r: run_tier(r, rest) for r in (RELEASES if release == "all" else [release])}
    if len(codes) > 1:
        print("vLLM tier:", ", ".join(f"{r}: {'passed' if c == 0 else f'exit {c}'}" for r, c in codes.items()))
    return next((c for c in codes.values() if c), 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
