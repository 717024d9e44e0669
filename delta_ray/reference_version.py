"""Which ``tokenizers`` (the reference) is installed, and whether this delta-ray supports it.

delta-ray derives its class tables, NFC anchors and case-fold sets through the 0.x Python API
(``Regex``, ``normalizers``, ``pre_tokenizers``). ``tokenizers`` 1.x drops those, so until delta-ray
derives them through what 1.x exposes, it refuses 1.x at import with a message that says what to
do, instead of failing deep inside with ``cannot import name 'Regex'``.
"""
from __future__ import annotations

import importlib.metadata
from .errors import DeltaRayError

SUPPORTED = ">=0.20,<1"


class UnsupportedReference(DeltaRayError, ImportError):
    """The installed ``tokenizers`` is a version this delta-ray cannot use as its reference."""


def reference_version() -> str:
    try:
        return importlib.metadata.version("tokenizers")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a broken environment
        import tokenizers
        return getattr(tokenizers, "__version__", "0")


def check_reference(version: str | None = None) -> str:
    """Raise :class:`UnsupportedReference` unless ``version`` (default: installed) is supported."""
    version = version or reference_version()
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = 0
    if major >= 1:
        raise UnsupportedReference(
            f"delta-ray {_own_version()} supports tokenizers{SUPPORTED} as its reference, but "
            f"tokenizers {version} is installed (1.x drops Regex, normalizers and pre_tokenizers, "
            "which delta-ray's exactness tables are derived with). Install a supported one: "
            "pip install 'tokenizers>=0.20,<1'")
    return version


def _own_version() -> str:
    try:
        return importlib.metadata.version("delta-ray")
    except importlib.metadata.PackageNotFoundError:
        return "(source)"
