"""Tunable numbers of the queue policy, in one place so the pool, the tests and the docs agree."""
from __future__ import annotations

from typing import Final

# --- service-time estimate: a + b_kind * N * (1 + NONASCII_WEIGHT * s) -----------------------------
FIXED_COST_MS: Final[float] = 0.2  # "a": per-task overhead (call, bookkeeping) independent of length
NONASCII_WEIGHT: Final[float] = 5.0  # non-ASCII text costs about (1 + 5) times ASCII per character
INITIAL_MS_PER_CHAR: Final[dict[str, float]] = {
    "stateless": 3e-5,
    "chunk": 3e-5,
    # Session tasks mostly reuse cached state and tokenize only the new tail, hence cheaper per char.
    "session": 1e-5,
}
EWMA_WEIGHT: Final[float] = 0.05  # weight of one observation when moving b toward measured values

# --- non-ASCII share sampling --------------------------------------------------------------------
EXACT_SCAN_CHARS: Final[int] = 2048  # texts up to this length are counted exactly
SAMPLE_WINDOWS: Final[int] = 4  # longer texts: this many windows spread over the text...
SAMPLE_WINDOW_CHARS: Final[int] = 512  # ...of this many characters each (same 2,048 chars of work)

# --- dispatch ------------------------------------------------------------------------------------
TASK_KINDS: Final[tuple[str, ...]] = ("session", "stateless", "chunk")
SHARED_KINDS: Final[frozenset[str]] = frozenset({"stateless", "chunk"})  # kinds in the shared queue
DEFAULT_POLICY: Final[str] = "shortest_first"  # PoolConfig.policy defaults to the same (test_shipped_config)
DEFAULT_MAX_INFLIGHT_PER_WORKER: Final[int] = 1  # one encode at a time per actor: no oversubscription
