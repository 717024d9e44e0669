"""The demo's peers for one tokenizer, loaded once and warm, and every result checked against the reference.

* the reference ``tokenizers`` (``Tokenizer.from_file(...).encode(text).ids``): the IDs every
  result is compared with;
* fastokens re-encoding the whole text (:class:`bench.peers.in_process.Fastokens`: IDs as a buffer,
  no Python list);
* fastokens with its segment cache: for chat, it reuses the text between added tokens seen in
  earlier requests.

When fastokens is not installed the demo says so and shows the reference alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from tokenizers import Tokenizer

from bench.peers.in_process import Fastokens, fastokens_version
from delta_ray._core.assembly import ids_to_numpy


@dataclass
class Checks:
    """Every result compared with the reference: how many, and which engines differed."""

    n: int = 0
    wrong: dict[str, int] = field(default_factory=dict)

    def same(self, engine: str, got, want: np.ndarray) -> bool:
        """Record and return whether ``got`` (Arrow array, ChunkedArray or numpy) equals ``want``."""
        self.n += 1
        ok = np.array_equal(as_numpy(got), want)
        if not ok:
            self.wrong[engine] = self.wrong.get(engine, 0) + 1
        return ok

    def count(self, engine: str) -> int:
        return self.wrong.get(engine, 0)


def as_numpy(ids) -> np.ndarray:
    """IDs from any of the forms the engines return, as an int32 numpy array."""
    if isinstance(ids, np.ndarray):
        return ids
    if hasattr(ids, "combine_chunks"):  # pyarrow.ChunkedArray
        ids = ids.combine_chunks()
    if hasattr(ids, "to_numpy"):
        return ids_to_numpy(ids)
    return np.asarray(ids, dtype=np.int32)


def chat_calls(tok: Any, text: str, delta: str, turn_key: str, extend_key: str, fast: "Fastokens | None",
               cached: "Fastokens | None") -> list[tuple[str, Callable[[], Any]]]:
    """One chat turn's calls, by engine: delta-ray's ``turn`` (the whole transcript, session
    ``turn_key``) and ``extend`` (the delta only, session ``extend_key``) on ``tok`` (a
    DeltaTokenizer or a pool: the same two methods), then fastokens re-encoding the whole
    transcript, without and with its segment cache, where they are available."""
    calls = [("turn", lambda: tok.encode(text, session=turn_key)), ("extend", lambda: tok.extend(extend_key, delta))]
    if fast is not None:
        calls.append(("fast", lambda: fast.ids(text)))
    if cached is not None:
        calls.append(("cached", lambda: cached.ids(text)))
    return calls


class Engines:
    """The reference and the fastokens baselines for one tokenizer, with the reference IDs of every
    text kept (the same texts are checked by several sections; the reference runs once per text)."""

    def __init__(self, path: str):
        self.path = path
        self.reference = Tokenizer.from_file(path)
        self.fastokens: Fastokens | None = None
        self.fastokens_note = ""
        try:
            self.fastokens = Fastokens(path)
            self.fastokens_note = f"fastokens {fastokens_version()}"
        except Exception as exc:  # noqa: BLE001 - not installed, or refuses this tokenizer
            self.fastokens_note = f"fastokens unavailable ({type(exc).__name__}: {exc}); reference only"
        self.checks = Checks()
        self._want: dict[str, np.ndarray] = {}
        self.ref_seconds: dict[str, float] = {}

    def segment_cached(self) -> Fastokens | None:
        """A fresh fastokens with its segment cache (each section warms its own)."""
        if self.fastokens is None:
            return None
        try:
            return Fastokens(self.path, segment_cache=True)
        except Exception:  # noqa: BLE001 - an older fastokens: no segment cache
            return None

    def check_all(self, results: list, prefix: str = "") -> dict[str, list[bool]]:
        """Compare ``(engine, text, ids)`` results with the reference; {engine: [equal?, ...]}."""
        from .report import progress
        good: dict[str, list[bool]] = {}
        with progress("checking every result against the reference", transient=True):
            for name, text, got in results:
                good.setdefault(name, []).append(self.checks.same(prefix + name, got, self.want(text)))
        return good

    def want(self, text: str) -> np.ndarray:
        """The reference IDs of ``text`` (encoded once, timed: ``ref_seconds[text]``)."""
        got = self._want.get(text)
        if got is None:
            import time
            t0 = time.perf_counter()
            enc = self.reference.encode(text)
            got = np.asarray(enc.ids, dtype=np.int32)
            self.ref_seconds[text] = time.perf_counter() - t0
            del enc  # drop the Encoding at once (NOTES: live Encodings slow later encodes)
            self._want[text] = got
        return got

