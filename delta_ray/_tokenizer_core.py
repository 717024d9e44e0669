"""``TokenizerCore``: the exact tokenizer's stateless encoder and the route of each request.

It plans and encodes stateless texts (safe-cut chunks in parallel, batches, flat buffers, lists)
and decides each request's route once; a session's route goes to its session owner
(:class:`~delta_ray._core.sessions.Sessions`, ``core.sessions``), which holds every session state
of the process. The user's facade (:class:`delta_ray.tokenizer.DeltaTokenizer`) holds one; the
pool, its workers and chunk tasks, Serve replicas and the batch pipelines are handed one.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable, Sequence, cast

import numpy as np
import pyarrow as pa

from delta_ray._core import constants as C

from ._core.admission import Admission, admit, announce_refusal
from ._core.arguments import check_flag, check_text
from ._core.assembly import concat_ids, decode_ids, flat_from_pieces, ids_to_numpy, one_chunk, to_arrow
from ._core.config import REUSE_MODES, TokenizerConfig, tokenizer_config
from ._core.cut_predicate import CutPredicate
from ._core.encoder import ReferenceEncoder
from ._core.families import FAMILIES
from ._core.hosts import IdsLike, PoolLocal, SessionHost
from ._core.id_lists import int_list
from ._core.loading import LoadedTokenizer, TokenizerLike, load_tokenizer
from ._core.nfc_anchors import anchor_table
from ._core.parallel_encode import LIST_PIECES_PER_THREAD, PieceThreads, ids_list
from ._core.plan import CHUNKED, CONTENT, HERE, REFERENCE_SESSION, SESSION, UNADMITTED, Plan, Route, Router
from ._core.planner import chunk_count, plan_cuts
from ._core.pretok.transitions import derive_transitions
from ._core.reference_api import api_generation, normalizer
from ._core.repair import RepairPlan, plan_repair
from ._core.sessions import Sessions
from ._core.special_tokens import SpecialTokenIndex
from ._core.template import Template
from ._engine.engine import Engine, FastTier
from ._engine.native import NativeEngine
from ._verify.admit import select_engine

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
        """``config`` (a :class:`~delta_ray._core.config.TokenizerConfig`) and/or its fields as keywords
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
        self.router = Router(self._predicate is not None, cfg.cut_threshold, content_reuse=cfg.reuse == "content")
        self._threads = PieceThreads()  # long texts' pieces, on up to ``threads`` threads
        self.stats: Counter[str] = Counter()
        # The one owner of this process's session state (keyed, keyless, kept lists) and its turns.
        self.sessions = Sessions(self.engine, self._reference, self._predicate, self.router, self.template,
                                 self.planner, threads=self.threads, margin=self.margin,
                                 max_bytes=cfg.max_session_bytes, max_sessions=cfg.max_sessions, stats=self.stats,
                                 post_processor=lambda: self._loaded.config.get("post_processor"))

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
            return self.sessions.encode(cast(str, session), text, add_special_tokens)  # a named session's
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
        return self.sessions.extend(session, delta, add_special_tokens)

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
        :func:`delta_ray._core.repair.finish_repair`), for an executor with ``slots`` parallel encoders."""
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

    @property
    def predicate(self):  # the cut predicate (None when the configuration is not admitted)
        return self._predicate

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
            return ids_to_numpy(self.sessions.encode(cast(str, session), text, add_special_tokens))
        if route is REFERENCE_SESSION:
            return self.sessions.encode_by_reference(cast(str, session), text, add_special_tokens)
        if route is CONTENT:
            choice = self.sessions.choose_keyless(text)
            if choice is None:  # too short to be kept: encoded as any stateless text
                ids = self._run_plan(self.plan(text))
            else:
                return ids_to_numpy(self.sessions.encode_keyless(choice, text, add_special_tokens))
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

        These are a ``list<int32>`` column's own buffers (:func:`delta_ray._core.assembly.flat_list_array`).
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

    def session_arrow(self, id_parts: Sequence[np.ndarray | pa.Array], add_special_tokens: bool) -> pa.ChunkedArray:
        """A session's ID parts as a zero-copy ChunkedArray, post-processed (template) once."""
        return self.template.when(add_special_tokens).chunked(id_parts)


if TYPE_CHECKING:  # mypy checks that the core is each host's interface (_core/hosts.py), member by member
    def _is_every_host(core: TokenizerCore) -> tuple[PoolLocal, SessionHost]:
        return core, core
