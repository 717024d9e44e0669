"""One error tree: every exception delta-ray raises on purpose derives from :class:`DeltaRayError`.

Each also keeps the builtin base a caller would expect (``SessionNotFound`` is a ``KeyError``, a
refused text a ``ValueError``), so ``except DeltaRayError`` catches delta-ray's own refusals and the
familiar ``except KeyError`` keeps working. The classes live beside the code that raises them;
this module holds the base.
"""
from __future__ import annotations


class DeltaRayError(Exception):
    """Base of every exception delta-ray raises deliberately."""
