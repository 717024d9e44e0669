"""Loading a tokenizer and fingerprinting its configuration.

The configuration's bytes are hashed (SHA-256) so that the same tokenizer can be recognized across
processes and shipped to Ray workers, which check the digest before they use it.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Union

from tokenizers import Tokenizer
from .errors import DeltaRayError
from .reference_api import check_encodes, tokenizer_from_str, tokenizer_to_str

TokenizerLike = Union[str, "os.PathLike[str]", Tokenizer, "LoadedTokenizer"]


class DigestMismatch(DeltaRayError, ValueError):
    """Configuration bytes do not match the SHA-256 they were sent with."""


@dataclass
class LoadedTokenizer:
    """A reference tokenizer with the exact configuration bytes it was built from."""

    tokenizer: Tokenizer
    config_bytes: bytes
    digest: str
    source: str
    config: dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def from_bytes(cls, data: bytes, expected_digest: str | None = None, source: str = "<bytes>") -> "LoadedTokenizer":
        """Build from tokenizer.json bytes, checking the SHA-256 when one is given."""
        digest = hashlib.sha256(data).hexdigest()
        if expected_digest is not None and digest != expected_digest:
            raise DigestMismatch(f"tokenizer configuration SHA-256 {digest} != expected {expected_digest}")
        text = data.decode("utf-8")
        return cls(check_encodes(tokenizer_from_str(text)), data, digest, source, json.loads(text))


def load_tokenizer(tokenizer: TokenizerLike) -> LoadedTokenizer:
    """Accept a path to tokenizer.json, a directory holding one, a ``tokenizers.Tokenizer`` or a loaded one."""
    if isinstance(tokenizer, LoadedTokenizer):
        return tokenizer
    if isinstance(tokenizer, Tokenizer):
        data = tokenizer_to_str(tokenizer).encode("utf-8")
        loaded = LoadedTokenizer.from_bytes(data, source="<Tokenizer>")
        loaded.tokenizer = tokenizer  # keep the caller's object: it may carry runtime settings
        return loaded
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no tokenizer.json at {os.fspath(tokenizer)!r}")
        with open(path, "rb") as fh:
            data = fh.read()
        try:
            return LoadedTokenizer.from_bytes(data, source=path)
        except Exception as exc:
            raise ValueError(f"{path} is not a tokenizer.json the reference can load: {exc}") from exc
    raise TypeError(f"tokenizer must be a path, a directory or a tokenizers.Tokenizer, not {type(tokenizer).__name__}")
