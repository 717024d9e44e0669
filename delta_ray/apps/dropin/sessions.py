"""The drop-in's sessions: a one-text encode re-encodes only what changed since the conversation's
last call, and builds its Python list from the one it kept.

A wrapped tokenizer's one-text encode (``encode``, ``__call__`` with one text,
``apply_chat_template(tokenize=True)`` of one chat) reads the request's scope
(:func:`delta_ray.request_scope`). With a session key it continues the session
``session_key(key, tenant)`` of the snapshot's session owner; without one, a text of at least
:data:`HEAD_CHARS` characters is looked up by content among the recent conversations of its tenant
that begin with the same 4 KB (no scope: the shared namespace of requests without a tenant).

The IDs are the session owner's turn (:mod:`delta_ray._core.sessions`; proof.md: the tail after the
last checkpoint the new text still shares, exact for any new text: a continuation, a chat template
that rewrote its tail, an unrelated text), as a list (``Sessions.session_list``): the owner's store
keeps the raw IDs (no template) of each session's current state as a Python list beside it, so a
turn cuts that list to the IDs it kept and appends the new ones (O(change)), then hands the caller
a copy with the template around it: the caller may mutate what it got; the kept list is never
handed out. The list belongs to one
state and goes with it (a state the core replaced, evicted or purged because a fast tier was found
wrong), so it is never reused for another.

The kept lists are out of the cyclic collector's sight (:func:`~delta_ray._core.id_lists.untrack_ints`,
where each is made: a new state's ``tolist``, a fork's copy): a list of ints can be on no reference
cycle, and each of these only ever holds ints (cut with ``del``, extended with an integer array's
``tolist``), so a full collection does not walk the table's IDs (a default 1 GiB table holds about
23M in 1M-character conversations: ``bench_dropin.py --gc``). What the caller gets is a new list,
tracked as any.

The keyless lookup is the core's (:mod:`delta_ray._core.keyless`, one policy for every host): it
never decides an ID. The kept lists, the LRU, the byte bound (each kept list at
:func:`~delta_ray._core.id_lists.list_bytes`, its state's bytes and its key: a hostile key costs its
own size) and the per-key lock are the core store's (:class:`~delta_ray._core.session_store.SessionStore`),
the one owner of session state in the process; this table only names the session and counts.
"""
from __future__ import annotations

from ..._core.keyless import FORK_MIN_CHARS, TAIL_SLACK_CHARS
from ..._core.keys import CONTENT_HEAD_CHARS, session_key
from ..._core.sessions import Sessions

__all__ = ["DropinSessions", "FORK_MIN_CHARS", "HEAD_CHARS", "TAIL_SLACK_CHARS"]

HEAD_CHARS = CONTENT_HEAD_CHARS  # keyless texts shorter than the digested head are not kept


class DropinSessions:
    """The drop-in's view of one snapshot's session owner (thread-safe: calls on one session are
    serialized by the owner, other sessions run concurrently)."""

    def __init__(self, sessions: Sessions, *, content: bool = True):
        self.sessions = sessions
        self.content = content
        self.stats = {"keyed": 0, "keyless": 0, "continued": 0, "forked": 0, "new": 0, "offsets": 0}

    def encode(self, text: str, session: str | None, tenant: str | None, add_special_tokens: bool) -> list[int] | None:
        """The IDs of ``text`` (the template's around them when ``add_special_tokens``) as a fresh
        list, through the session ``session`` of ``tenant`` or, keyless, a conversation found by
        content; None where the caller's stateless path serves (a short keyless text, content
        lookup off)."""
        found = self._key(text, session, tenant)
        if found is None:
            return None
        key, fork = found
        ids, continued = self.sessions.session_list(key, text, add_special_tokens)
        self.stats[("forked" if fork else "continued") if continued else "new"] += 1
        return ids

    def encode_offsets(self, text: str, session: str | None, tenant: str | None,
                       add_special_tokens: bool) -> tuple[list[int], list[tuple[int, int]]] | None:
        """As :meth:`encode`, with each ID's character offsets (``offset_mapping``); None where the
        caller's stock path serves (as for :meth:`encode`, or offsets this configuration does not
        splice: :meth:`Sessions.session_offsets <delta_ray._core.sessions.Sessions.session_offsets>`)."""
        if self.sessions.offsets_refusal is not None:
            return None
        found = self._key(text, session, tenant)
        if found is None:
            return None
        self.stats["offsets"] += 1
        return self.sessions.session_offsets(found[0], text, add_special_tokens)

    def _key(self, text: str, session: str | None, tenant: str | None) -> tuple[str, bool] | None:
        """The session key ``text``'s turn runs under and whether it forked a held conversation;
        None: keyless and not kept (too short, content lookup off)."""
        if session is not None:
            self.stats["keyed"] += 1
            return session_key(session, tenant), False
        choice = self.sessions.choose_keyless(text, tenant) if self.content else None
        if choice is None:
            return None
        self.stats["keyless"] += 1
        return choice.key, choice.fork is not None

    def clear(self) -> None:
        """Forget every conversation (the owner's sessions: one store)."""
        self.sessions.store.clear()

    def __len__(self) -> int:
        return len(self.sessions.store)

    @property
    def resident_bytes(self) -> int:
        """Bytes the owner's store counts now (kept lists, states, keys)."""
        return self.sessions.store.resident_bytes
