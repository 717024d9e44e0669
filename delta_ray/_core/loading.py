"""Loading a tokenizer and fingerprinting its configuration.

The configuration's bytes are hashed (SHA-256) so that the same tokenizer can be recognized across
processes and shipped to Ray workers, which check the digest before they use it.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any, Union

from tokenizers import Tokenizer

from .errors import DeltaRayError
from .reference_api import check_encodes, tokenizer_from_str, tokenizer_to_str

TokenizerLike = Union[str, "os.PathLike[str]", Tokenizer, "LoadedTokenizer"]


def padding_is_neutral(padding: Any) -> bool:
    """Whether a ``padding`` setting leaves every one-text ``encode`` unchanged: padding to the
    batch's longest, with no multiple to round up to (a text alone is its batch's longest)."""
    if not isinstance(padding, dict) or padding.get("pad_to_multiple_of") not in (None, 0, 1):
        return False
    if "strategy" in padding:  # tokenizer.json's form
        strategy: object = padding["strategy"]
        return strategy == "BatchLongest"
    return "length" in padding and padding["length"] is None  # ``Tokenizer.padding``'s form


def _build(data: bytes) -> Tokenizer:
    """The reference from tokenizer.json bytes. A neutral padding is dropped: one text encodes the same
    without it, and delta-ray's batches of pieces (and of texts, each answered as its own ``encode``)
    must not be padded to their longest member."""
    text = data.decode("utf-8")
    if b'"padding"' in data:
        cfg = json.loads(text)
        if padding_is_neutral(cfg.get("padding")):
            cfg["padding"] = None
            text = json.dumps(cfg, ensure_ascii=False)
    return check_encodes(tokenizer_from_str(text))


class DigestMismatch(DeltaRayError, ValueError):
    """Configuration bytes do not match the SHA-256 they were sent with."""


class LoadedTokenizer:
    """A reference tokenizer with the exact configuration bytes it was built from.

    ``tokenizer`` (the reference ``tokenizers.Tokenizer``) may be built lazily, on first use: a Ray
    Data worker whose fast engine is admitted (cached) never needs the reference unless a guarded
    text, a fallback or the shadow check asks for it, and building it costs about a CPU-second per
    process (:meth:`from_bytes` with ``lazy=True``). The bytes are fixed (their SHA-256 checked
    first), so a lazy build gives the same reference an eager one does.
    """

    def __init__(self, tokenizer: Tokenizer | None, config_bytes: bytes, digest: str, source: str):
        self._tokenizer = tokenizer
        self.config_bytes = config_bytes
        self.digest = digest
        self.source = source
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # picklable like the dataclass it was (the lock stays behind)
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LoadedTokenizer(source={self.source!r}, digest={self.digest[:16]!r}, built={self.built})"

    @property
    def built(self) -> bool:
        """Whether the reference ``Tokenizer`` exists yet (False until a lazy one is first used)."""
        return self._tokenizer is not None

    @property
    def tokenizer(self) -> Tokenizer:
        """The reference; built from the bytes on first use (once, under a lock)."""
        tok = self._tokenizer
        if tok is None:
            with self._lock:
                if self._tokenizer is None:
                    self._tokenizer = _build(self.config_bytes)
                tok = self._tokenizer
        return tok

    @tokenizer.setter
    def tokenizer(self, tok: Tokenizer) -> None:
        self._tokenizer = tok

    @property
    def config(self) -> dict[str, Any]:
        """The parsed tokenizer.json, parsed anew at each use and never kept: its BPE merges are
        about 150K two-item lists, and every full garbage collection of a process that kept them
        would trace them all with the GIL held, stalling a pool driver's calls. Admission and a
        Serve replica's set-up read it once each."""
        config: dict[str, Any] = json.loads(self.config_bytes)
        return config

    @classmethod
    def from_bytes(cls, data: bytes, expected_digest: str | None = None, source: str = "<bytes>", *,
                   lazy: bool = False) -> "LoadedTokenizer":
        """Build from tokenizer.json bytes, checking the SHA-256 when one is given; ``lazy``: build
        the reference (and parse the JSON) only when first used."""
        digest = hashlib.sha256(data).hexdigest()
        if expected_digest is not None and digest != expected_digest:
            raise DigestMismatch(f"tokenizer configuration SHA-256 {digest} != expected {expected_digest}")
        if lazy:
            return cls(None, bytes(data), digest, source)
        return cls(_build(data), data, digest, source)


def load_tokenizer(tokenizer: TokenizerLike, *, lazy: bool = False) -> LoadedTokenizer:
    """Accept a path to tokenizer.json, a directory holding one, a ``tokenizers.Tokenizer`` or a loaded one.

    ``lazy`` (paths only): read the bytes now, build the reference on first use; the reference's
    refusal of the file then surfaces there, not here."""
    if isinstance(tokenizer, LoadedTokenizer):
        return tokenizer
    if isinstance(tokenizer, Tokenizer):
        data = tokenizer_to_str(tokenizer).encode("utf-8")
        loaded = LoadedTokenizer.from_bytes(data, source="<Tokenizer>")
        if not padding_is_neutral(tokenizer.padding):
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
        if lazy:
            return LoadedTokenizer.from_bytes(data, source=path, lazy=True)
        try:
            return LoadedTokenizer.from_bytes(data, source=path)
        except Exception as exc:
            raise ValueError(f"{path} is not a tokenizer.json the reference can load: {exc}") from exc
    raise TypeError(f"tokenizer must be a path, a directory or a tokenizers.Tokenizer, not {type(tokenizer).__name__}")
