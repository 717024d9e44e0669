"""The session owner: the one holder of a process's session state, and its turns.

:class:`Sessions` owns the store (keyed sessions, keyless conversations and the drop-in's kept
lists, :mod:`delta_ray._core.session_store`), the keyless policy (:mod:`delta_ray._core.keyless`),
each key's lock and the turn: a session's read-encode-install runs under its key's lock, so two
threads extending one session serialize instead of losing an update, and other sessions run in
parallel. Every host of sessions (the library, a pool's worker, the HTTP handler, the drop-in)
turns through it. A fast tier found wrong leaves nothing behind: the engine's disable listener
empties the store, and every read checks the engine first (:meth:`Sessions.store`).
"""
from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Callable, Counter, Protocol, cast

import numpy as np
import pyarrow as pa

from .arguments import check_text
from .assembly import one_chunk
from .cut_predicate import CutPredicate
from .encoder import Encoder, ReferenceEncoder
from .id_lists import list_bytes, untrack_ints
from .keyless import KeylessChoice, KeylessPolicy
from .keys import describe
from .offsets import offsets_refusal, splice_offsets, splice_starts
from .plan import REENCODE, SESSION, Router
from .planner import PlannerConfig
from .repair import encode_turn
from .rope import rope_common_prefix
from .session_store import KeepList, SessionNotFound, SessionState, SessionStore
from .template import Template
from .turn_path import TurnEngine, TurnPath

_INT32 = pa.int32()
log = logging.getLogger("delta_ray.core")


class SessionEngine(Encoder, TurnEngine, Protocol):
    """The engine as the session owner runs it (``engine.engine.Engine``): its encoder, its one
    read per turn, and its disable, which purges every state it made."""

    @property
    def disabled_reason(self) -> str | None: ...

    def add_disable_listener(self, fn: Callable[[str], None]) -> None: ...

    def back_to_reference(self, reason: str) -> None: ...


class Sessions:
    """The sessions of one tokenizer in one process (see the module docstring).

    Returns IDs as the host needs them: a zero-copy ``ChunkedArray`` of the state's parts
    (:meth:`encode`, :meth:`extend`), a delta against a version the caller holds
    (:meth:`encode_session_delta`), or a Python list kept beside the state (:meth:`session_list`).
    """

    def __init__(self, engine: SessionEngine, reference: ReferenceEncoder, predicate: CutPredicate | None,
                 router: Router, template: Template, planner: PlannerConfig, *, threads: int, margin: int,
                 max_bytes: int, max_sessions: int, stats: Counter[str],
                 post_processor: Callable[[], Any] = lambda: None):
        """``post_processor``: reads the configuration's serialized post-processor (on the first
        offsets call only: parsing a configuration costs a vocabulary's JSON)."""
        self._engine = engine
        self._reference = reference
        self._post_processor = post_processor
        self._predicate = predicate
        self._router = router
        self._route = router.session_route()  # decided once: admission is fixed for this tokenizer
        self._template = template
        self._planner = planner
        self._threads = threads
        self._margin = margin
        self.stats = stats  # shared with the tokenizer's stateless paths
        self._store = SessionStore(max_bytes, max_sessions)
        self._keyless = KeylessPolicy(self._store)
        self._list_affix = {True: (template.prefix.tolist(), template.suffix.tolist()), False: ([], [])}
        self._purge_lock, self._purged = threading.Lock(), False
        engine.add_disable_listener(self._purge)
        self._turn_path = TurnPath(engine, self._store, predicate, margin, planner, stats) \
            if predicate is not None else None

    # -- what a host reads ------------------------------------------------------------------
    @property
    def store(self) -> SessionStore:
        """The session store, for reading: emptied first if the fast tier is disabled and its purge
        has not run yet. The switch to the reference is immediate but its purge listener runs after
        the rejection is persisted; without this, a turn in between could reuse the disabled
        engine's IDs (a replay returned them unchanged)."""
        disabled = self._engine.disabled_reason
        if not self._purged and disabled is not None:
            self._purge(disabled)
        return self._store

    def lock_for(self, session: str) -> threading.Lock:
        """``session``'s lock: its turns run under it."""
        return self._store.lock_for(session)

    def has_session(self, session: str) -> bool:
        return session in self.store

    def drop_session(self, session: str) -> bool:
        """Forget a session; returns whether it was held."""
        return self._store.pop(session) is not None

    def install_session(self, session: str, state: SessionState) -> None:
        """Adopt a state computed elsewhere (a pool's chunked initialization)."""
        check_text(session, "session")
        with self.lock_for(session):
            self._store.put(session, state)

    def turn_chars(self, session: str, delta_chars: int) -> int:
        """The characters a turn appending ``delta_chars`` to ``session`` re-encodes, read in O(1)
        from the stored state: everything after its last checkpoint, or the whole text where it has
        none (or is not held: the append is then refused at no cost)."""
        state = self.store.peek(session)
        if state is None:
            return delta_chars
        last = state.last_checkpoint
        return state.n_chars + delta_chars - (last[0] if last is not None else 0)

    def choose_keyless(self, text: str, tenant: str | None = None, *, head: str | None = None) -> KeylessChoice | None:
        """The session a keyless ``text``'s turn runs under (:mod:`delta_ray._core.keyless`, inside
        ``tenant``, or under the ``head`` a pool computed): a held conversation it continues, or a
        new one, started from a held one it shares a long start with. None: too short to be kept
        (encode it stateless)."""
        choice = self._keyless.choose(text, tenant, head=head)
        if choice is not None and choice.fork is not None:
            self._keyless.fork(choice)
        return choice

    # -- turns -------------------------------------------------------------------------------
    def encode(self, session: str, text: str, add_special_tokens: bool) -> pa.ChunkedArray:
        """An admitted session's turn to ``text``: its IDs as zero-copy chunks of the state's parts."""
        with self.lock_for(session):
            state = self._turn(session, self.store.get(session), text, None)[0]
        return self._chunked(state, add_special_tokens)

    def encode_keyless(self, choice: KeylessChoice, text: str, add_special_tokens: bool) -> pa.ChunkedArray:
        """A keyless text's turn under the conversation :meth:`choose_keyless` chose."""
        with self.lock_for(choice.key):
            state, reused, _ = self._turn(choice.key, self.store.get(choice.key), text, None)
        self.stats["content_hit" if reused else "content_miss"] += 1
        return self._chunked(state, add_special_tokens)

    def extend(self, session: str, delta: str, add_special_tokens: bool) -> pa.ChunkedArray:
        """The session's stored text plus ``delta``, O(len(delta)); :class:`SessionNotFound` when
        the session is not held. An unadmitted session's whole text goes to the reference."""
        with self.lock_for(session):
            state = self.store.peek(session)  # a turn's put marks it recently used
            if state is None:
                raise SessionNotFound(f"{describe(session)} is not held (unknown or evicted): "
                                      "send the whole text with encode(text, session=...)")
            if self._route is not SESSION:
                return one_chunk(self._by_reference(session, state.text + delta, add_special_tokens))
            new = self._turn(session, state, None, delta, peeked=True)[0]
        return self._chunked(new, add_special_tokens)

    def encode_by_reference(self, session: str, text: str, add_special_tokens: bool) -> np.ndarray:
        """An unadmitted session: one reference encode; the text is kept so that ``extend`` works."""
        with self.lock_for(session):
            return self._by_reference(session, text, add_special_tokens)

    def encode_session_delta(self, session: str, text: str, known_version: int | None = None,
                             delta: str | None = None,
                             expect_version: int | None = None) -> tuple[int, int, np.ndarray]:
        """Session encode for a remote caller that may hold the previous IDs: (version, k, tail),
        the new state's raw IDs being state ``known_version``'s first ``k`` then ``tail`` (k is 0
        unless the reused state is the caller's). With ``delta``, ``text`` is ignored and the stored
        text plus ``delta`` is encoded; with ``expect_version``, an extend of another version is
        refused (:class:`SessionNotFound`: an extend that outlived its caller's timeout)."""
        if self._route is not SESSION:
            raise RuntimeError("delta encodes need an admitted configuration")
        with self.lock_for(session):
            state = self.store.get(session)
            if delta is not None:
                if state is None:
                    raise SessionNotFound(f"{describe(session)} is not held (unknown or evicted): "
                                          "send the whole text with encode(text, session=...)")
                if expect_version is not None and state.version != expect_version:
                    raise SessionNotFound(f"{describe(session)} changed since the state this extend was made "
                                          "for (a stale or concurrent extend): send the whole text")
            new, reused, buf = self._turn(session, state, text, delta)
        k = reused if state is not None and known_version is not None and state.version == known_version else 0
        return new.version, k, np.frombuffer(buf, dtype=np.int32) if buf is not None and k else new.ids_from(k)

    def session_list(self, session: str, text: str, add_special_tokens: bool = True) -> tuple[list[int], bool]:
        """A session turn's IDs as a new Python list (the caller may mutate it), the template's
        around them when asked, and whether the turn continued the list kept beside the previous
        state: the store keeps each session's IDs as a list too, so a warm turn cuts that list and
        appends the new IDs (O(change)) and hands out a copy (a memcpy), never a conversion of the
        whole text (the drop-in's engines take lists)."""
        if self._route is not SESSION:
            raise RuntimeError("session lists need an admitted configuration")
        with self.lock_for(session):
            state = self.store.peek(session)
            ids, continued, _, _ = self._list_turn(session, state, text, add_special_tokens)
        return ids, continued

    def session_offsets(self, session: str, text: str, add_special_tokens: bool = True
                        ) -> tuple[list[int], list[tuple[int, int]]] | None:
        """A session turn's IDs as :meth:`session_list` gives them, and the reference's character
        offsets of each (``(0, 0)`` for the template's), as transformers' ``offset_mapping`` holds
        them. The offsets are kept beside the state with its list, so a turn asks the reference
        only for the text after the checkpoint it resumed from (:mod:`delta_ray._core.offsets`).
        None where this configuration's offsets do not splice, or the reference's IDs of that tail
        are not the turn's: the caller then serves the reference's own whole encode."""
        if self._route is not SESSION or self.offsets_refusal is not None:
            return None
        with self.lock_for(session):
            store = self.store
            state = store.peek(session)
            old = store.kept_offsets(session, state.version) if state is not None else None
            ids, _, new, kept = self._list_turn(session, state, text, add_special_tokens)
            starts = splice_starts(cast(CutPredicate, self._predicate), text, state)
            offsets = old if new is state and old is not None else \
                splice_offsets(text, new, kept, old, self._reference.encode_offsets, starts)
            if offsets is None:  # the reference disagrees with the IDs the turn kept or made
                self.stats["offsets_mismatch"] += 1
                reason = "the reference's IDs of a session's tail differ from the turn's (offsets call)"
                if self._engine.now().tier is not None:
                    self._engine.back_to_reference(reason)
                else:
                    log.error("delta-ray: %s, with no fast tier in use", reason)
                return None
            if offsets is not old:
                store.attach_offsets(session, new.version, offsets)
        prefix, suffix = self._list_affix[add_special_tokens]
        pairs = list(zip(offsets[:, 0].tolist(), offsets[:, 1].tolist()))
        if prefix or suffix:
            pairs = [(0, 0)] * len(prefix) + pairs + [(0, 0)] * len(suffix)
        return ids, pairs

    @functools.cached_property
    def offsets_refusal(self) -> str | None:
        """Why :meth:`session_offsets` cannot splice this configuration's offsets (None: it can),
        read from the configuration on first use (:func:`~delta_ray._core.offsets.offsets_refusal`)."""
        return offsets_refusal(self._predicate, self._post_processor())

    # -- internals --------------------------------------------------------------------------
    def _purge(self, reason: str) -> None:
        """Discard every state the (now disabled) fast tier may have produced (once)."""
        with self._purge_lock:
            if self._purged:
                return
            self._purged = True
            n = self._store.clear()
        self.stats["purged_states"] += n

    def _install(self, key: str, state: SessionState, generation: int, keep: KeepList | None = None,
                 reused: int = 0) -> None:
        """Store a state unless the engine switched while it was computed (it may be the wrong
        engine's); ``keep``: the caller's kept list (:meth:`SessionStore.install`)."""
        self._store.install(key, state, self._engine.generation == generation, None, keep, reused)

    def _by_reference(self, key: str, text: str, add_special_tokens: bool) -> np.ndarray:
        """The reference's whole encode of an unadmitted session's text (under its lock), kept."""
        self.stats["reference"] += 1
        ids = self._reference.encode_texts([text], add_special_tokens)[0]
        self._store.put(key, SessionState(text, np.zeros(0, np.int32), *(np.zeros(0, np.int64),) * 3))
        return ids

    def _list_turn(self, session: str, state: SessionState | None, text: str,
                   add_special_tokens: bool) -> tuple[list[int], bool, SessionState, int]:
        """:meth:`session_list`'s turn (under the key's lock, ``state`` just peeked): the caller's
        list, whether it continued the kept one, the state now held and how many of ``state``'s
        IDs it kept."""
        store = self._store
        keeper = _ListKeeper(store.kept(session, state.version) if state is not None else None)
        new, reused, _ = self._turn(session, state, text, None, peeked=True, keep=keeper)
        ids, continued = keeper.ids, keeper.continued
        if ids is None:  # a replay (nothing installed) or a state not kept
            ids = keeper.old if new is state else None
            continued = ids is not None
            if ids is None:
                ids = untrack_ints(new.ids.tolist())
                if new is state:
                    store.attach(session, new.version, ids, list_bytes(ids))
        prefix, suffix = self._list_affix[add_special_tokens]
        if prefix or suffix:
            out = prefix + ids
            out += suffix
        else:
            out = ids.copy()  # the kept list is never handed out
        return out, continued, new, reused

    def _chunked(self, state: SessionState, add_special_tokens: bool) -> pa.ChunkedArray:
        """A state's IDs as a ChunkedArray of its cached per-part arrays (a turn wraps only its new
        parts), the template's arrays (built once) around them."""
        return pa.chunked_array(self._template.when(add_special_tokens).chunks(state.arrow_chunks()), type=_INT32)

    def _turn(self, key: str, state: SessionState | None, text: str | None, delta: str | None, *,
              peeked: bool = False, keep: KeepList | None = None) -> tuple[SessionState, int, bytes | None]:
        """One turn of an admitted session (under its lock, ``state`` just read): ``text``, or the
        stored text plus ``delta``. Returns the state now held, how many leading IDs it kept from
        ``state``, and the engine's buffer of the IDs after them when the compact continuation ran
        (None: read them from the state). O(append): the stored text is compared in place
        (``startswith`` per part) and neither it nor the kept IDs are copied.

        What the turn is is decided once, by the router (:meth:`Router.turn`); a repair that only
        continues the stored text goes to the compact continuation (``_core/turn_path.py``), which
        runs the general repair's own steps in fewer native calls, or declines (None), and then
        the general repair runs. ``peeked``: the caller read ``state`` without marking it used;
        ``keep``: the caller's kept list, stored with the new state."""
        # ``held``: ``state`` where it is held (an extend's, or one the new text continues);
        # ``new``: ``text`` where it is given (no ``delta``)
        held, new = cast(SessionState, state), cast(str, text)
        if delta is not None:
            n, lcp, continues = held.n_chars + len(delta), held.n_chars, True
        else:
            n = len(new)
            continues = state is not None and state.prefix_of(new)
            if continues:
                lcp = held.n_chars
            else:  # compared part by part, in place: the stored text is never joined for it
                lcp = rope_common_prefix(state.text_parts, new) if state is not None else 0
        if continues and n == held.n_chars:
            self.stats["replay"] += 1
            if peeked:
                self._store.get(key)  # recently used, though this turn installs nothing
            return held, held.n_ids, None
        now = self._engine.now()
        generation = now.generation
        route = self._router.turn(lcp, fast=now.tier is not None) if state is not None else REENCODE
        if route is not REENCODE and continues:
            turn_path = cast(TurnPath, self._turn_path)  # an admitted tokenizer's turn (the router's)
            done = turn_path.step(key, held, delta if delta is not None else new[held.n_chars:], keep)
            if done is not None:
                return done
        parts = held.text_parts + (delta,) if delta is not None else (new,)  # the new text, as a rope
        if peeked:
            self._store.get(key)
        if route is REENCODE and state is not None:
            state, lcp = None, 0  # cheaper whole: a first encode's state (IDs and checkpoints)
            self.stats["reencode"] += 1
        res = encode_turn(parts, n, state, lcp, cast(CutPredicate, self._predicate), self._engine, self._planner,
                          self._threads, self._margin)
        self.stats["repair" if res.reused_tokens else "init"] += 1
        self._install(key, res.state, generation, keep, res.reused_tokens)
        return res.state, res.reused_tokens, None


class _ListKeeper:
    """A turn's kept list, made when the turn installs its state: the old state's list cut to the
    IDs the turn kept and the new ones appended (O(change)), or the new state's IDs converted whole.
    The list holds only ints, so it is kept out of the collector's sight
    (:func:`~delta_ray._core.id_lists.untrack_ints`): a full collection does not walk the table."""

    __slots__ = ("old", "ids", "continued")

    def __init__(self, old: list[int] | None):
        self.old = old
        self.ids: list[int] | None = None
        self.continued = False

    def __call__(self, state: SessionState, reused: int, tail: bytes | None) -> tuple[list[int], int]:
        ids = self.old
        if ids is not None and reused:
            del ids[reused:]
            ids += (np.frombuffer(tail, dtype=np.int32) if tail is not None else state.ids_from(reused)).tolist()
            self.continued = True
        else:
            ids = untrack_ints(state.ids.tolist())
        self.ids = ids
        return ids, list_bytes(ids)
