"""One error tree: every exception delta-ray raises on purpose derives from :class:`DeltaRayError`.

Each also keeps the builtin base a caller would expect (``SessionNotFound`` is a ``KeyError``, a
refused text a ``ValueError``), so ``except DeltaRayError`` catches delta-ray's own refusals and the
familiar ``except KeyError`` keeps working. Most classes live beside the code that raises them;
this module holds the base and the pool's errors (so that they import without Ray).
"""
from __future__ import annotations


class DeltaRayError(Exception):
    """Base of every exception delta-ray raises deliberately."""


class PoolStartupError(DeltaRayError, RuntimeError):
    """A pool's workers did not load within the start-up timeout."""


class PoolClosed(DeltaRayError, RuntimeError):
    """A call on a pool that was closed."""


class PoolAuthError(DeltaRayError, PermissionError):
    """Attaching to a named pool without its secret (or with a wrong one)."""
