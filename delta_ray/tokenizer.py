"""``DeltaTokenizer``: the user's tokenizer (exact IDs, sessions, safe-cut chunking) in a few methods.

Everything else a pool, a worker, Serve or a batch pipeline needs (plans, pieces, session states,
flat batch buffers) lives on :class:`delta_ray._tokenizer_core.TokenizerCore`, reachable as ``.core`` and
handed to those parts explicitly; this class checks the user's arguments, names a session by its
store key (:func:`delta_ray._core.keys.session_key`, never a raw name the store shares with other
kinds of state) and forwards the call.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Sequence, overload

import pyarrow as pa

from ._core.admission import Admission
from ._core.arguments import check_flag, check_text
from ._core.config import TokenizerConfig
from ._core.keys import session_key
from ._core.loading import TokenizerLike
from ._tokenizer_core import TokenizerCore

if TYPE_CHECKING:
    from ._engine.engine import FastTier
    from ._engine.native import NativeEngine


class DeltaTokenizer:
    """Exactly the reference's IDs, computed incrementally and in parallel where provably safe.

    ``encode(text, session=key)`` re-encodes only the tail after the session's last checkpoint that
    the new text still shares; ``extend(key, delta)`` appends without resending the transcript;
    keyless texts from ``cut_threshold`` characters are cut at safe cuts and the chunks encoded in
    parallel. A configuration the exactness argument does not cover is served by the reference
    alone (``admission`` says why).

    An instance may be shared between threads (a web app's sync endpoints do this): calls on one
    session are serialized, so concurrent ``extend``s never lose an update; calls on different
    sessions run concurrently. ``shadow_rate`` re-checks that share of fast-tier answers with the
    reference in a background thread; a mismatch disables the fast tier for good and discards
    every session and content entry it produced.
    """

    __slots__ = ("_core",)

    def __init__(self, tokenizer: TokenizerLike, config: TokenizerConfig | None = None, *,
                 encoder: FastTier | NativeEngine | None = None, **options):
        """``config`` (a :class:`~delta_ray._core.config.TokenizerConfig`) and/or its fields as keywords
        (``chunk_size``, ``cut_threshold``, ``max_chunks``, ``threads``, ``reuse``,
        ``max_session_bytes``, ``max_sessions``, ``engine``, ``shadow_rate``, ``strict``); ``encoder`` replaces
        the admitted fast tier (tests, benchmarks)."""
        self._core = TokenizerCore(tokenizer, config, encoder=encoder, **options)

    @overload
    def encode(self, text: str, *, session: None = None, add_special_tokens: bool = True) -> pa.Int32Array: ...

    @overload
    def encode(self, text: str, *, session: str, add_special_tokens: bool = True) -> pa.ChunkedArray: ...

    def encode(self, text: str, *, session: str | None = None,
               add_special_tokens: bool = True) -> pa.Int32Array | pa.ChunkedArray:
        """The reference IDs of ``text``; with ``session``, reuse what that session already encoded.

        A session call returns a ``pyarrow.ChunkedArray`` of zero-copy views of the session's
        immutable ID parts (the turn costs O(append); ``combine_chunks()`` makes one contiguous
        copy); a stateless call returns a ``pyarrow.Int32Array``. Both on every configuration
        (an unadmitted one's session answer is one chunk).
        """
        if add_special_tokens is not True and add_special_tokens is not False:
            add_special_tokens = check_flag(add_special_tokens)
        if session is not None:
            session = session_key(check_text(session, "session"))
        return self._core.encode(text, session=session, add_special_tokens=add_special_tokens)

    def extend(self, session: str, delta: str, *, add_special_tokens: bool = True) -> pa.ChunkedArray:
        """IDs of the session's stored text plus ``delta``, without resending the transcript (a
        ``pyarrow.ChunkedArray``, as :meth:`encode` with a session).

        Raises :class:`~delta_ray.SessionNotFound` when the session is unknown or was evicted:
        send the whole text with ``encode(text, session=...)`` then.
        """
        if add_special_tokens is not True and add_special_tokens is not False:
            add_special_tokens = check_flag(add_special_tokens)
        if type(session) is not str:  # one test on the common path
            check_text(session, "session")
        return self._core.extend(session_key(session), delta, add_special_tokens=add_special_tokens)

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[pa.Int32Array]:
        """Reference IDs of many stateless texts, all pieces encoded in one parallel batch."""
        return self._core.encode_batch(texts, add_special_tokens=check_flag(add_special_tokens))

    def decode(self, ids, *, skip_special_tokens: bool = True) -> str:
        """The reference decode of IDs (list, numpy or Arrow)."""
        return self._core.decode(ids, skip_special_tokens=skip_special_tokens)

    def cuts(self, text: str) -> list[int]:
        """The character offsets the planner would cut ``text`` at with this instance's settings."""
        return self._core.cuts(text)

    def drop_session(self, session: str) -> bool:
        """Forget a session; returns whether it was held."""
        return self._core.sessions.drop_session(session_key(check_text(session, "session")))

    @property
    def admission(self) -> Admission:
        """Whether the fast paths serve this tokenizer, why, and which engine encodes now."""
        return self._core.admission

    @property
    def digest(self) -> str:
        """SHA-256 of the tokenizer configuration bytes (what a pool's workers check they load)."""
        return self._core.digest

    @property
    def config(self) -> TokenizerConfig:
        """The options, as given (validated)."""
        return self._core.config

    @property
    def stats(self) -> Counter:
        """How many calls took each path (replay, repair, init, chunked, content_hit, reference...)."""
        return self._core.stats

    @property
    def core(self) -> TokenizerCore:
        """The service interface this facade forwards to (what a pool, worker or Serve is handed)."""
        return self._core
