"""The one map from a request's identity to the key its state is stored under, for every path.

A session store (in process, on a pool's worker, in a Serve replica) holds two kinds of state: a
caller's named session, and a keyless text kept for reuse by content. Each kind lives in its own
namespace inside its tenant's, and every key is made here, so no caller-chosen name can spell
another kind's key or another tenant's:

    session   "t-|s:" + name                  (no tenant)
              "t<len>:<tenant>|s:" + name     (the tenant length-prefixed, so no pair spells another)
    content   "t-|c:" + digest, "t<len>:<tenant>|c:" + digest
    keyless   a content key + "." + serial    (one conversation of several under one head)

The parts are read back unambiguously left to right (the tenant's length, then the kind), so the
map is injective. A content digest is keyed with a secret (:class:`ContentDigest`): nobody outside
the process or pool that holds the secret can compute the key of another caller's text. Error
messages name a key through :func:`describe`, which shows the caller's own name and never a tenant.
Ray-free.
"""
from __future__ import annotations

import hashlib
import hmac
import os

SESSION_TAG = "|s:"
CONTENT_TAG = "|c:"
CONTENT_HEAD_CHARS = 4096  # a content digest covers the text's first 4,096 UTF-8 bytes (hashing is bounded)
_DIGEST_BYTES = 16


def _ns(tenant: str | None) -> str:
    return "t-" if tenant is None else f"t{len(tenant)}:{tenant}"


def session_key(name: str, tenant: str | None = None) -> str:
    """The store key of the session ``name`` inside ``tenant`` (None: the shared namespace).

    Without a tenant the name is shared by every caller of the same store: anyone who knows or
    guesses it reads the same state, as with any named session."""
    return f"{_ns(tenant)}{SESSION_TAG}{name}"


def content_key(digest: str, tenant: str | None = None) -> str:
    """The store key of a keyless text kept for reuse by content, ``digest`` being its
    :class:`ContentDigest` (or an entry name the store's owner chose): never a session's key."""
    return f"{_ns(tenant)}{CONTENT_TAG}{digest}"


def keyless_key(head: str, serial: int) -> str:
    """The store key of one keyless conversation found under ``head`` (a :func:`content_key`):
    several conversations may share a head (a long system prompt), each with its own ``serial``."""
    return f"{head}.{serial}"


def keyless_head(key: str) -> str | None:
    """The head a :func:`keyless_key` was made under; None for every other key (a session's, a
    content key without a serial). A digest has no ``.``, so the last one ends the head."""
    if CONTENT_TAG not in key:  # the common case, a session's key, in one scan
        return None
    _tenant, tag, name = _split(key)
    if tag != CONTENT_TAG or "." not in name:
        return None
    return key.rpartition(".")[0]


def is_keyless_head(key: str) -> bool:
    """Whether ``key`` is a head keyless conversations are listed under: a content key without a serial."""
    return is_content_key(key) and keyless_head(key) is None


def is_content_key(key: str) -> bool:
    """Whether ``key`` (made by this module) names a content entry rather than a session."""
    return _split(key)[1] == CONTENT_TAG


def _split(key: str) -> tuple[str | None, str, str]:
    """(tenant, tag, name) of a key made here; ("", "", key) for anything else."""
    if key.startswith("t-|"):
        tenant, rest = None, key[2:]
    else:
        head, sep, _ = key.partition(":")
        if not (sep and head[:1] == "t" and head[1:].isdigit()):
            return "", "", key
        start = len(head) + 1
        end = start + int(head[1:])
        tenant, rest = key[start:end], key[end:]
    tag = rest[:3]
    if tag not in (SESSION_TAG, CONTENT_TAG):
        return "", "", key
    return tenant, tag, rest[3:]


def describe(key: str) -> str:
    """How a message names the state under ``key``: the session's own name (quoted) or "a keyless
    text", never its tenant (a ``cache_salt`` is a secret of its caller's)."""
    _tenant, tag, name = _split(key)
    if tag == CONTENT_TAG:
        return "a keyless text's state"
    return f"session {name!r}"


class ContentDigest:
    """A keyed digest of a text's head: the content part of a keyless text's key.

    Keyed with ``secret`` (random unless given: a pool derives it from its own secret so every
    authenticated caller of the pool finds the same worker state), so a digest cannot be computed
    outside. Two texts with the same head share a key; their stored states are compared in full
    before any ID is reused, so a shared key costs time, never exactness."""

    __slots__ = ("_key",)

    def __init__(self, secret: bytes | None = None):
        self._key = os.urandom(32) if secret is None else hashlib.blake2b(
            secret, digest_size=32, person=b"delta-ray-ckey").digest()

    @classmethod
    def derived(cls, secret: bytes, purpose: bytes) -> "ContentDigest":
        """A digest keyed by ``secret`` for one ``purpose`` (an HMAC: the secret itself never keys it)."""
        return cls(hmac.new(secret, purpose, hashlib.sha256).digest())

    def of(self, text: str) -> str:
        """The hex digest of ``text``'s first 4,096 UTF-8 bytes."""
        # Each character is at least one byte: the first 4,096 characters hold the first 4,096 bytes,
        # so a megabyte text is not encoded just to hash its start.
        head = text[:CONTENT_HEAD_CHARS].encode("utf-8", "surrogatepass")[:CONTENT_HEAD_CHARS]
        return hashlib.blake2b(head, digest_size=_DIGEST_BYTES, key=self._key).hexdigest()
