"""Which ``tokenizers`` (the reference) is installed, and whether this delta-ray supports it.

delta-ray runs against tokenizers 0.x (0.20 onwards) and 1.x: every call it makes on the reference
goes through :mod:`delta_ray._core.reference_api`, which uses the 0.x API where it exists and otherwise
what 1.x exposes (``from_file``, ``encode``, ``encode_batch``, ``decode``); its class tables, NFC
anchors and fold sets are derived and checked through the reference itself under both
(docs/proof.md §10). A later major version is refused at import with a message that says what to
do, instead of failing deep inside.

The install pin in ``pyproject.toml`` stays ``<1`` until tokenizers 1.0 is final (README, "tokenizers
1.x" says how to try 1.x now).
"""
from __future__ import annotations

import importlib.metadata

from .errors import DeltaRayError

SUPPORTED = ">=0.20,<2"
INSTALL_PIN = ">=0.20,<1"  # what a fresh install gets (pyproject.toml)


class UnsupportedReference(DeltaRayError, ImportError):
    """The installed ``tokenizers`` is a version this delta-ray cannot use as its reference."""


def reference_version() -> str:
    try:
        return importlib.metadata.version("tokenizers")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a broken environment
        import tokenizers  # lazy: this module is read before the reference is imported (to refuse a version)
        return getattr(tokenizers, "__version__", "0")


def reference_major(version: str | None = None) -> int:
    try:
        return int((version or reference_version()).split(".")[0])
    except ValueError:
        return 0


def check_reference(version: str | None = None) -> str:
    """Raise :class:`UnsupportedReference` unless ``version`` (default: installed) is supported."""
    version = version or reference_version()
    major = reference_major(version)
    if major >= 2 or (major == 0 and _minor(version) < 20):
        raise UnsupportedReference(
            f"delta-ray {_own_version()} supports tokenizers{SUPPORTED} as its reference, but "
            f"tokenizers {version} is installed. Install a supported one: "
            f"pip install 'tokenizers{INSTALL_PIN}'")
    return version


def _minor(version: str) -> int:
    try:
        return int(version.split(".")[1])
    except (IndexError, ValueError):
        return 0


def _own_version() -> str:
    try:
        return importlib.metadata.version("delta-ray")
    except importlib.metadata.PackageNotFoundError:
        return "(source)"
