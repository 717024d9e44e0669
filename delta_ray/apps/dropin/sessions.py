"""The drop-in's sessions: a one-text encode re-encodes only what changed since the conversation's
last call, and builds its Python list from the one it kept.

A wrapped tokenizer's one-text encode (``encode``, ``__call__`` with one text,
``apply_chat_template(tokenize=True)`` of one chat) reads the request's scope
(:func:`delta_ray.request_scope`). With a session key it continues the session
``session_key(key, tenant)`` of the snapshot's ``TokenizerCore``; without one, a text of at least
:data:`HEAD_CHARS` characters is looked up by content among the recent conversations of its tenant
that begin with the same 4 KB (no scope: the shared namespace of requests without a tenant).

The IDs are the core's session turn (proof.md: the tail after the last checkpoint the new text still
shares, exact for any new text: a continuation, a chat template that rewrote its tail, an unrelated
text). ``TokenizerCore.encode_session_delta`` answers ``(version, k, tail)``: the new raw IDs are
state ``version``'s predecessor's first ``k`` then ``tail``, with ``k`` nonzero only when the
predecessor is the state the caller named. Each entry keeps the raw IDs (no template) of its
session's current state as a Python list, so a turn truncates it to ``k`` and appends ``tail``
(O(change)), then hands the caller a copy with the template around it: the caller may mutate what
it got; the kept list is never handed out. The list is tied to a state version, so a state the core
replaced, evicted or purged (a fast tier found wrong) makes the next turn rebuild the list from the
core's answer, never reuse it.

The kept lists are out of the cyclic collector's sight (:func:`~delta_ray.core.id_lists.untrack_ints`,
where each is made: a new state's ``tolist``, a fork's copy): a list of ints can be on no reference
cycle, and each of these only ever holds ints (cut with ``del``, extended with an integer array's
``tolist``), so a full collection does not walk the table's IDs (a default 1 GiB table holds about
23M in 1M-character conversations: ``bench_dropin.py --gc``). What the caller gets is a new list,
tracked as any.

The content lookup never decides an ID. Candidates are found by a keyed digest of the text's first
4 KB (``ContentDigest``, so no hash of the whole text) and compared with the stored text in place
(``startswith`` per rope part, memcmp speed); whichever state is chosen, the core re-checks the
shared prefix itself under the session's lock. A wrong candidate costs a comparison.

Bounds: one table per snapshot, LRU over entries (keyed and keyless, every tenant), bounded by
``max_bytes`` (each entry's kept list at :func:`list_bytes`, its core state's bytes and its key:
a hostile key costs its own size) and ``max_entries``; at most :data:`CANDIDATES` conversations per
head and tenant. The core's store is bounded by the same numbers, and an entry the table drops is
dropped from the core too.
"""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict

from ...core.id_lists import untrack_ints
from ...core.keys import CONTENT_HEAD_CHARS, ContentDigest, content_key, session_key
from ...core.rope import rope_common_prefix

__all__ = ["CANDIDATES", "DropinSessions", "HEAD_CHARS", "list_bytes"]

HEAD_CHARS = CONTENT_HEAD_CHARS  # keyless texts shorter than the digested head are not kept
CANDIDATES = 8  # recent conversations kept per (tenant, head): agents share system prompts
# A keyless text that diverges from a candidate more than this before the candidate's end (and
# more than an eighth of the candidate's length) is taken as another conversation: it gets an entry
# of its own (forked from the candidate when they share at least FORK_MIN_CHARS) instead of
# replacing the candidate's. A template that rewrites its tail (Qwen3.5's generation prompt, qwen-3
# dropping the reasoning of the turns since the last user message) diverges within this.
TAIL_SLACK_CHARS = 32768
FORK_MIN_CHARS = 16384
_INT_BYTES = sys.getsizeof(1 << 20)  # a token ID above the small-int cache: its own int object
_LOCK_STRIPES = 64


def list_bytes(ids: list) -> int:
    """What a kept list of IDs holds: the list (its pointer array) and one int object per ID (the
    few IDs under 257 are shared singletons: counted anyway, an upper bound)."""
    return sys.getsizeof(ids) + _INT_BYTES * len(ids)


class _Entry:
    """One conversation: its core key, the raw IDs of the core state ``version`` as a Python list
    (never handed out, holding only ints, untracked by the collector), its counted bytes, and the
    content key it is a candidate under (keyless)."""

    __slots__ = ("key", "ids", "version", "nbytes", "head")

    def __init__(self, key: str, head: str | None):
        self.key, self.head = key, head
        self.ids: list[int] = []
        self.version: int | None = None
        self.nbytes = 0


class DropinSessions:
    """The session table of one snapshot's ``TokenizerCore`` (thread-safe; calls on one entry are
    serialized, other entries run concurrently)."""

    def __init__(self, core, max_bytes: int, max_entries: int, *, content: bool = True):
        self.core = core
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.max_entry_bytes = max(1, max_bytes // 4)  # as the core's store: one state cannot flush all
        self.content = content
        self._digest = ContentDigest()  # per table, secret: nobody can aim a text at another's head
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._heads: dict[str, list[str]] = {}  # content key of a head -> entry keys, most recent first
        self._bytes = 0
        self._lock = threading.Lock()  # the table (entries, heads, bytes)
        self._stripes = [threading.Lock() for _ in range(_LOCK_STRIPES)]
        self._serial = 0
        self.stats = {"keyed": 0, "keyless": 0, "continued": 0, "forked": 0, "new": 0, "evicted": 0,
                      "refused": 0}
        t = core.template
        self._affix = {True: (t.prefix.tolist(), t.suffix.tolist()), False: ([], [])}

    # -- the request path --------------------------------------------------------------------------
    def encode(self, text: str, session: str | None, tenant: str | None, add_special_tokens: bool) -> list[int] | None:
        """The IDs of ``text`` (the template's around them when ``add_special_tokens``) as a fresh
        list, through the session ``session`` of ``tenant`` or, keyless, a conversation found by
        content; None where the caller's stateless path serves (a short keyless text, content
        lookup off)."""
        if session is not None:
            self.stats["keyed"] += 1
            return self._turn(session_key(session, tenant), None, text, add_special_tokens)
        if not self.content or len(text) < HEAD_CHARS:
            return None
        self.stats["keyless"] += 1
        head = content_key(self._digest.of(text), tenant)
        key, base = self._choose(head, text)
        return self._turn(key or self._new_key(head), head, text, add_special_tokens, base)

    def _choose(self, head: str, text: str) -> tuple[str | None, str | None]:
        """(the entry to continue, None) or (None, an entry to fork from) or (None, None).

        Continued: the candidate that keeps the most of its text, among those whose stored text is a
        prefix of ``text`` or diverges from it near its own end (a template that rewrote its tail);
        else forked: the one sharing the most with ``text``, if that is worth a fork."""
        with self._lock:
            keys = list(self._heads.get(head, ()))
        store = self.core.store
        states = [(key, store.peek(key)) for key in keys]
        best, best_kept = None, -1
        for key, state in states:  # first the cheap test: a stored text that the new one extends
            if state is not None and state.n_chars > best_kept and state.prefix_of(text):
                best, best_kept = key, state.n_chars
        fork, fork_shared = None, FORK_MIN_CHARS - 1
        for key, state in states:
            if state is None or key == best or state.n_chars <= best_kept:
                continue
            shared = rope_common_prefix(state.text_parts, text)
            if state.n_chars - shared <= min(TAIL_SLACK_CHARS, state.n_chars >> 3):
                if shared > best_kept:
                    best, best_kept = key, shared
            elif shared > fork_shared:
                fork, fork_shared = key, shared
        if best is not None:
            return best, None
        return None, fork

    def _new_key(self, head: str) -> str:
        with self._lock:
            self._serial += 1
            return f"{head}.{self._serial}"  # inside the head's content namespace: never a session's key

    def _turn(self, key: str, head: str | None, text: str, add_special_tokens: bool,
              base: str | None = None) -> list[int]:
        fork = self._fork_source(base) if base is not None else None
        with self._stripes[hash(key) % _LOCK_STRIPES]:
            with self._lock:
                entry = self._entries.get(key)
            if entry is None:
                entry = _Entry(key, head)
                if fork is not None:
                    state, entry.ids = fork
                    entry.version = state.version
                    self.core.install_session(key, state)  # states are immutable: shared, not copied
            try:
                version, k, tail = self.core.encode_session_delta(key, text, known_version=entry.version)
                ids = entry.ids
                if k:  # the core reused the state this list belongs to: keep its first k IDs
                    del ids[k:]
                    ids += tail.tolist()
                    self.stats["forked" if fork is not None else "continued"] += 1
                else:
                    ids = entry.ids = untrack_ints(tail.tolist())  # ints only: no cycle to find
                    self.stats["new"] += 1
                entry.version = version
            except BaseException:
                self._drop(key)  # the list may be half-updated: freed now (its version already
                # stops any reuse: the core's state is no longer the one it names)
                raise
            state = self.core.store.peek(key)
            if state is None or state.version != version:
                self._drop(key)  # the core did not keep the state (over its bound, an engine switch)
            else:
                self._put(entry, sys.getsizeof(key) + list_bytes(ids) + state.nbytes)
            prefix, suffix = self._affix[add_special_tokens]
            if not (prefix or suffix):
                return ids.copy()  # the caller may mutate what it gets: never the kept list
            out = prefix + ids
            out += suffix
            return out

    def _fork_source(self, base: str) -> tuple | None:
        """(the state, a copy of its list) of the entry ``base`` if its list is that state's: a new
        conversation sharing a long start with it begins from there without replacing it."""
        with self._stripes[hash(base) % _LOCK_STRIPES]:
            with self._lock:
                entry = self._entries.get(base)
            state = self.core.store.peek(base)
            if entry is None or state is None or state.version != entry.version:
                return None
            return state, untrack_ints(entry.ids.copy())  # the fork's kept list: ints only

    # -- the table ---------------------------------------------------------------------------------
    def _put(self, entry: _Entry, nbytes: int) -> None:
        dropped = []
        with self._lock:
            old = self._entries.pop(entry.key, None)
            if old is not None:
                self._bytes -= old.nbytes
            if nbytes > self.max_entry_bytes:
                self.stats["refused"] += 1
                dropped.append(entry.key)
                self._unlist(entry)
            else:
                entry.nbytes = nbytes
                self._entries[entry.key] = entry
                self._bytes += nbytes
                if entry.head is not None:
                    keys = self._heads.setdefault(entry.head, [])
                    if keys[:1] != [entry.key]:
                        if entry.key in keys:
                            keys.remove(entry.key)
                        keys.insert(0, entry.key)
                        while len(keys) > CANDIDATES:  # the head's oldest conversation goes
                            dropped.append(self._pop_locked(keys[-1]))
                while self._entries and (self._bytes > self.max_bytes or len(self._entries) > self.max_entries):
                    dropped.append(self._pop_locked(next(iter(self._entries))))
        for key in dropped:
            self.core.drop_session(key)

    def _pop_locked(self, key: str) -> str:
        entry = self._entries.pop(key)  # every listed candidate is an entry (both change under the lock)
        self._bytes -= entry.nbytes
        self._unlist(entry)
        self.stats["evicted"] += 1
        return key

    def _unlist(self, entry: _Entry) -> None:
        keys = self._heads.get(entry.head) if entry.head is not None else None
        if keys is not None and entry.key in keys:
            keys.remove(entry.key)
            if not keys:
                del self._heads[entry.head]

    def _drop(self, key: str) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.nbytes
                self._unlist(entry)
        self.core.drop_session(key)

    def clear(self) -> None:
        """Forget every conversation (here and in the core)."""
        with self._lock:
            keys = list(self._entries)
            self._entries.clear()
            self._heads.clear()
            self._bytes = 0
        for key in keys:
            self.core.drop_session(key)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def resident_bytes(self) -> int:
        """Bytes the table counts now (kept lists, core states, keys)."""
        return self._bytes
