"""``TokenizerCore``: the exact tokenizer's service interface (sessions, safe-cut chunking, content reuse).

The user's facade (:class:`delta_ray.tokenizer.DeltaTokenizer`) holds one; the pool, its workers
and chunk tasks, Serve replicas and the batch pipelines are handed one and use its methods directly.
"""
from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable, Sequence, cast

import numpy as np
import pyarrow as pa

from delta_ray.core import constants as C

from .core.admission import Admission, admit, announce_refusal
from .core.arguments import check_flag, check_text
from .core.assembly import concat_ids, decode_ids, flat_from_pieces, ids_to_numpy, one_chunk, to_arrow
from .core.config import REUSE_MODES, TokenizerConfig, tokenizer_config
from .core.cut_predicate import CutPredicate
from .core.encoder import ReferenceEncoder
from .core.families import FAMILIES
from .core.hosts import IdsLike, PoolLocal, SessionHost
from .core.id_lists import int_list, list_bytes, untrack_ints
from .core.keyless import KeylessChoice, KeylessPolicy
from .core.keys import describe
from .core.loading import LoadedTokenizer, TokenizerLike, load_tokenizer
from .core.nfc_anchors import anchor_table
from .core.parallel_encode import LIST_PIECES_PER_THREAD, PieceThreads, ids_list
from .core.plan import CHUNKED, CONTENT, HERE, REENCODE, REFERENCE_SESSION, SESSION, UNADMITTED, Plan, Route, Router
from .core.planner import chunk_count, plan_cuts
from .core.pretok.transitions import derive_transitions
from .core.reference_api import api_generation, normalizer
from .core.repair import RepairPlan, encode_turn, plan_repair
from .core.rope import rope_common_prefix
from .core.session_store import KeepList, SessionNotFound, SessionState, SessionStore
from .core.special_tokens import SpecialTokenIndex
from .core.template import Template
from .core.turn_path import TurnPath
from .engine.engine import Engine, FastTier
from .engine.native import NativeEngine
from .verify.admit import select_engine

_INT32 = pa.int32()

__all__ = ["REUSE_MODES", "TokenizerConfig", "TokenizerCore", "build_predicate"]


def build_predicate(loaded: LoadedTokenizer, admission: Admission) -> CutPredicate:
    """The cut predicate of an admitted configuration."""
    table = derive_transitions(loaded.config, loaded.digest) if admission.guard == "derived" \
        else FAMILIES[cast(str, admission.family)]  # a family's admission names it
    specials = SpecialTokenIndex(admission.added_tokens)
    if admission.normalizer == "nfc":
        return CutPredicate(table, specials, normalizer("NFC"), anchor_table())
    return CutPredicate(table, specials)


class TokenizerCore:
    """Exactly the reference's IDs, computed incrementally and in parallel where provably safe.

    ``encode(text, session=key)`` re-encodes only the tail after the session's last checkpoint that
    the new text still shares; keyless texts from ``cut_threshold`` characters are cut at safe cuts
    and the chunks encoded in parallel by the tokenizer's GIL-releasing batch encode. A
    configuration the exactness argument does not cover is served by the reference alone
    (``admission`` says why).

    An instance may be shared between threads (a web app's sync endpoints do this): calls on one
    session are serialized, so concurrent ``extend``s never lose an update; calls on different
    sessions run concurrently. ``shadow_rate`` re-checks that share of fast-tier answers with the
    reference in a background thread; a mismatch disables the fast tier for good and discards
    every session and content entry it produced.
    """

    def __init__(self, tokenizer: TokenizerLike, config: TokenizerConfig | None = None, *,
                 encoder: FastTier | NativeEngine | None = None, **options):
        """``config`` (a :class:`~delta_ray.core.config.TokenizerConfig`) and/or its fields as keywords
        (``chunk_size``, ``cut_threshold``, ``max_chunks``, ``threads``, ``reuse``,
        ``max_session_bytes``, ``max_sessions``, ``engine``, ``shadow_rate``, ``strict``); ``encoder``
        replaces the admitted fast tier (tests, benchmarks): a guarded tier, or an engine with no guard."""
        self.config = cfg = tokenizer_config(config, options)  # the options, as given (validated)
        self._loaded = load_tokenizer(tokenizer)
        self.planner = cfg.planner
        self.threads = cfg.threads or os.cpu_count() or 1
        self.reuse = cfg.reuse
        engine, shadow_rate = cfg.engine, cfg.shadow_rate
        self._admission = admit(self._loaded)
        announce_refusal(self._admission, self._loaded.digest, strict=cfg.strict)
        # The post-processor's fixed IDs (admitted configurations; the reference adds its own)
        self.template = Template.of(self._admission)
        self._reference = ReferenceEncoder(self._loaded)  # a lazy loaded one: built on first use
        self._reference_is_native = api_generation() >= 1  # tokenizers 1.x: as fast as the fast tier
        self._predicate = build_predicate(self._loaded, self._admission) if self._admission else None
        # The encoder seam: the reference, or the guarded fast tier once admitted (a guarded code
        # point sends only a window around it to the reference), sampled by the shadow verifier.
        # Unadmitted configurations only ever use the reference.
        self.engine = Engine(self._reference, self._predicate, shadow_rate)
        if encoder is not None:
            tier = encoder if isinstance(encoder, FastTier) else FastTier(encoder)
            self.engine.use(tier, f"{tier.description} (given)")
        elif self._admission:
            select_engine(engine, self._loaded.config_bytes, self.engine, digest=self._loaded.digest)
        self.shadow = self.engine.shadow
        self.margin = max(C.MIN_MARGIN, max((len(t) for t in self._admission.added_tokens), default=0))
        # The one owner of this process's session state (keyed, keyless, kept lists): a session's
        # read-encode-install runs under its key's lock, so two threads extending one session
        # serialize instead of losing an update; other sessions run in parallel.
        self._store = SessionStore(cfg.max_session_bytes, cfg.max_sessions)
        self._keyless = KeylessPolicy(self._store)
        self.router = Router(self._predicate is not None, cfg.cut_threshold, content_reuse=cfg.reuse == "content")
        self._session_route = self.router.session_route()  # decided once: admission is fixed for this core
        self._threads = PieceThreads()  # long texts' pieces, on up to ``threads`` threads
        self.stats: Counter[str] = Counter()
        t = self.template
        self._list_affix = {True: (t.prefix.tolist(), t.suffix.tolist()), False: ([], [])}
        # A fast tier found wrong leaves nothing behind: every state it may have produced goes.
        self._purge_lock, self._purged = threading.Lock(), False
        self.engine.add_disable_listener(self._purge)
        self._turn_path = TurnPath(self.engine, self._store, self._predicate, self.margin,
                                   self.planner, self.stats) if self._predicate is not None else None

    # -- public API -------------------------------------------------------------------------
    @property
    def admission(self) -> Admission:
        """Whether the fast paths serve this tokenizer, why, and which engine encodes now."""
        return replace(self._admission, engine=self.engine.reason)

    @property
    def digest(self) -> str:
        """SHA-256 of the tokenizer configuration bytes."""
        return self._loaded.digest

    @property
    def loaded(self) -> LoadedTokenizer:
        return self._loaded

    def encode(self, text: str, *, session: str | None = None,
               add_special_tokens: bool = True) -> pa.Int32Array | pa.ChunkedArray:
        """The reference IDs of ``text``; with ``session``, reuse what that session already encoded.

        A session call returns a ``pyarrow.ChunkedArray`` whose chunks are zero-copy views of the
        session's immutable ID parts: the turn costs O(append), and the array stays valid and
        unchanged whatever the session does next (``combine_chunks()`` makes one contiguous copy).
        A stateless call returns a ``pyarrow.Int32Array``.
        """
        check_text(text)
        if session is not None:
            check_text(session, "session")
        route = self.router.decide(text, session)
        if route is SESSION:
            key = cast(str, session)  # the router sends only a named session's call here
            with self._lock_for(key):
                turn = self._turn(key, self._states().get(key), text, None)
            return self._chunked(turn[0], add_special_tokens)
        if route is REFERENCE_SESSION:  # one chunk: the reference's whole answer
            return one_chunk(self.encode_routed(route, text, session, add_special_tokens))
        return to_arrow(self.encode_routed(route, text, None, add_special_tokens))

    def extend(self, session: str, delta: str, *, add_special_tokens: bool = True) -> pa.ChunkedArray:
        """IDs of the session's stored text plus ``delta``, without resending the transcript.

        O(len(delta)), a ``ChunkedArray`` as for :meth:`encode` with a session. Raises
        :class:`SessionNotFound` when the session is unknown or was evicted (send the whole text).
        """
        if type(session) is not str or type(delta) is not str:  # one test on the common path
            check_text(session, "session"), check_text(delta, "delta")
        with self._lock_for(session):
            state = self._states().peek(session)  # a turn's put marks it recently used
            if state is None:
                raise SessionNotFound(f"{describe(session)} is not held (unknown or evicted): "
                                      "send the whole text with encode(text, session=...)")
            if self._session_route is REFERENCE_SESSION:
                return one_chunk(self._reference_session(session, state.text + delta, add_special_tokens))
            turn = self._turn(session, state, None, delta, peeked=True)
        return self._chunked(turn[0], add_special_tokens)

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[pa.Int32Array]:
        """Reference IDs of many stateless texts, all pieces encoded in one parallel batch."""
        if isinstance(texts, str) or not isinstance(texts, Iterable):
            raise TypeError("texts must be a sequence of str")
        texts = list(texts)
        for t in texts:
            check_text(t)
        return [to_arrow(a) for a in self.encode_batch_ids(texts, add_special_tokens=add_special_tokens)]

    def cuts(self, text: str) -> list[int]:
        """The character offsets the planner would cut ``text`` at with this instance's settings."""
        check_text(text)
        return list(self.plan(text).cuts)

    # -- the request path: plan -> run pieces (here, or a pool's executor) -> finish ----------------
    def plan(self, text: str, slots: int | None = None) -> Plan:
        """The pieces to encode ``text`` as (consecutive, between safe cuts), for ``slots`` parallel
        encoders (default: this instance's threads). Unadmitted: the whole text, by the reference."""
        if self.router.decide(text, batch=True) is UNADMITTED:
            return Plan(text, by_reference=True)
        pred = cast(CutPredicate, self._predicate)
        cuts = plan_cuts(text, pred, self.planner, slots or self.threads)
        return Plan(text, tuple(c.pos for c in cuts), skip=pred.piece_skip)

    def plan_session_init(self, text: str, slots: int) -> RepairPlan:
        """A long session's first encode as a plan (pieces in parallel, then checkpoints and state:
        :func:`delta_ray.core.repair.finish_repair`), for an executor with ``slots`` parallel encoders."""
        if self.router.session_route() is not SESSION:
            raise RuntimeError("session plans need an admitted configuration")
        return plan_repair(text, None, 0, cast(CutPredicate, self._predicate), self.planner, slots, self.margin)

    def missed_cuts(self, text: str, plan: Plan, slots: int) -> int:
        """How many of the planner's targets found no safe cut in their window (a metric)."""
        return max(0, chunk_count(len(text), self.planner, slots) - 1 - len(plan.cuts))

    def prepare_lists(self) -> None:
        """Start the fast engine's list entry point check in the background (the drop-in calls this
        when it attaches, so that the first requests find it done); nothing on the reference."""
        self.engine.prepare_lists()

    @property
    def uses_fast_engine(self) -> bool:
        """Whether the fast tier encodes now (it may be switched off for good by the shadow check)."""
        return self.engine.now().tier is not None

    def fast_allows(self, text: str) -> bool:
        """Whether the fast engine in use now would encode all of ``text`` (its guard allows every
        code point of it): the text then costs the fast engine's time, not the reference's."""
        now = self.engine.now()
        return now.tier is not None and (now.allows is None or now.allows(text))

    def turn_chars(self, session: str, delta_chars: int) -> int:
        """The characters a turn appending ``delta_chars`` to ``session`` re-encodes, read in O(1)
        from the stored state: everything after its last checkpoint, or the whole text where it has
        none (or is not held: the append is then refused at no cost)."""
        state = self._states().peek(session)
        if state is None:
            return delta_chars
        last = state.last_checkpoint
        return state.n_chars + delta_chars - (last[0] if last is not None else 0)

    def run_pieces(self, pieces: list[str]) -> list[np.ndarray]:
        """The in-process executor: each piece's IDs (no post-processing) from the current engine."""
        return self.engine.encode_pieces(pieces)

    def finish(self, ids: np.ndarray, add_special_tokens: bool) -> np.ndarray:
        """A plan's concatenated piece IDs, post-processed (template) when asked."""
        return self.template.when(add_special_tokens).apply(ids)

    def encode_by_reference(self, text: str, add_special_tokens: bool) -> np.ndarray:
        """A ``by_reference`` plan: the reference's own IDs of the whole text, its post-processing included."""
        self.stats["reference"] += 1
        return self._reference.encode_texts([text], add_special_tokens)[0]

    def decode(self, ids: IdsLike, *, skip_special_tokens: bool = True) -> str:
        """The reference decode of IDs (list, numpy or Arrow)."""
        return self._reference.tokenizer.decode(decode_ids(ids), skip_special_tokens=check_flag(
            skip_special_tokens, "skip_special_tokens"))

    def drop_session(self, session: str) -> bool:
        """Forget a session; returns whether it was held."""
        return self._store.pop(session) is not None

    def has_session(self, session: str) -> bool:
        return session in self._states()

    @property
    def store(self) -> SessionStore:
        return self._states()

    @property
    def predicate(self):  # the cut predicate (None when the configuration is not admitted)
        return self._predicate

    def encode_session_delta(self, session: str, text: str, known_version: int | None = None,
                             delta: str | None = None,
                             expect_version: int | None = None) -> tuple[int, int, np.ndarray]:
        """Session encode for a remote caller that may hold the previous IDs: (version, k, tail),
        the new state's raw IDs being state ``known_version``'s first ``k`` then ``tail`` (k is 0
        unless the reused state is the caller's). With ``delta``, ``text`` is ignored and the stored
        text plus ``delta`` is encoded; with ``expect_version``, an extend of another version is
        refused (:class:`SessionNotFound`: an extend that outlived its caller's timeout)."""
        if self.router.decide("", session) is not SESSION:
            raise RuntimeError("delta encodes need an admitted configuration")
        with self._lock_for(session):
            state = self._states().get(session)
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

    def install_session(self, session: str, state: SessionState) -> None:
        """Adopt a state computed elsewhere (a pool's chunked initialization)."""
        check_text(session, "session")
        with self._lock_for(session):
            self._store.put(session, state)

    def choose_keyless(self, text: str, tenant: str | None = None, *, head: str | None = None) -> KeylessChoice | None:
        """The session a keyless ``text``'s turn runs under (:mod:`delta_ray.core.keyless`, inside
        ``tenant``, or under the ``head`` a pool computed): a held conversation it continues, or a
        new one, started from a held one it shares a long start with. None: too short to be kept
        (encode it stateless)."""
        choice = self._keyless.choose(text, tenant, head=head)
        if choice is not None and choice.fork is not None:
            self._keyless.fork(choice)
        return choice

    def session_list(self, session: str, text: str, add_special_tokens: bool = True) -> tuple[list[int], bool]:
        """A session turn's IDs as a new Python list (the caller may mutate it), the template's
        around them when asked, and whether the turn continued the list kept beside the previous
        state: the store keeps each session's IDs as a list too, so a warm turn cuts that list and
        appends the new IDs (O(change)) and hands out a copy (a memcpy), never a conversion of the
        whole text (the drop-in's engines take lists)."""
        if self._session_route is not SESSION:
            raise RuntimeError("session lists need an admitted configuration")
        with self._lock_for(session):
            store = self._states()
            state = store.peek(session)
            keeper = _ListKeeper(store.kept(session, state.version) if state is not None else None)
            new, _, _ = self._turn(session, state, text, None, peeked=True, keep=keeper)
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
        return out, continued

    # -- IDs as numpy (used by the pool and the batch pipeline) -----------------------------------
    def encode_ids(self, text: str, *, session: str | None = None, add_special_tokens: bool = True) -> np.ndarray:
        """Like :meth:`encode`, returning an int32 numpy array."""
        return self.encode_routed(self.router.decide(text, session), text, session, add_special_tokens)

    def encode_routed(self, route: Route, text: str, session: str | None = None,
                      add_special_tokens: bool = True) -> np.ndarray:
        """``text``'s IDs (an int32 array) by the route its host decided (:meth:`Router.decide`): a
        pool's caller side and a Serve replica decide over their own hosts and run a route meant for
        this process here, without deciding again."""
        if route is SESSION:  # one copy of the rope, the template around it (the state keeps no join)
            key = cast(str, session)  # a session route is a named session's
            with self._lock_for(key):
                state = self._turn(key, self._states().get(key), text, None)[0]
            return ids_to_numpy(self._chunked(state, add_special_tokens))
        if route is REFERENCE_SESSION:
            key = cast(str, session)
            with self._lock_for(key):
                return self._reference_session(key, text, add_special_tokens)
        if route is CONTENT:
            choice = self.choose_keyless(text)
            if choice is None:  # too short to be kept: encoded as any stateless text
                ids = self._run_plan(self.plan(text))
            else:
                with self._lock_for(choice.key):
                    state, reused, _ = self._turn(choice.key, self._states().get(choice.key), text, None)
                self.stats["content_hit" if reused else "content_miss"] += 1
                return ids_to_numpy(self._chunked(state, add_special_tokens))
        elif route is UNADMITTED:
            return self.encode_by_reference(text, add_special_tokens)
        elif route is HERE:
            ids = self._run_plan(Plan(text))
        elif route is CHUNKED:
            ids = self._run_plan(self.plan(text))
        else:
            raise ValueError(f"route {route!r} is not run in this process")
        return self.finish(ids, add_special_tokens)

    def encode_list(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """A keyless text's IDs as a Python list (transformers' container, for the drop-in): the
        route, engine and guard of :meth:`encode_ids`; a long text is cut by the same planner at
        safe cuts into two pieces a thread, each converted on the thread that encoded it and joined
        in order (docs/dropin.md §14). Other routes are :meth:`encode_ids` converted."""
        check_text(text)
        route = self.router.decide(text)
        if route is not HERE and route is not CHUNKED:
            return int_list(self.encode_routed(route, text, None, add_special_tokens))
        plan = self.plan(text, LIST_PIECES_PER_THREAD * self.threads) if route is CHUNKED else None
        if plan is not None and plan.cuts:
            self.stats["chunked"] += 1
            ids = self._threads.encode_list(self.engine, plan.pieces, self.threads, self.uses_fast_engine)
        else:
            self.stats["whole"] += 1
            ids = ids_list(self.engine, [text])
        template = self.template.when(add_special_tokens)
        if template.added:
            ids[:0] = template.prefix.tolist()
            ids += template.suffix.tolist()
        return ids

    def encode_batch_ids(self, texts: list[str], *, add_special_tokens: bool = True) -> list[np.ndarray]:
        """Stateless IDs for many texts through one batch encode of all their pieces."""
        if self._batch_route() is UNADMITTED:  # one GIL-releasing batch call, parallel across texts
            self.stats["reference"] += len(texts)
            return self._reference.encode_texts(list(texts), add_special_tokens)
        counts, pieces = [], []
        for t in texts:
            plan_pieces = self._batch_pieces(t)
            counts.append(len(plan_pieces))
            pieces.extend(plan_pieces)
        arrays = self.run_pieces(pieces)
        out, i = [], 0
        for count in counts:
            out.append(self.finish(concat_ids(arrays[i:i + count]), add_special_tokens))
            i += count
        self.stats["batch_texts"] += len(texts)
        return out

    def encode_batch_flat(self, texts: Sequence[str], *, add_special_tokens: bool = True,
                          threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Stateless IDs of many texts as one int32 values buffer plus int64 offsets (len + 1).

        These are a ``list<int32>`` column's own buffers (:func:`delta_ray.core.assembly.flat_list_array`).
        Long texts are cut at safe cuts; a text's pieces are consecutive in the engine's flat
        output, so the texts' offsets are the pieces' offsets at text boundaries: no per-text array
        and no copy, except the one insertion pass for a template (BOS). With the fast tier the
        pieces are split over ``threads`` threads (the engine releases the GIL).
        """
        texts = list(texts)
        if self._batch_route() is UNADMITTED:
            self.stats["reference"] += len(texts)
            return flat_from_pieces(self._reference.encode_texts(texts, add_special_tokens))
        pieces: list[str] = []
        counts = np.ones(len(texts), dtype=np.int64)
        for i, t in enumerate(texts):
            plan_pieces = self._batch_pieces(t)
            pieces.extend(plan_pieces)
            counts[i] = len(plan_pieces)
        values, piece_offsets = self._threads.encode_flat(self.engine, pieces, threads or 1, self.uses_fast_engine)
        if len(pieces) == len(texts):
            offsets = piece_offsets
        else:
            idx = np.zeros(len(texts) + 1, dtype=np.int64)
            np.cumsum(counts, out=idx[1:])
            offsets = piece_offsets[idx]
        self.stats["batch_texts"] += len(texts)
        return self.template.when(add_special_tokens).apply_flat(values, offsets)

    # -- internals --------------------------------------------------------------------------
    def _lock_for(self, session: str) -> threading.Lock:
        return self._store.lock_for(session)

    def _purge(self, reason: str) -> None:
        """Discard every state the (now disabled) fast tier may have produced (once)."""
        with self._purge_lock:
            if self._purged:
                return
            self._purged = True
            n = self._store.clear()
        self.stats["purged_states"] += n

    def _states(self) -> SessionStore:
        """The session store, for reading: emptied first if the fast tier is disabled and its purge
        has not run yet. The switch to the reference is immediate but its purge listener runs after
        the rejection is persisted; without this, a turn in between could reuse the disabled
        engine's IDs (a replay returned them unchanged)."""
        disabled = self.engine.disabled_reason
        if not self._purged and disabled is not None:
            self._purge(disabled)
        return self._store

    def _install(self, key: str, state: SessionState, generation: int, keep: KeepList | None = None,
                 reused: int = 0) -> None:
        """Store a state unless the engine switched while it was computed (it may be the wrong
        engine's); ``keep``: the caller's kept list (:meth:`SessionStore.install`)."""
        self._store.install(key, state, self.engine.generation == generation, None, keep, reused)

    def _batch_route(self) -> Route:
        """The router's decision for a batch as a whole (:meth:`Router.batch`)."""
        return self.router.batch(fast=self.uses_fast_engine, reference_native=self._reference_is_native)

    def _batch_pieces(self, text: str) -> list[str]:
        """A batch row's pieces: its plan's where the router cuts it, else the row whole."""
        return self.plan(text).pieces if self.router.decide(text, batch=True) is CHUNKED else [text]

    def _run_plan(self, plan: Plan) -> np.ndarray:
        """Run a stateless plan here: its pieces are consecutive, so their flat values are the text's
        IDs; a fast engine runs them on ``threads`` threads (the reference's batch call is parallel)."""
        if not plan.cuts:
            self.stats["whole"] += 1
            return self.run_pieces([plan.text])[0]
        self.stats["chunked"] += 1
        values, _ = self._threads.encode_flat(self.engine, plan.pieces, self.threads, self.uses_fast_engine)
        return values

    def _reference_session(self, key: str, text: str, add_special_tokens: bool) -> np.ndarray:
        """An unadmitted session: one reference encode; the text is kept so that ``extend`` works."""
        ids = self.encode_by_reference(text, add_special_tokens)
        self._store.put(key, SessionState(text, np.zeros(0, np.int32), *(np.zeros(0, np.int64),) * 3))
        return ids

    def _chunked(self, state: SessionState, add_special_tokens: bool) -> pa.ChunkedArray:
        """A state's IDs as a ChunkedArray of its cached per-part arrays (a turn wraps only its new
        parts), the template's arrays (built once) around them."""
        return pa.chunked_array(self.template.when(add_special_tokens).chunks(state.arrow_chunks()), type=_INT32)

    def session_arrow(self, id_parts: Sequence[np.ndarray | pa.Array], add_special_tokens: bool) -> pa.ChunkedArray:
        """A session's ID parts as a zero-copy ChunkedArray, post-processed (template) once."""
        return self.template.when(add_special_tokens).chunked(id_parts)

    def _turn(self, key: str, state: SessionState | None, text: str | None, delta: str | None, *,
              peeked: bool = False, keep: KeepList | None = None) -> tuple[SessionState, int, bytes | None]:
        """One turn of an admitted session (under its lock, ``state`` just read): ``text``, or the
        stored text plus ``delta``. Returns the state now held, how many leading IDs it kept from
        ``state``, and the engine's buffer of the IDs after them when the compact continuation ran
        (None: read them from the state). O(append): the stored text is compared in place
        (``startswith`` per part) and neither it nor the kept IDs are copied.

        What the turn is is decided once, by the router (:meth:`Router.turn`); a repair that only
        continues the stored text goes to the compact continuation (``core/turn_path.py``), which
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
        now = self.engine.now()
        generation = now.generation
        route = self.router.turn(lcp, fast=now.tier is not None) if state is not None else REENCODE
        if route is not REENCODE and continues:
            turn_path = cast(TurnPath, self._turn_path)  # an admitted core's turn (the router's)
            done = turn_path.step(key, held, delta if delta is not None else new[held.n_chars:], keep)
            if done is not None:
                return done
        parts = held.text_parts + (delta,) if delta is not None else (new,)  # the new text, as a rope
        if peeked:
            self._store.get(key)
        if route is REENCODE and state is not None:
            state, lcp = None, 0  # cheaper whole: a first encode's state (IDs and checkpoints)
            self.stats["reencode"] += 1
        res = encode_turn(parts, n, state, lcp, cast(CutPredicate, self._predicate), self.engine, self.planner,
                          self.threads, self.margin)
        self.stats["repair" if res.reused_tokens else "init"] += 1
        self._install(key, res.state, generation, keep, res.reused_tokens)
        return res.state, res.reused_tokens, None


class _ListKeeper:
    """A turn's kept list, made when the turn installs its state: the old state's list cut to the
    IDs the turn kept and the new ones appended (O(change)), or the new state's IDs converted whole.
    The list holds only ints, so it is kept out of the collector's sight
    (:func:`~delta_ray.core.id_lists.untrack_ints`): a full collection does not walk the table."""

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


if TYPE_CHECKING:  # mypy checks that the core is each host's interface (core/hosts.py), member by member
    def _is_every_host(core: TokenizerCore) -> tuple[PoolLocal, SessionHost]:
        return core, core
