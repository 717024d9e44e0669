"""The side channel's wire format: typed binary values, frames, and their authentication keys.

Never pickle: a body is a sequence of typed values (None, bool, signed or unsigned 64-bit
integers, UTF-8 text, little-endian int32 arrays), at most :data:`MAX_VALUES` of them, so decoding
can build nothing else and a frame cannot decode into much more than itself. A frame is a 9-byte
header (magic, kind, body length), the body, and a 32-byte HMAC-SHA256 tag under per-connection,
per-direction keys derived from the handshake (:class:`FrameKeys`). The handshake and the
connections are in :mod:`delta_ray.actors.worker_channel`; ``docs/threat-model.md`` has the threat model.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Any

import numpy as np

from delta_ray._core.errors import DeltaRayError
from delta_ray._core.session_store import SessionNotFound

try:  # OpenSSL's HMAC object itself, which hmac.new wraps: copy/update/digest are then C calls
    from _hashlib import hmac_new as _openssl_hmac
except ImportError:  # an interpreter without OpenSSL's hashlib
    _openssl_hmac = None

MAGIC = b"DRC2"
HEADER = struct.Struct("!4sBI")  # magic, kind, body length
_SEQ = struct.Struct("!Q")
_PIDS = struct.Struct("!QQ")  # server pid, client pid, in the transcript
KIND_REQUEST, KIND_TUPLE, KIND_VALUE, KIND_ERROR = 1, 2, 3, 4
T_NONE, T_FALSE, T_TRUE, T_INT, T_STR, T_I32, T_UINT = range(7)
_LEN = struct.Struct("!I")
_INT = struct.Struct("!q")
_UINT = struct.Struct("!Q")  # state versions are random 64-bit counters
_I32_MIN, _I32_MAX = -2 ** 31, 2 ** 31 - 1

MAX_FRAME = 512 * 1024 * 1024  # a 100M-character text or 128M IDs; larger goes through Ray
MAX_VALUES = 16  # values per frame: calls carry at most 5; bounds per-value overhead on decode

# Exceptions a worker may raise that the client re-raises as themselves.
KNOWN_ERRORS: dict[str, type[BaseException]] = {
    "SessionNotFound": SessionNotFound, "KeyError": KeyError, "ValueError": ValueError,
    "TypeError": TypeError, "RuntimeError": RuntimeError,
}


class RemoteError(DeltaRayError, RuntimeError):
    """A worker error of a type the channel does not map back (its type name is in the message)."""


class FrameError(DeltaRayError, ValueError):
    """A malformed or unauthenticated frame: the connection that sent it ends."""


# -- values ---------------------------------------------------------------------------------------
def _i32_array(v: np.ndarray) -> bytes:
    """Little-endian int32 bytes of an integer array; refuses (never wraps) values out of range."""
    if v.dtype.kind not in "iu":
        raise TypeError(f"the side channel carries integer ID arrays, not {v.dtype}")
    if v.dtype != np.int32 and v.size and (int(v.min()) < _I32_MIN or int(v.max()) > _I32_MAX):
        raise OverflowError(f"an ID array of {v.dtype} holds values outside int32")
    return np.ascontiguousarray(v, dtype="<i4").tobytes()


def encode_values(values: tuple) -> bytes:
    """Typed binary encoding of a tuple of None/bool/int/str/int32-array values.

    Raises TypeError for other types, OverflowError for an int outside [-2**63, 2**64) or an array
    value outside int32 (nothing is wrapped), ValueError for more than :data:`MAX_VALUES` values.
    """
    if len(values) > MAX_VALUES:
        raise ValueError(f"the side channel carries at most {MAX_VALUES} values per frame, not {len(values)}")
    out = bytearray()
    for v in values:
        if v is None:
            out.append(T_NONE)
        elif v is True or v is False:
            out.append(T_TRUE if v else T_FALSE)
        elif isinstance(v, (int, np.integer)):
            v = int(v)
            if not -2 ** 63 <= v < 2 ** 64:
                raise OverflowError(f"the side channel carries 64-bit integers; {v} is out of range")
            if v >= 0:
                out.append(T_UINT)
                out += _UINT.pack(v)
            else:
                out.append(T_INT)
                out += _INT.pack(v)
        elif isinstance(v, str):
            data = v.encode("utf-8", "surrogatepass")
            out.append(T_STR)
            out += _LEN.pack(len(data)) + data
        elif isinstance(v, np.ndarray):
            data = _i32_array(v)
            out.append(T_I32)
            out += _LEN.pack(len(data) // 4) + data
        else:
            raise TypeError(f"the side channel carries None, bool, int, str and int32 arrays, not {type(v).__name__}")
    return bytes(out)


def decode_values(body: bytes) -> tuple:
    """Inverse of :func:`encode_values`; raises :class:`FrameError` on anything malformed.

    Memory: at most :data:`MAX_VALUES` values; a string decodes to at most 4 bytes per UTF-8 byte
    and an int32 array is a view of ``body``, so a frame cannot decode into much more than itself.
    """
    out: list[Any] = []
    pos, n = 0, len(body)
    mv = memoryview(body)
    while pos < n:
        if len(out) >= MAX_VALUES:
            raise FrameError(f"more than {MAX_VALUES} values in a frame")
        t = body[pos]
        pos += 1
        if t == T_NONE:
            out.append(None)
        elif t in (T_FALSE, T_TRUE):
            out.append(t == T_TRUE)
        elif t in (T_INT, T_UINT):
            if pos + 8 > n:
                raise FrameError("truncated int")
            out.append((_INT if t == T_INT else _UINT).unpack_from(body, pos)[0])
            pos += 8
        elif t in (T_STR, T_I32):
            if pos + 4 > n:
                raise FrameError("truncated length")
            count = _LEN.unpack_from(body, pos)[0]
            pos += 4
            size = count * (4 if t == T_I32 else 1)
            if pos + size > n:
                raise FrameError("truncated value")
            if t == T_STR:
                try:
                    out.append(bytes(mv[pos:pos + size]).decode("utf-8", "surrogatepass"))
                except UnicodeDecodeError as exc:
                    raise FrameError(f"malformed text: {exc.reason}") from None
            else:
                out.append(np.frombuffer(body, dtype="<i4", count=count, offset=pos).astype(np.int32, copy=False))
            pos += size
        else:
            raise FrameError(f"unknown value type {t}")
    return tuple(out)


def frame(kind: int, body: bytes) -> bytes:
    """Header and body of a frame (its tag is added by the connection that sends it)."""
    return HEADER.pack(MAGIC, kind, len(body)) + body


def parse_header(header: bytes, max_frame: int) -> tuple[int, int]:
    """(kind, body size) of a frame header; FrameError on a bad magic or a size over ``max_frame``."""
    magic, kind, size = HEADER.unpack(header)
    if magic != MAGIC:
        raise FrameError("bad magic")
    if size > max_frame:
        raise FrameError(f"frame of {size} bytes over the {max_frame}-byte cap")
    return kind, size


def mac(secret: bytes, tag: bytes, transcript: bytes) -> bytes:
    """HMAC-SHA256 of a labelled transcript (the handshake's proofs and the key derivation)."""
    return hmac.new(secret, tag + transcript, hashlib.sha256).digest()


def transcript(hello: bytes, nonce_c: bytes, server_pid: int, client_pid: int) -> bytes:
    """What both proofs and the frame keys are bound to: the server's hello (nonce and idle
    timeout), the client's nonce, and both endpoints' pids as each kernel reports them."""
    return hello + nonce_c + _PIDS.pack(server_pid & (2 ** 64 - 1), client_pid & (2 ** 64 - 1))


class FrameKeys:
    """Per-connection, per-direction frame authentication with sequence numbers.

    Keys: HMAC-SHA256(secret, "keys" || transcript) as a pseudo-random key, expanded per direction
    (HKDF-style). A tag is HMAC-SHA256(direction key, seq || header || body); each side counts the
    frames it sent and received, so a replayed, reordered or dropped frame fails the next check.
    """

    def __init__(self, secret: bytes, transcript: bytes, *, server: bool):
        prk = mac(secret, b"delta-ray channel keys v2", transcript)
        c2s = hmac.new(prk, b"client to server\x01", hashlib.sha256).digest()
        s2c = hmac.new(prk, b"server to client\x01", hashlib.sha256).digest()
        send, recv = (s2c, c2s) if server else (c2s, s2c)
        self._send = keyed_sha256(send)  # keyed state, copied per frame
        self._recv = keyed_sha256(recv)
        self._sent = 0
        self._received = 0

    def seal(self, data: bytes) -> bytes:
        """The tag of the next frame this side sends (``data`` is its header and body)."""
        m = self._send.copy()
        m.update(_SEQ.pack(self._sent))
        m.update(data)
        self._sent += 1
        return m.digest()

    def check(self, header: bytes, body: bytes, tag: bytes) -> None:
        """Verify the next received frame's tag; FrameError ends the connection."""
        m = self._recv.copy()
        m.update(_SEQ.pack(self._received))
        m.update(header)
        m.update(body)
        if not hmac.compare_digest(m.digest(), tag):
            raise FrameError("a frame failed authentication (altered, replayed or not from the peer)")
        self._received += 1


def keyed_sha256(key: bytes):
    """An HMAC-SHA256 state keyed with ``key``, to ``copy()`` per message: the key's pads are
    hashed once per connection, not per frame. OpenSSL's own HMAC object where available (the same
    MAC as ``hmac.new``; its methods are C calls, not the Python wrapper's two layers), else
    ``hmac.new``'s."""
    if _openssl_hmac is not None:
        try:
            return _openssl_hmac(key, digestmod="sha256")
        except (ValueError, TypeError):  # e.g. a FIPS build refusing the call: the portable path
            pass
    return hmac.new(key, digestmod=hashlib.sha256)


def answer_frame(result: Any) -> bytes:
    """A worker's answer: a tuple of values, or one value."""
    if isinstance(result, tuple):
        return frame(KIND_TUPLE, encode_values(result))
    return frame(KIND_VALUE, encode_values((result,)))


def error_frame(exc: BaseException) -> bytes:
    """A worker's error: a known exception type by name, anything else as RemoteError."""
    name = type(exc).__name__ if type(exc).__name__ in KNOWN_ERRORS else "RemoteError"
    msg = str(exc) if name != "RemoteError" else f"{type(exc).__name__}: {exc}"
    return frame(KIND_ERROR, encode_values((name, msg[:4096])))


def raise_error(values: tuple) -> None:
    """Re-raise an error frame's exception on the client."""
    if len(values) != 2 or not all(isinstance(v, str) for v in values):
        raise FrameError("malformed error frame")
    name, msg = values
    cls = KNOWN_ERRORS.get(name, RemoteError)
    raise cls(msg)
