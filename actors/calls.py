"""What a worker call means, declared once: the pool, the worker, the side channel and the failure
policy all read it from here instead of checking method names.

A :class:`CallKind` says whether the call may be re-run after a lost connection (an ``extend`` may
or may not have been applied, so it must not), whether the same-node side channel may carry it
(only values the channel's typed frames hold), and whether its answer is a session delta
``(version, k, tail)`` to splice onto the IDs the pool holds. Adding a worker method means adding
one kind here, its argument record, and the method on the worker.

Each kind's arguments are a typed record (a ``NamedTuple`` whose fields are the worker method's
parameters, in order): built by name at the call site, sent positionally by the transports.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional


class SessionArgs(NamedTuple):
    key: str
    text: str
    known_version: Optional[int]  # the state whose IDs the pool holds (None: it holds none)


class ExtendArgs(NamedTuple):
    key: str
    delta: str
    known_version: Optional[int]
    expect_version: Optional[int]  # refuse unless the worker's state is this one (a stale extend)


class InstallArgs(NamedTuple):
    key: str
    state: Any  # a SessionState the pool computed
    seal: bytes  # its MAC under the pool secret


class PiecesArgs(NamedTuple):
    pieces: list


class WholeArgs(NamedTuple):
    text: str
    add_special_tokens: bool


class DropArgs(NamedTuple):
    key: str


@dataclass(frozen=True)
class CallKind:
    method: str  # the TokenizerWorker method that serves it
    args: type  # its argument record
    idempotent: bool  # safe to re-run after a connection was lost mid-call
    channel: bool  # the side channel may carry it (None/bool/int/str/int32-array values only)
    session_delta: bool  # answers (version, k, tail): spliced onto the pool's mirror of the session


ENCODE_SESSION = CallKind("encode_session", SessionArgs, idempotent=True, channel=True, session_delta=True)
EXTEND = CallKind("extend", ExtendArgs, idempotent=False, channel=True, session_delta=True)
INSTALL = CallKind("install", InstallArgs, idempotent=True, channel=False, session_delta=False)
ENCODE_PIECES = CallKind("encode_pieces", PiecesArgs, idempotent=True, channel=False, session_delta=False)
ENCODE_WHOLE = CallKind("encode_whole", WholeArgs, idempotent=True, channel=True, session_delta=False)
DROP_SESSION = CallKind("drop_session", DropArgs, idempotent=True, channel=False, session_delta=False)

KINDS = {k.method: k for k in (ENCODE_SESSION, EXTEND, INSTALL, ENCODE_PIECES, ENCODE_WHOLE, DROP_SESSION)}
CHANNEL_METHODS = frozenset(k.method for k in KINDS.values() if k.channel)


class Call:
    """One call: its kind, its arguments, and the session it belongs to (None for shared work).

    ``shared`` calls (pieces of a stateless plan) may run on any worker or as a chunk task. A
    slotted class rather than a frozen dataclass: one is built per pool call, and the frozen
    dataclass's ``__init__`` (``object.__setattr__`` per field) and ``__post_init__`` were a
    measurable share of a no-op call's driver time.
    """

    __slots__ = ("kind", "args", "key")

    def __init__(self, kind: CallKind, args: tuple, key: str | None = None):
        if type(args) is not kind.args:
            raise TypeError(f"{kind.method} takes {kind.args.__name__}, not {type(args).__name__}")
        self.kind = kind
        self.args = args  # the kind's argument record
        self.key = key

    @property
    def shared(self) -> bool:
        return self.key is None

    def __repr__(self) -> str:  # never print megabytes of text in a log line
        return f"Call({self.kind.method}, key={'-' if self.key is None else 'set'}, {len(self.args)} args)"
