"""The pool's orchestrator: what a request means -- its route, its session record, which calls
it needs and how their answers become its IDs.

How a call is executed (queue, dispatch, timers, retries, retired workers, orphans) is
:class:`~delta_ray.actors.call_runner.CallRunner`'s; the orchestrator hands it each
:class:`~delta_ray.actors.calls.Call` with the in-process fallback that answers it if no worker
does, and merges worker answers into the session records. Neither holds a Ray handle: workers are
reached through a :class:`~delta_ray.actors.transport.WorkerTransport`, so the fault handling is
tested in milliseconds on an in-process fake transport. Requests follow the core's one path:
:class:`delta_ray._core.plan.Router` decides, ``TokenizerCore.plan`` / ``plan_session_init`` cut, the
workers run the pieces, and ``TokenizerCore.finish`` / ``session_arrow`` assemble, exactly as in
process.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from delta_ray._core import constants as C
from delta_ray._core.assembly import COPY_POOL, concat_ids, one_chunk, to_arrow
from delta_ray._core.config import PoolConfig
from delta_ray._core.hosts import PoolLocal
from delta_ray._core.keys import ContentDigest, content_key, describe, session_key
from delta_ray._core.plan import (
    CONTENT,
    POOL,
    REFERENCE_SESSION,
    SESSION,
    Host,
    Route,
    Router,
)
from delta_ray._core.planner import chunk_count
from delta_ray._core.repair import finish_repair
from delta_ray._core.rope import merge_text_parts, rope_is_prefix
from delta_ray._core.session_store import SessionNotFound, splice_arrow
from delta_ray._core.state_seal import seal_state
from delta_ray.scheduler import Dispatcher, PlacementModel

from . import metrics
from .call_runner import CallRunner
from .calls import (
    ENCODE_PIECES,
    ENCODE_SESSION,
    ENCODE_WHOLE,
    EXTEND,
    INSTALL,
    Call,
    ExtendArgs,
    InstallArgs,
    PiecesArgs,
    SessionArgs,
    WholeArgs,
)
from .session_table import SessionTable, key_id
from .transport import WorkerTransport

log = logging.getLogger("delta_ray.pool")


class _KeyLock:
    """Serializes one session's requests (extend order matters); forgets idle keys."""

    def __init__(self, locks: dict, key: str):
        self._locks, self._key = locks, key_id(key)

    async def __aenter__(self):
        entry = self._locks.setdefault(self._key, [asyncio.Lock(), 0])
        entry[1] += 1
        self._entry = entry
        await entry[0].acquire()

    async def __aexit__(self, *exc):
        self._entry[0].release()
        self._entry[1] -= 1
        if self._entry[1] == 0:
            self._locks.pop(self._key, None)


class PoolOrchestrator:
    """Everything the pool decides, on one event loop, over a transport.

    ``core`` is the caller-side tokenizer (planning, short texts, the in-process fail-over);
    ``config`` a resolved :class:`~delta_ray._core.config.PoolConfig`. Coroutines must run on ``loop``.
    """

    def __init__(self, core: PoolLocal, transport: WorkerTransport, worker_ids: Sequence[str],
                 config: PoolConfig, loop: asyncio.AbstractEventLoop, secret: bytes, *,
                 record: Any = metrics, clock=None):
        self.core = core  # the pool's own tokenizer in this process: plans, runs what stays here, assembles
        self.secret = secret
        # Keyless texts' content keys, keyed by the pool's secret: only its authenticated callers
        # can compute the key of a text, and every one of them finds the same worker state.
        self._content_digest = ContentDigest.derived(secret, b"delta-ray pool content keys")
        self._record = record
        # Keyless texts under the cut threshold are sticky by content on a worker (inside their
        # tenant), so a repeated prompt finds its state; longer ones are planned over the cluster,
        # or placed in the caller where the cost model expects it to finish first.
        self.router = Router(bool(core.admission), core.config.cut_threshold, Host.POOL, content_reuse=True,
                             place_here=self._placed_here if config.placement else None)
        dispatcher = Dispatcher(config.policy, workers=list(worker_ids),
                                max_inflight_tasks=config.max_inflight_tasks,
                                workers_take_shared=config.workers_take_shared, clock=clock)
        self.calls = CallRunner(transport, dispatcher, config, loop, merge=self._merge, forget=self._forget,
                                count=self.count, record=record)
        self._session_locks: dict[bytes, list] = {}
        # One record per session (actors/session_table.py), evicted whole, bounded by count and bytes.
        # A request reads its record once and writes what it learned in one call: the worker
        # believed to hold it, the version of that state (an extend must extend exactly that one),
        # the (version, IDs) this pool last returned, the (version, text parts) last sent (to ship
        # deltas) and the first ID that changed in its last answer.
        self.sessions = SessionTable(C.MIRROR_BYTES + C.TEXT_MIRROR_BYTES, C.KNOWN_SESSIONS)
        self.placement = PlacementModel()
        self._fast_seen = False
        self.stats: dict[str, int] = {}

    # -- what callers use --------------------------------------------------------------------------
    @property
    def config(self) -> PoolConfig:
        return self.calls.config

    @property
    def dispatcher(self) -> Dispatcher:
        """The queues and the session-to-worker routing (the call runner's)."""
        return self.calls.dispatcher

    @property
    def transport(self) -> WorkerTransport:
        return self.calls.transport

    @property
    def num_workers(self) -> int:
        return len(self.dispatcher.workers)

    def _placed_here(self, text: str) -> bool:
        """The placement model's answer for a keyless text too large to be encoded in passing:
        whether the caller finishes it before the pool would (scheduler/placement.py)."""
        if self.core.uses_fast_engine and not self._fast_seen:
            self._fast_seen = True  # the caller's engine just became the fast tier: start from its speed
            self.placement.local_chars_per_ms = max(self.placement.local_chars_per_ms, C.FAST_CHARS_PER_MS)
        return self.placement.run_local(len(text), self._chunks(text))

    def encode_here(self, route: Route, text: str, add: bool) -> pa.Int32Array:
        """A keyless text the router kept in the caller (``route``: here, chunked or unadmitted),
        encoded by the caller's own tokenizer; its time teaches the placement model."""
        t0 = time.perf_counter()
        out = to_arrow(self.core.encode_routed(route, text, None, add))
        self.placement.observe_local(len(text), (time.perf_counter() - t0) * 1e3)
        self.placement.remote_chars_per_ms = self.placement.local_chars_per_ms  # workers run the same engine
        self.count("placed_here")
        return out

    def home_of(self, session: str, tenant: str | None = None) -> str:
        """The worker the session ``session`` of ``tenant`` lives on now."""
        return self.dispatcher.home_of(session_key(session, tenant))

    async def encode(self, text: str, session: str | None, add: bool, *, tenant: str | None = None,
                     route: Route | None = None) -> pa.Int32Array | pa.ChunkedArray:
        """A text's IDs: the session ``session``'s inside ``tenant`` (a ChunkedArray), or keyless
        (an Int32Array: planned over the pool, or sticky by content inside ``tenant``). ``route``:
        the router's decision, when the caller made it (:class:`~delta_ray.actors.pool.TokenizerPool`
        does, to run the texts it keeps without a hop to this loop). Every state on the workers is
        stored under a key of :mod:`delta_ray._core.keys`, one namespace per kind."""
        if route is None:
            route = self.router.decide(text, session)
        if route is SESSION:
            return await self._session(session_key(session, tenant), text, add)
        if route is REFERENCE_SESSION:
            return await self._reference_session(session_key(session, tenant), text, add)
        if route is POOL:
            return await self._stateless_chunked(text, add)
        if route is not CONTENT:  # here, chunked or unadmitted: in the caller
            return await asyncio.to_thread(self.encode_here, route, text, add)
        # The head carries the tenant and is never a session's key (_core/keys.py): a keyless prompt
        # never finds another tenant's state on a worker, and no session name reaches it. The
        # head's worker picks the conversation the text continues (_core/keyless.py), so the text
        # goes whole (under the cut threshold) and the answer is all its IDs, one array like
        # every stateless one; nothing of it is mirrored here.
        head = content_key(self._content_digest.of(text), tenant)
        call = Call(ENCODE_SESSION, SessionArgs(head, text, known_version=None), head)
        ids = await self.calls.run("session", len(text), call, share_of=text,
                                   fallback=lambda: (self.core.encode_ids(text, add_special_tokens=False),))
        self._forget(head)  # the splice's record of the head: no conversation of its own
        self.count("session")
        arr = self.core.session_arrow(ids, add)
        # concat_arrays, not combine_chunks: pyarrow 26's combine_chunks ignores its memory_pool
        return pa.concat_arrays(arr.chunks, memory_pool=COPY_POOL) if arr.num_chunks else arr.combine_chunks()

    async def extend(self, session: str, delta: str, add: bool, *, tenant: str | None = None) -> pa.ChunkedArray:
        """The session's stored text plus ``delta``, on the worker that holds it."""
        key = session_key(session, tenant)

        def no_fallback():
            raise SessionNotFound(f"{describe(key)} timed out on its worker: send the whole text "
                                  "with encode(text, session=...)")
        async with _KeyLock(self._session_locks, key):
            if self.router.session_route() is REFERENCE_SESSION:
                return one_chunk(await self._extend_unadmitted(key, delta, add))
            rec = self.sessions.get(key)
            sent, version = (rec.text, rec.version) if rec is not None else (None, None)
            call = self._extend_call(key, delta, rec)
            ids = await self.calls.run("session", len(delta), call, fallback=no_fallback, share_of=delta)
            if sent is not None and sent[0] == version:
                self.sessions.sent_now(key, merge_text_parts(sent[1] + (delta,)))
            else:
                self.sessions.sent(key, None, None)
            self.count("extend")
            return self.core.template.when(add).chunked_arrays(ids)  # _splice's chunks: Arrow, none empty

    async def extend_tail(self, session: str, delta: str, add: bool, *,
                          tenant: str | None = None) -> tuple[int, int, np.ndarray]:
        """Extend, answering only what changed: (start, count, IDs from start on)."""
        ids = await self.extend(session, delta, add, tenant=tenant)
        # read once: the next answer sets it again
        k = self.sessions.set(session_key(session, tenant), "start", None) or 0
        start = self.core.template.when(add).start(k)
        return start, len(ids), ids.slice(start).to_numpy()  # copies the tail only

    async def encode_batch(self, texts: list[str], add: bool) -> list[pa.Int32Array]:
        async def one(t: str) -> pa.Int32Array:
            route = self.router.decide(t, batch=True)  # a row: no content reuse, each text once
            if route is POOL:
                return await self._stateless_chunked(t, add)
            return to_arrow(await asyncio.to_thread(self.core.encode_routed, route, t, None, add))
        return list(await asyncio.gather(*(one(t) for t in texts)))

    def count(self, path: str) -> None:
        self.stats[path] = self.stats.get(path, 0) + 1
        self._record.record_path(path)

    # -- request paths -------------------------------------------------------------------------------
    def _slots(self) -> int:
        """Parallel execution slots for planning chunks: Ray task slots, plus the live workers
        when they take shared work too."""
        workers = self.num_workers if self.config.workers_take_shared else 0
        return max(1, workers + self.config.max_inflight_tasks)

    def _chunks(self, text: str) -> int:
        """The chunks the planner cuts ``text`` into on the pool (its one rule, at most the slots)."""
        return chunk_count(len(text), self.core.planner, self._slots())

    async def _stateless_chunked(self, text: str, add: bool) -> pa.Int32Array:
        t0 = time.perf_counter()
        try:
            return await self._stateless(text, add)
        finally:
            self.placement.observe_remote(len(text), self._chunks(text), (time.perf_counter() - t0) * 1e3)

    async def _stateless(self, text: str, add: bool) -> pa.Int32Array:
        slots = self._slots()
        plan = self.core.plan(text, slots)
        if plan.by_reference:  # an unadmitted configuration's plan: whole, on a worker
            return to_arrow(await self._whole(text, add))
        self._record.record_cut_misses(self.core.missed_cuts(text, plan, slots))
        arrays = await self._pieces(plan.pieces)
        self.count("chunked" if plan.cuts else "whole")
        return to_arrow(self.core.finish(concat_ids(arrays), add))

    async def _whole(self, text: str, add: bool) -> np.ndarray:
        """An unadmitted configuration's plan: the reference encodes the text whole, template included."""
        call = Call(ENCODE_WHOLE, WholeArgs(text, add_special_tokens=add))
        out = await self.calls.run("chunk", len(text), call, share_of=text,
                                   fallback=lambda: self.core.encode_by_reference(text, add))
        self.count("reference")
        return out

    async def _extend_unadmitted(self, key: str, delta: str, add: bool) -> np.ndarray:
        rec = self.sessions.get(key)
        sent = rec.text if rec is not None else None
        if sent is None:
            raise SessionNotFound(f"{describe(key)} is not held (unknown or evicted): "
                                  "send the whole text with encode(text, session=...)")
        parts = merge_text_parts(sent[1] + (delta,))
        ids = await self._whole("".join(parts), add)
        self.sessions.sent(key, 0, parts)
        self.count("extend")
        return ids

    async def _reference_session(self, key: str, text: str, add: bool) -> pa.ChunkedArray:
        """An unadmitted configuration's session: no repairs, one whole encode by the reference;
        the text is kept (here) so that extend works."""
        async with _KeyLock(self._session_locks, key):
            ids = await self._whole(text, add)
            self.sessions.sent(key, 0, (text,))
            return one_chunk(ids)

    async def _session(self, key: str, text: str, add: bool):
        async with _KeyLock(self._session_locks, key):
            home = self.dispatcher.home_of(key) if self.dispatcher.workers else None
            rec = self.sessions.get(key)
            if home is not None and self.router.cuts(text) \
                    and (rec.worker if rec is not None else None) != home:
                parts = await self._chunked_init(key, text)
                self.count("chunked_init")
                return self.core.session_arrow(parts, add)
            sent, version = (rec.text, rec.version) if rec is not None else (None, None)
            sent_chars = sum(map(len, sent[1])) if sent is not None else 0
            if sent is not None and version is not None and sent[0] == version and len(text) > sent_chars \
                    and rope_is_prefix(sent[1], sent_chars, text):
                # The text extends what this session last sent: ship only the suffix, as extend does.
                delta = text[sent_chars:]
                call = self._extend_call(key, delta, rec)
                try:
                    ids = await self.calls.run("session", len(delta), call, share_of=delta,
                                               fallback=lambda: self._encode_fallback(key, text))
                except SessionNotFound:  # evicted, moved or changed on the worker: send it whole
                    self.sessions.sent(key, None, None)
                    rec = self.sessions.get(key)
                else:
                    # text == recorded + delta (checked above): keep the caller's string, no join
                    self.sessions.sent_now(key, (text,))
                    self.count("session_delta")
                    return self.core.session_arrow(ids, add)
            known = rec.ids if rec is not None else None
            call = Call(ENCODE_SESSION, SessionArgs(key, text, known_version=known[0] if known else None), key)
            ids = await self.calls.run("session", len(text), call, share_of=text,
                                       fallback=lambda: self._encode_fallback(key, text))
            self.sessions.sent_now(key, (text,))
            self.count("session")
            return self.core.session_arrow(ids, add)

    @staticmethod
    def _extend_call(key: str, delta: str, rec) -> Call:
        """Extend the state of ``key`` that its record ``rec`` names (refused if the worker holds
        another) by ``delta``, naming the IDs this pool holds so that the worker answers only what
        changed."""
        known = rec.ids if rec is not None else None
        return Call(EXTEND, ExtendArgs(key, delta, known_version=known[0] if known else None,
                                       expect_version=rec.version if rec is not None else None), key)

    def _encode_fallback(self, key: str, text: str) -> tuple:
        return (self.core.encode_ids(text, session=key, add_special_tokens=False),)

    async def _chunked_init(self, key: str, text: str) -> tuple:
        """A long session's first encode: chunks in parallel, then the home worker adopts the state."""
        plan = self.core.plan_session_init(text, self._slots())
        arrays = await self._pieces(plan.pieces)
        res = finish_repair(plan, arrays)
        self.sessions.set(key, "ids", None)
        try:
            seal = seal_state(self.secret, key, res.state)
            await self.calls.run("session", 0, Call(INSTALL, InstallArgs(key, res.state, seal), key),
                                 fallback=lambda: True)
            self.sessions.answered(key, self.dispatcher.home_of(key), res.state.version, res.state.id_parts, 0)
            self.sessions.sent(key, res.state.version, (text,))
        except Exception:  # the next request re-initializes on whichever worker is home then
            log.warning("installing %s failed; it will re-initialize", describe(key), exc_info=True)
            self._forget(key)
        return res.state.id_parts

    async def _pieces(self, pieces: list[str]) -> list[np.ndarray]:
        total = sum(map(len, pieces))

        async def one(piece: str) -> np.ndarray:
            out = await self.calls.run("chunk", len(piece), Call(ENCODE_PIECES, PiecesArgs([piece])),
                                       request_chars=max(1, total), share_of=piece,
                                       fallback=lambda: self.core.run_pieces([piece]))
            return out[0]
        return list(await asyncio.gather(*(one(p) for p in pieces)))

    def _splice(self, key: str, answer, wid: str | None) -> tuple:
        """Turn worker ``wid``'s (version, k, tail) into the session's IDs (a rope: the kept prefix
        of the mirror, not copied, plus the tail) and remember them. Returned as Arrow chunks: a
        part kept from the last answer keeps that answer's chunk (the mirror holds both, as
        ``(version, parts, chunks)``), so a turn wraps only its new parts, not the whole rope."""
        version, k, tail = answer
        rec = self.sessions.get(key)
        known = rec.ids if rec is not None else None
        tail = np.asarray(tail, dtype=np.int32)
        if k and known is None:  # cannot happen: k > 0 only answers a version we sent
            raise RuntimeError("worker answered a delta for IDs this pool does not hold")
        try:  # k == 0 keeps nothing of the mirror: the tail alone
            parts, chunks = splice_arrow(known[1], known[2], k, tail) if k else splice_arrow((), (), 0, tail)
        except ValueError as exc:  # never the IDs it answered: this pool cannot splice them
            self._forget(key)
            raise SessionNotFound(f"{describe(key)}: its worker's answer does not match the IDs this "
                                  f"pool holds ({exc}); send the whole text with encode(text, session=...)"
                                  ) from None
        # IDs before k are the ones this pool returned last time (start)
        self.sessions.answered(key, wid, version, parts, k, chunks, n_ids=k + len(tail))
        return chunks

    def _merge(self, call: Call, answer, wid: str | None):
        """Worker ``wid``'s answer as its caller gets it: a session delta spliced onto the mirror."""
        return self._splice(call.key, answer, wid) if call.kind.session_delta else answer

    def _forget(self, key: str) -> None:
        """Drop what this pool believes about a session's worker state (it is unknown now)."""
        self.sessions.forget(key)
