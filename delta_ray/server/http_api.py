"""Request validation for the vLLM/SGLang-compatible ``/tokenize`` and ``/detokenize`` endpoints.

Ray-free and framework-free so it can be unit-tested alone: each function takes the decoded JSON
body and returns a normalized request or raises :class:`BadRequest` with the HTTP status to send.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; the stdlib as a fallback
    orjson = None

from delta_ray._core.errors import DeltaRayError

TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                   "continue_final_message", "chat_template_kwargs", "tools", "return_token_strs",
                   "session_id", "cache_salt", "append", "session_version"}
DETOKENIZE_FIELDS = {"model", "tokens", "cache_salt"}
# Names a request carries (model, session_id, cache_salt, session_version) are hashed, compared and
# keyed on the event loop: bounded, so none costs more than a few microseconds there.
MAX_NAME_CHARS = 4096
NAME_FIELDS = ("model", "session_id", "cache_salt", "session_version")


class BadRequest(DeltaRayError, ValueError):
    """A client error: the status code and a message for the response body."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class TokenizeRequest:
    prompt: str | None
    messages: list | None
    add_special_tokens: bool | None  # None only for an append that leaves it to its session
    add_generation_prompt: bool
    chat_template_kwargs: dict
    tools: list | None
    return_token_strs: bool
    session: str | None
    tenant: str | None
    append: str | None = None
    session_version: str | None = None  # the state an append extends, as the last answer named it


def _typed(body: dict, key: str, types, default=None):
    if key not in body or body[key] is None:
        return default
    value = body[key]
    if not isinstance(value, types) or (types is int and isinstance(value, bool)):
        names = types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
        raise BadRequest(f"field {key!r} must be {names}, not {type(value).__name__}")
    return value


def _check_body(body: Any, fields: set[str], served: set[str]) -> None:
    """A JSON object with only known fields, its names within ``MAX_NAME_CHARS``, naming (if at
    all) a model served here."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = set(body) - fields
    if unknown:  # named, but not echoed at any length: the first few, each clipped
        names = ", ".join(_clip(n) for n in sorted(unknown)[:5])
        raise BadRequest(f"unknown field(s): {names}" + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""))
    for name in NAME_FIELDS:
        value = body.get(name)
        if isinstance(value, str) and len(value) > MAX_NAME_CHARS:
            raise BadRequest(f"field {name!r} is longer than {MAX_NAME_CHARS} characters")
    _check_model(body, served)


def _clip(name: str, n: int = 64) -> str:
    return repr(name) if len(name) <= n else repr(name[:n]) + "..."


def _check_model(body: dict, served: set[str]) -> None:
    model = _typed(body, "model", str)
    if model is not None and served and model not in served:
        raise BadRequest(f"model {_clip(model)} is not served here (serving: {', '.join(sorted(served))})", 404)


def parse_tokenize(body: Any, served: set[str]) -> TokenizeRequest:
    """Validate a /tokenize body: ``prompt`` or ``messages``, plus the optional vLLM fields."""
    _check_body(body, TOKENIZE_FIELDS, served)
    prompt = _typed(body, "prompt", str)
    messages = _typed(body, "messages", list)
    append = _typed(body, "append", str)
    if append is not None:
        if prompt is not None or messages is not None:
            raise BadRequest("'append' extends a session: give it without 'prompt' or 'messages'")
        if not body.get("session_id"):
            raise BadRequest("'append' needs the 'session_id' it extends")
        if not isinstance(body.get("session_version"), str) or not body["session_version"]:
            # Without it a replica holding another state of the session (a turn served elsewhere,
            # a retried append) would answer 200 with IDs that are not the reference's.
            raise BadRequest("'append' needs the 'session_version' of the last answer for this session "
                             "(the state it extends)")
    elif body.get("session_version") is not None:
        raise BadRequest("'session_version' goes with 'append' only")
    elif (prompt is None) == (messages is None):
        raise BadRequest("give exactly one of 'prompt' (a string) or 'messages' (a list)")
    if messages is not None:
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string 'role'")
    if _typed(body, "continue_final_message", bool, False):
        raise BadRequest("continue_final_message is not supported")
    session = _typed(body, "session_id", str)
    tenant = _typed(body, "cache_salt", str)
    if session is not None and not session:
        raise BadRequest("session_id must not be empty")
    if tenant is not None and (not tenant or tenant.isspace()):
        # A blank salt is never a tenant: every client whose salt came out blank (an unset variable)
        # would share one namespace, which --require-tenant exists to prevent. Refused, not read as
        # no tenant, so such a client learns it has none (vLLM refuses an empty cache_salt too).
        raise BadRequest("cache_salt must not be empty or only whitespace (omit it for no tenant)")
    return TokenizeRequest(
        prompt=prompt, messages=messages,
        # an append without the flag takes its session's (None); prompts default as vLLM's
        add_special_tokens=_typed(body, "add_special_tokens", bool, None if append is not None else messages is None),
        add_generation_prompt=_typed(body, "add_generation_prompt", bool, True),
        chat_template_kwargs=_typed(body, "chat_template_kwargs", dict, {}),
        tools=_typed(body, "tools", list),
        return_token_strs=_typed(body, "return_token_strs", bool, False),
        session=session, tenant=tenant, append=append, session_version=_typed(body, "session_version", str))


def detokenize_size(body: Any, max_tokens: int) -> int:
    """How many IDs a /detokenize body carries, refused with 413 past ``max_tokens`` (O(1), so it
    runs before the per-ID validation, which is moved off the event loop for large lists)."""
    tokens = body.get("tokens") if isinstance(body, dict) else None
    n = len(tokens) if isinstance(tokens, list) else 0
    if n > max_tokens:
        raise BadRequest(f"{n} token ids exceed the limit of {max_tokens} per request", 413)
    return n


def parse_detokenize(body: Any, served: set[str], vocab_size: int) -> list[int]:
    """Validate a /detokenize body: ``tokens``, a list of IDs inside the vocabulary."""
    _check_body(body, DETOKENIZE_FIELDS, served)
    tokens = body.get("tokens")
    # type() is int: JSON integers, never bool
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise BadRequest("field 'tokens' must be a list of integers")
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest(f"token id(s) out of range [0, {vocab_size}): {bad[:5]}")
    return tokens


def loads_json(raw: bytes) -> Any:
    """Parse a request body; malformed or too deeply nested JSON is a :class:`BadRequest` (400)."""
    if orjson is not None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            msg = str(exc)
            if "recursion" in msg.lower():
                raise BadRequest("malformed JSON: nested too deeply") from None
            raise BadRequest(f"malformed JSON: {msg[:200]}") from None
    try:  # pragma: no cover - without orjson
        return json.loads(raw)
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON: {str(exc)[:200]}") from None


def dumps_json(obj: dict) -> bytes:
    """A response body; numpy int32 IDs are written straight from their buffer (orjson)."""
    if orjson is not None:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    tokens = obj.get("tokens")  # pragma: no cover - without orjson
    if tokens is not None and hasattr(tokens, "tolist"):
        obj = {**obj, "tokens": tokens.tolist()}
    return json.dumps(obj).encode()
