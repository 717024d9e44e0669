"""Real text available on any machine: the Python standard library's sources and docstrings.

The demo and the benchmarks use it when no corpus is given (benchmarks prefer ../shared/corpus
when it exists), so the main job needs nothing but the installed packages.
"""
from __future__ import annotations

import gzip
import inspect
import os
import sysconfig
from functools import lru_cache
from pathlib import Path

_SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus"


@lru_cache(maxsize=None)
def stdlib_code(max_chars: int = 4_000_000) -> str:
    """Concatenated sources of standard-library modules, in a stable order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for path in sorted(root.glob("*.py")):
        try:
            src = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out.append(src)
        total += len(src)
        if total >= max_chars:
            break
    return "\n\n".join(out)[:max_chars]


@lru_cache(maxsize=None)
def stdlib_prose(max_chars: int = 2_000_000) -> str:
    """Docstrings of standard-library modules: English prose."""
    import re
    docs = re.findall(r'"""(.*?)"""', stdlib_code(), flags=re.S)
    text = "\n\n".join(inspect.cleandoc(d) for d in docs if len(d) > 60)
    return text[:max_chars]


def corpus(kind: str, n_chars: int) -> str:
    """``english``/``code``/``multilingual`` text of n_chars: ../shared/corpus if present, else stdlib."""
    path = Path(os.environ.get("DELTA_RAY_CORPUS", _SHARED)) / f"{kind}.txt.gz"
    if path.exists():
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            text = fh.read(n_chars)
    elif kind == "code":
        text = stdlib_code()
    elif kind == "english":
        text = stdlib_prose()
    else:
        data = Path(__file__).resolve().parent.parent / "tests" / "data" / "multilingual.txt"
        text = data.read_text(encoding="utf-8") if data.exists() else stdlib_prose()
    if not text:
        raise RuntimeError(f"no {kind} text available")
    while len(text) < n_chars:
        text += "\n" + text
    return text[:n_chars]
