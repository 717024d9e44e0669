"""The checks every public entry point makes of its arguments, in delta-ray's words.

A wrong type fails here with a TypeError naming the argument, as the reference's own bindings
would refuse it, before anything is stored or routed: a string flag such as "false" is truthy, and
accepting it would add the BOS its caller meant to leave out.
"""
from __future__ import annotations

import numpy as np


def check_text(text: object, what: str = "text") -> str:
    """``text`` if it is a str; TypeError naming ``what`` otherwise (every public entry point checks)."""
    if not isinstance(text, str):
        raise TypeError(f"{what} must be str, not {type(text).__name__}")
    return text


def check_flag(value: object, what: str = "add_special_tokens") -> bool:
    """``value`` as a bool if it is one (numpy's included, as the reference accepts); TypeError
    naming ``what`` otherwise, as the reference raises (a string such as "false" is truthy, so
    accepting it would add the BOS the caller meant to leave out)."""
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"{what} must be bool, not {type(value).__name__}")


def check_tenant(tenant: object) -> str | None:
    """``tenant`` if it is None or a str; TypeError otherwise (a tenant namespaces keys: an int
    would fail deep inside, and a non-str is nobody's namespace)."""
    if tenant is not None and type(tenant) is not str:
        raise TypeError(f"tenant must be str or None, not {type(tenant).__name__}")
    return tenant
