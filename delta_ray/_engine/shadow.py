"""Shadow verification: re-encode a sample of fast-tier results with the reference, off the path.

A sampled call's texts and answers are queued; one background thread re-encodes them with the
reference and compares. Any mismatch switches the tokenizer back to the reference tier for good
(``Engine.back_to_reference``), which persists the rejection and makes every owner discard
the states the engine produced. Log lines carry the text's length and digest, not the text, unless
``DELTA_RAY_LOG_TEXT=1`` (request text is user data). Counters: ``comparisons``, ``mismatches``;
``add_listener`` hooks metrics.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import queue
import random
import sys
import threading
from typing import Callable, Protocol, Sequence

import numpy as np

from .._core.encoder import ArraysByIndex, Encoder
from .._runtime.exit_guard import start_thread

log = logging.getLogger("delta_ray.engine.shadow")


def describe_text(text: str) -> str:
    """How a log line names a request text: length and digest, the text itself only on request."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    if os.environ.get("DELTA_RAY_LOG_TEXT") == "1":
        return f"a {len(text)}-character text {digest} (first 200: {text[:200]!r})"
    return f"a {len(text)}-character text {digest}"


class Checked(Protocol):
    """The fast tier whose answers are checked (:class:`~delta_ray._engine.engine.FastTier`)."""

    @property
    def description(self) -> str: ...


class VerifiedEngine(Protocol):
    """What the verifier reads of its engine (:class:`~delta_ray._engine.engine.Engine`)."""

    @property
    def reference(self) -> Encoder: ...

    def back_to_reference(self, reason: str) -> None: ...


# A sampled call: its texts, the fast tier's IDs of them, and the tier; None stops the thread.
_Sample = tuple[list[str], list[np.ndarray], Checked]


class ShadowVerifier:
    """Samples the fast tier's answers for comparison with the reference in a background thread
    (the engine calls :meth:`check_later` after each fast call it makes)."""

    def __init__(self, engine: VerifiedEngine, rate: float, *, max_queue: int = 64, max_chars: int = 1 << 16,
                 on_result: Callable[[bool], None] | None = None, seed: int | None = None):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"shadow_rate must be within [0, 1], got {rate!r}")
        self.engine = engine
        self._rng = random.Random(seed)
        self.rate = rate  # (a property: also draws the first gap)
        self.max_chars = max_chars  # a sampled call re-checks at most this many characters
        self.comparisons = 0
        self.mismatches = 0
        self.last_mismatch: str | None = None
        self._listeners: list[Callable[[bool], None]] = [on_result] if on_result is not None else []
        self._queue: queue.Queue[_Sample | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._stopping = False  # set at exit (exit_guard): the thread finishes its comparison and ends

    @property
    def rate(self) -> float:
        """The share of fast-tier calls re-checked."""
        return self._rate

    @rate.setter
    def rate(self, rate: float) -> None:
        self._rate = rate
        self._gap = self._draw_gap()

    def _draw_gap(self) -> int:
        """How many eligible calls to pass before the next sampled one: geometric with success
        probability ``rate``, so each call is still sampled with probability ``rate``, independently
        (a Bernoulli process is a sequence of i.i.d. geometric gaps), while an unsampled call costs
        one integer decrement instead of a draw from the generator."""
        r = self._rate
        if r >= 1.0:
            return 0
        denom = math.log1p(-r) if r > 0.0 else 0.0
        if denom == 0.0:
            return sys.maxsize
        return int(math.log1p(-self._rng.random()) / denom)

    def sampled(self) -> bool:
        """The sampling step, once per call of the fast tier: whether this call's answers are
        re-checked. An unsampled call costs a countdown step (a lost decrement between two threads
        only shifts which call is sampled)."""
        if not self._rate:
            return False
        if self._gap:
            self._gap -= 1
            return False
        self._gap = self._draw_gap()
        return True

    def add_listener(self, fn: Callable[[bool], None]) -> None:
        """Call ``fn(same)`` after every comparison (metrics)."""
        self._listeners.append(fn)

    def _sample(self, n_texts: int, texts: Sequence[str]) -> list[int]:
        """Indices of the texts a sampled call re-checks: random ones within ``max_chars``, so a
        batch job's 8 MB call costs the verifier what a chat turn does."""
        order = list(range(n_texts))
        self._rng.shuffle(order)
        picked: list[int] = []
        budget = self.max_chars
        for i in order:
            if len(texts[i]) <= budget or not picked:
                picked.append(i)
                budget -= len(texts[i])
            if budget <= 0:
                break
        return sorted(picked)

    def _enqueue(self, texts: list[str], got: list[np.ndarray], enc: Checked) -> None:
        try:
            self._queue.put_nowait((texts, got, enc))
            self._ensure_thread()
        except queue.Full:  # verification never slows the request path
            pass

    def check_later(self, texts: Sequence[str], out: ArraysByIndex, enc: Checked) -> None:
        """Sample one call's answers (the fast tier ``enc``'s IDs of ``texts``) for comparison off
        the request path."""
        if self.sampled():
            idx = self._sample(len(texts), texts)
            self._enqueue([texts[i] for i in idx], [out[i] for i in idx], enc)

    def check_flat_later(self, texts: Sequence[str], values: np.ndarray, offsets: np.ndarray, enc: Checked) -> None:
        """:meth:`check_later` for a flat answer (split into per-text arrays only when sampled)."""
        if self.sampled():
            self.queue_flat(texts, values, offsets, enc)

    def queue_flat(self, texts: Sequence[str], values: np.ndarray, offsets: np.ndarray, enc: Checked) -> None:
        """Queue a call that :meth:`sampled` picked, its answer flat (``values`` cut at ``offsets``):
        for a caller that holds the engine's raw buffers and makes arrays of them only when sampled."""
        texts = list(texts)
        idx = self._sample(len(texts), texts)
        self._enqueue([texts[i] for i in idx], [values[offsets[i]:offsets[i + 1]] for i in idx], enc)

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until every queued comparison is done (tests, shutdown)."""
        if self._thread is not None:
            self._queue.join()

    def _ensure_thread(self) -> None:
        with self._thread_lock:
            if self._thread is None:
                # stopped and joined at exit before finalization: the reference's batch encode drops
                # the GIL, and a daemon thread inside it when the runtime finalizes aborts the process
                self._thread = start_thread(self._run, "delta-ray-shadow", stop=self._stop)

    def _stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)  # wakes a waiting get(); a full queue means no get() waits

    def _run(self) -> None:
        ref = self.engine.reference
        while not self._stopping:
            item = self._queue.get()
            if item is None or self._stopping:
                self._queue.task_done()
                return
            texts, got, enc = item
            try:
                want = ref.encode_pieces(texts)
                for text, g, w in zip(texts, got, want):
                    self.comparisons += 1
                    same = np.array_equal(g, w)
                    if not same:
                        self.mismatches += 1
                        self.last_mismatch = text
                        log.error("fast tier (%s) disagrees with the reference on %s; switching this "
                                  "tokenizer back to the reference and discarding its states",
                                  enc.description, describe_text(text))
                        self.engine.back_to_reference(f"shadow mismatch on a {len(text)}-character text")
                    for fn in self._listeners:
                        fn(same)
            except Exception:  # noqa: BLE001
                log.warning("shadow verification failed", exc_info=True)
            finally:
                self._queue.task_done()
