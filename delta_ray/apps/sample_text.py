"""Real text available on any machine: the Python standard library's sources and docstrings.

The demo and the benchmarks use it when no corpus is given (benchmarks prefer ../shared/corpus
when it exists), so the main job needs nothing but the installed packages.
"""
from __future__ import annotations

import gzip
import inspect
import os
import random
import re
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


def chat_transcript(context_chars: int, turns: int, message_chars: int = 1300,
                    seed: int = 0) -> tuple[str, list[str]]:
    """A ChatML conversation of about ``context_chars`` characters and the ``turns`` messages that
    follow it, one message (about ``message_chars``) per turn, alternating user and assistant.

    Messages are prose and code from :func:`corpus`; the role markers are the Qwen/ChatML added
    tokens (plain text for a tokenizer without them). Every turn's text extends the previous one,
    as a transcript re-sent by an agent does.
    """
    rng = random.Random(seed)
    prose, code = corpus("english", 3_000_000), corpus("code", 3_000_000)

    def message(i: int) -> str:
        role = "user" if i % 2 == 0 else "assistant"
        src = prose if i % 3 else code
        k = max(200, int(message_chars * rng.uniform(0.6, 1.4)))
        at = rng.randrange(0, len(src) - k)
        return f"<|im_start|>{role}\n{src[at:at + k]}<|im_end|>\n"

    parts = ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"]
    n, i = len(parts[0]), 0
    while n < context_chars:
        parts.append(message(i))
        n += len(parts[-1])
        i += 1
    deltas = [message(i + j) for j in range(turns)]
    return "".join(parts), deltas


def doc_source(multilingual_chars: int = 4_000_000):
    """``docs(total)``: about ``total`` characters of documents of 200-8,000 characters drawn from
    prose, code and multilingual text, one seeded random stream across calls; ``docs.src`` is the
    joined corpora (the demo's and the batch benchmarks' corpus)."""
    src = corpus("english", 4_000_000) + corpus("code", 4_000_000) + corpus("multilingual", multilingual_chars)
    rng = random.Random(0)

    def docs(total: int) -> list[str]:
        out, n = [], 0
        while n < total:
            k = rng.randint(200, 8000)
            s = rng.randrange(0, len(src) - k)
            out.append(src[s:s + k])
            n += k
        return out
    docs.src = src
    return docs
