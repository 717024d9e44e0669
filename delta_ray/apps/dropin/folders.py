"""A folder ``AutoTokenizer.from_pretrained`` loads, for a bundled test tokenizer (tests, bench, demo).

The bundled packages ship tokenizer.json (checked by SHA-256) with the tokenizer_config.json and,
for some, the chat_template.jinja of the model beside it; transformers needs the three together.
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from ..bundled import BUNDLED, bundled_tokenizer_path

__all__ = ["bundled_hf_folder"]


def bundled_hf_folder(name: str, root: str | Path) -> str:
    """Write ``root/name`` holding the bundled tokenizer ``name`` as transformers expects it; returns it."""
    out = Path(root) / name
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(bundled_tokenizer_path(name), out / "tokenizer.json")
    package, rel, _ = BUNDLED[name]
    spec = importlib.util.find_spec(package)
    src = Path(list(spec.submodule_search_locations)[0]) / rel if spec and spec.submodule_search_locations else None
    for extra in ("tokenizer_config.json", "chat_template.jinja"):
        if src is not None and (src.parent / extra).exists():
            shutil.copy(src.parent / extra, out / extra)
    return str(out)
