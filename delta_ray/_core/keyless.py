"""Which held conversation a keyless text continues: the one lookup policy of every host.

A keyless text of at least :data:`~delta_ray._core.keys.CONTENT_HEAD_CHARS` characters is looked up
among the conversations held under its head (:class:`~delta_ray._core.keys.ContentDigest` of its
first 4 KB inside its tenant: no hash of the whole text), and the stored texts are compared with it
in place (``startswith`` and common prefixes per rope part, memcmp speed). Agents share long system
prompts, so one head holds several conversations (:data:`~delta_ray._core.constants.KEYLESS_CANDIDATES`,
most recent first, bounded by the store).

The choice never decides an ID: whichever state is chosen, the turn re-checks the shared prefix
itself under the key's lock (proof.md §5), so a wrong choice costs time. Ray-free.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from .id_lists import list_bytes, untrack_ints
from .keys import CONTENT_HEAD_CHARS, ContentDigest, content_key, is_keyless_head, keyless_key
from .rope import rope_common_prefix
from .session_store import SessionStore

__all__ = ["FORK_MIN_CHARS", "KeylessChoice", "KeylessPolicy", "TAIL_SLACK_CHARS"]

# A keyless text that diverges from a candidate more than this before the candidate's end (and
# more than an eighth of the candidate's length) is taken as another conversation: it gets an entry
# of its own (forked from the candidate when they share at least FORK_MIN_CHARS) instead of
# replacing the candidate's. A template that rewrites its tail (Qwen3.5's generation prompt, qwen-3
# dropping the reasoning of the turns since the last user message) diverges within this.
TAIL_SLACK_CHARS = 32768
FORK_MIN_CHARS = 16384


@dataclass(frozen=True)
class KeylessChoice:
    """Where a keyless text's turn runs: ``key``, a held conversation it continues (``new`` False)
    or a new one, which starts from the held conversation ``fork`` where that is not None."""

    key: str
    new: bool = False
    fork: str | None = None


class KeylessPolicy:
    """The keyless lookup of one session store: a secret digest of the head (so nobody can aim a
    text at another's head) and a serial for new conversations."""

    def __init__(self, store: SessionStore, digest: ContentDigest | None = None):
        self._store = store
        self._digest = digest if digest is not None else ContentDigest()
        self._serials = itertools.count(1)

    def choose(self, text: str, tenant: str | None = None, *, head: str | None = None) -> KeylessChoice | None:
        """The conversation ``text`` continues (the one that keeps the most of its stored text, among
        those whose text is a prefix of ``text`` or diverges from it near its own end: a template
        that rewrote its tail), else a new one, forked from the candidate sharing the most with
        ``text`` if that is worth a fork. None: ``text`` is too short to be looked up. ``head``:
        the text's head as its caller computed it (a pool's, keyed by the pool's secret, with the
        tenant inside), instead of this policy's digest of it inside ``tenant``."""
        if len(text) < CONTENT_HEAD_CHARS:
            return None
        if head is None:
            head = content_key(self._digest.of(text), tenant)
        elif not is_keyless_head(head):
            raise ValueError("a keyless head is a content key without a serial")
        candidates = self._store.candidates(head)
        best, best_kept = None, -1
        for key, state in candidates:  # first the cheap test: a stored text that the new one extends
            if state.n_chars > best_kept and state.prefix_of(text):
                best, best_kept = key, state.n_chars
        fork, fork_shared = None, FORK_MIN_CHARS - 1
        for key, state in candidates:
            if key == best or state.n_chars <= best_kept:
                continue
            shared = rope_common_prefix(state.text_parts, text)
            if state.n_chars - shared <= min(TAIL_SLACK_CHARS, state.n_chars >> 3):
                if shared > best_kept:
                    best, best_kept = key, shared
            elif shared > fork_shared:
                fork, fork_shared = key, shared
        if best is not None:
            return KeylessChoice(best)
        # inside the head's content namespace: never a session's key, nor another head's
        return KeylessChoice(keyless_key(head, next(self._serials)), True, fork)

    def fork(self, choice: KeylessChoice) -> bool:
        """Start ``choice``'s new conversation from its ``fork``'s state (states are immutable:
        shared, not copied) and a copy of its kept list, if it is still held; whether it was."""
        store, base = self._store, choice.fork
        if base is None:
            return False
        with store.lock_for(base):
            state = store.peek(base)
            if state is None:
                return False
            kept = store.kept(base, state.version)
            copy = untrack_ints(kept.copy()) if kept is not None else None  # the fork's own: ints only
        return store.put(choice.key, state, kept=(copy, list_bytes(copy)) if copy is not None else None)
