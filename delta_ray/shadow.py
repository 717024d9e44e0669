"""Shadow verification: re-encode a sample of fast-tier results with the reference, off the path.

A sampled call's texts and answers are queued; one background thread re-encodes them with the
reference and compares. Any mismatch is logged with the text and switches the tokenizer back to
the reference tier for good (``EngineSwitch.back_to_reference``). Counters: ``comparisons``,
``mismatches`` (and an optional metrics hook).
"""
from __future__ import annotations

import logging
import queue
import random
import threading
from typing import Callable, Sequence

import numpy as np

log = logging.getLogger("delta_ray.shadow")


class ShadowVerifier:
    """Wraps the switchable encoder; samples fast-tier answers for background comparison."""

    def __init__(self, switch, rate: float, *, max_queue: int = 64,
                 on_result: Callable[[bool], None] | None = None, seed: int | None = None):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"shadow_rate must be within [0, 1], got {rate!r}")
        self.switch = switch
        self.rate = rate
        self.comparisons = 0
        self.mismatches = 0
        self.last_mismatch: str | None = None
        self._on_result = on_result
        self._rng = random.Random(seed)
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.switch.name

    def encode_pieces(self, texts: Sequence[str]) -> list[np.ndarray]:
        enc = self.switch.current
        out = enc.encode_pieces(texts)
        if self.rate and enc is not self.switch.reference and self._rng.random() < self.rate:
            try:
                self._queue.put_nowait((list(texts), out, enc))
                self._ensure_thread()
            except queue.Full:  # verification never slows the request path
                pass
        return out

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until every queued comparison is done (tests, shutdown)."""
        if self._thread is not None:
            self._queue.join()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="delta-ray-shadow", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        ref = self.switch.reference
        while True:
            texts, got, enc = self._queue.get()
            try:
                want = ref.encode_pieces(texts)
                for text, g, w in zip(texts, got, want):
                    self.comparisons += 1
                    same = np.array_equal(g, w)
                    if not same:
                        self.mismatches += 1
                        self.last_mismatch = text
                        log.error("fast tier (%s) disagrees with the reference on a %d-character text "
                                  "(first 200: %r); switching this tokenizer back to the reference",
                                  getattr(enc, "description", enc.name), len(text), text[:200])
                        self.switch.back_to_reference(f"shadow mismatch on a {len(text)}-character text")
                    if self._on_result is not None:
                        self._on_result(same)
            except Exception:  # noqa: BLE001
                log.warning("shadow verification failed", exc_info=True)
            finally:
                self._queue.task_done()
