"""Placement: run a stateless text in the caller or on the pool, from measured rates.

A request can run in the caller's process (no transfer, one core, the caller's engine) or on the
pool (its characters travel, it waits for a slot, its ``k`` chunks run in parallel: ``k`` is the
planner's ``chunk_count``, at most the slots, which the caller passes in). The
model compares the two expected finish times and picks the smaller:

    local  = n / local_rate
    remote = overhead + k * per_chunk + n * transfer + queue_wait + n / (remote_rate * k)

``per_chunk`` is what each of the ``k`` chunk tasks costs the caller whatever its size (its launch,
its argument's seal and pin, its result's fetch: 2-3 ms measured here, bench/scaleout/measure.py), paid one
after the other on the caller's loop. ``local_rate`` (characters/ms) is learned from the caller's
own encodes, ``remote_rate`` and ``transfer`` from the pool's completed chunked requests (the pool's
measured end-to-end time minus its encode share), each as an EWMA so the model follows the machine
and its load. With a fast engine in the caller (hundreds of MB/s) nothing on one node beats the
caller; with the reference engine (about 1.5 MB/s per core) a 1M-character text goes to the pool's
parallel chunks. Pure Python, no clock of its own: callers pass measurements in, so tests drive it
directly.
"""
from __future__ import annotations

from dataclasses import dataclass

EWMA = 0.2


@dataclass
class PlacementModel:
    """Expected finish times of a stateless text in the caller and on the pool; learns online."""

    local_chars_per_ms: float = 1500.0  # the reference engine on one core, until measured
    remote_chars_per_ms: float = 1500.0  # per chunk running
    overhead_ms: float = 2.0  # a pool round trip with no work (dispatch, task, result)
    chunk_ms: float = 2.0  # the caller's CPU per chunk task, whatever its size (measured 2-3 ms)
    transfer_ms_per_char: float = 7e-6  # a 1M-character argument costs ~7 ms here
    weight: float = EWMA

    def local_ms(self, n_chars: int) -> float:
        return n_chars / max(self.local_chars_per_ms, 1e-9)

    def remote_ms(self, n_chars: int, chunks: int, queue_wait_ms: float = 0.0) -> float:
        """The pool's expected time for a text it runs as ``chunks`` chunks in parallel."""
        k = max(1, chunks)
        return (self.overhead_ms + k * self.chunk_ms + queue_wait_ms + n_chars * self.transfer_ms_per_char
                + n_chars / (max(self.remote_chars_per_ms, 1e-9) * k))

    def run_local(self, n_chars: int, chunks: int, queue_wait_ms: float = 0.0) -> bool:
        """True when the caller is expected to finish first (ties stay local: nothing moves)."""
        return self.local_ms(n_chars) <= self.remote_ms(n_chars, chunks, queue_wait_ms)

    def observe_local(self, n_chars: int, ms: float) -> None:
        """A local encode of ``n_chars`` took ``ms``."""
        if n_chars >= 1024 and ms > 0:
            self.local_chars_per_ms += self.weight * (n_chars / ms - self.local_chars_per_ms)

    def observe_remote(self, n_chars: int, chunks: int, ms: float) -> None:
        """A pool request of ``n_chars`` run as ``chunks`` chunks took ``ms`` end to end: what the
        encode share (at ``remote_chars_per_ms`` per chunk) and the chunks' fixed cost do not
        explain is overhead plus transfer."""
        if n_chars < 1024 or ms <= 0:
            return
        k = max(1, chunks)
        encode_ms = n_chars / (max(self.remote_chars_per_ms, 1e-9) * k)
        rest = max(ms - encode_ms - self.overhead_ms - k * self.chunk_ms, 0.0)
        self.transfer_ms_per_char += self.weight * (rest / n_chars - self.transfer_ms_per_char)
