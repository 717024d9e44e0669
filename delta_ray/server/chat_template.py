"""Chat rendering as Hugging Face does it: the tokenizer_config.json template through jinja2.

A sandboxed, immutable jinja2 environment with ``trim_blocks``/``lstrip_blocks``, the ``tojson``
filter, ``raise_exception`` and ``strftime_now``, and the config's special tokens as variables —
the conventions of ``transformers``' ``apply_chat_template``, so existing templates render the same.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .._core.errors import DeltaRayError


class ChatTemplateError(DeltaRayError, ValueError):
    """The messages cannot be rendered (no template, or the template refused them)."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


@lru_cache(maxsize=16)
def _compile(source: str):
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class ChatTemplate:
    """Renders chat messages to the text the model sees."""

    def __init__(self, template: str, special: dict[str, str | None] | None = None):
        self.template = template
        self.special = dict(special or {})

    @classmethod
    def from_config(cls, config: dict | str | Path | None) -> "ChatTemplate | None":
        """From a tokenizer_config.json (dict or path); None when it has no chat template."""
        if config is None:
            return None
        if not isinstance(config, dict):
            path = Path(config)
            if path.is_dir():
                path = path / "tokenizer_config.json"
            if not path.exists():
                return None
            config = json.loads(path.read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: use "default"
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        if not template:
            return None
        special = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        return cls(template, special)

    def render(self, messages: list[dict], *, add_generation_prompt: bool = False, tools: list | None = None,
               **kwargs: Any) -> str:
        """The rendered conversation; ChatTemplateError with the template's message on refusal."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ChatTemplateError("messages must be a list of objects")
        try:
            return _compile(self.template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                  tools=tools, **self.special, **kwargs)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template refused the messages: {exc}") from exc
