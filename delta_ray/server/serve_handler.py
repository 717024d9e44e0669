"""What the HTTP service does with a request, Ray-free: a body in, an answer (or a 4xx) out.

One handler, two hosts: ``asgi.py`` puts it behind HTTP, and both the one-process server
(``local.py``, uvicorn) and a Ray Serve replica (``actors/serve.py``, which adds the replica, the
pool's start-up and the handle API) run that same ASGI app. Everything a request means lives here,
so it is tested on a plain event loop (tests/serve/test_serve_handler.py) with a fake pool, like
``http_api.py``.

The handler runs on the host's event loop (``fast_replica``: user code on Serve's own loop), so
every step whose cost grows with the request runs in a thread: parsing and serializing large
bodies, validating long message lists, chat rendering, long encodes, the per-ID validation of
``/detokenize`` and the decode, ``token_strs``. What stays on the loop is O(1) or bounded by a
small constant. A thread is not enough for a step that holds the GIL throughout (a JSON parse, a
decode): the loop waits for it all the same, so such steps are bounded before they start or cut
into short ones (``request_body.py``), and the decode releases the GIL (``reference_api.decode_fn``).
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import os
import threading
import uuid
from contextlib import contextmanager
from typing import Any, AsyncIterable, Callable

import numpy as np

from delta_ray._core.assembly import ids_to_numpy
from delta_ray._core.hosts import SessionHost
from delta_ray._core.keys import session_key
from delta_ray._core.loading import LoadedTokenizer
from delta_ray._core.plan import CONTENT, HERE, POOL, REFERENCE_SESSION, UNADMITTED, Host, Route, Router
from delta_ray._core.reference_api import decode_fn, id_to_token_fn, vocab_size  # the 0.x API or tokenizer.json (1.x)
from delta_ray._core.session_store import SessionNotFound
from delta_ray.server.chat_template import ChatTemplateError

from .http_api import (
    TOKENIZE_FIELDS,
    BadRequest,
    TokenizeRequest,
    detokenize_size,
    dumps_json,
    parse_detokenize,
    parse_tokenize,
)
from .local_metrics import Counters
from .request_body import detokenize_max_bytes, parse_bounded, parse_id_body
from .serve_config import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_DETOKENIZE_TOKENS, DEFAULT_MAX_JSON_ITEMS

log = logging.getLogger("delta_ray.serve")

OFF_LOOP_BYTES = 256 * 1024  # bodies larger than this are parsed and serialized in a thread
# The loop rule: a request is encoded on the event loop only when its work is bounded by a small
# constant, estimated in O(1) from the characters it encodes and which engine encodes them.
OFF_LOOP_CHARS = 128 * 1024  # at most this many characters the fast engine encodes whole (~1 ms)
OFF_LOOP_CHARS_REFERENCE = 16 * 1024  # ... or this many where the reference may encode them (1-2 MB/s)
OFF_LOOP_IDS = 16384  # ID lists longer than this are validated, decoded or named (token_strs) in a thread
MANY_TOKENS = 65536  # answers with more IDs than this are serialized in a thread
MANY_MESSAGES = 64  # chats with more messages than this are validated in a thread (all are rendered in one)


class _KeyLocks:
    """One lock per session key while requests for it are in flight (a session's read-check-encode
    must see no other writer: the version an append checks is the one it extends)."""

    def __init__(self):
        self._guard = threading.Lock()
        self._locks: dict[str, list] = {}

    def busy(self, key: str) -> bool:
        return key in self._locks

    @contextmanager
    def hold(self, key: str):
        with self._guard:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if not entry[1]:
                    self._locks.pop(key, None)


class RequestHandler:
    """The /tokenize and /detokenize endpoints of one serving process (a Serve replica, or the
    one-process server) over its ``TokenizerCore``.

    ``pool`` (optional) is a :class:`~delta_ray.actors.pool.TokenizerPool` (or anything with its
    ``encode_async``) that takes keyless texts from ``pool_min_chars`` characters and keyless
    overflow while more than ``overflow_inflight`` requests run here. ``template`` is the chat
    template (or None). Sessions are this replica's: an answer for a session names the state it
    leaves with ``session_version`` (a digest keyed by a secret of this replica), and an append
    applies only to the state its ``session_version`` names.

    Request limits (each refusal a 413 with a message): ``max_body_bytes`` per /tokenize body;
    ``max_detokenize_tokens`` IDs per /detokenize (its body at most ``BYTES_PER_ID`` bytes an ID,
    refused by its Content-Length or as it streams past); ``max_json_items`` JSON values and keys
    per body, counted before it is parsed.
    """

    def __init__(self, loaded: LoadedTokenizer, core: SessionHost, *, template: Any = None, pool: Any = None,
                 served: "set[str] | None" = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_model_len: "int | None" = None, require_tenant: bool = False,
                 pool_min_chars: "int | None" = None, overflow_inflight: "int | None" = None,
                 max_detokenize_tokens: int = DEFAULT_MAX_DETOKENIZE_TOKENS, replica_id: str = "",
                 max_json_items: int = DEFAULT_MAX_JSON_ITEMS, record: Any = None):
        self.core = core  # the stateless encoder and the route's runner
        self.sessions = core.sessions  # the session owner
        self.pool = pool
        self.template = template
        self.served = set(served or ())
        self.max_body = max_body_bytes
        self.max_model_len = max_model_len
        self.require_tenant = require_tenant
        self.pool_min_chars = pool_min_chars or core.config.cut_threshold
        self.overflow_inflight = overflow_inflight or 2 * max(1, core.threads)
        # The one decision per request: the replica's session, its content reuse, the stateless
        # path here, or its pool (long keyless texts, and overflow while busy).
        self.router = Router(bool(core.admission), core.config.cut_threshold, Host.SERVE,
                             pool_from=self.pool_min_chars if pool is not None else None)
        self.max_detokenize = max_detokenize_tokens
        self.max_detokenize_bytes = detokenize_max_bytes(max_detokenize_tokens, max_body_bytes)
        self.max_json_items = max_json_items
        self.replica_id = replica_id
        # Where request counts go: Ray's metrics (actors/metrics.py) on a replica; this process's
        # own counters otherwise (the one-process server shows them at /metrics).
        self._record = record if record is not None else Counters()
        self.inflight = 0
        config = loaded.config  # parsed once here, not kept (LoadedTokenizer.config)
        self.vocab_size = vocab_size(loaded.tokenizer, config)
        self.id_to_token = id_to_token_fn(loaded.tokenizer, config)
        self._decode = decode_fn(loaded.tokenizer)
        self._locks = _KeyLocks()
        # Keys the session_version digests: a version is valid only on the replica that issued it
        # (another replica, or this one restarted, holds other states) and reveals nothing about
        # this process (not its state counter, not other sessions).
        self._version_key = os.urandom(32)

    def warm(self) -> None:
        """One keyless and one session encode before the first request: the first of each loads
        what their paths import lazily (pyarrow's numpy conversion imports pandas), which cost the
        first client about 0.2-0.3 s each here. The session is a random tenant's, then dropped."""
        key = session_key("warm-up", os.urandom(16).hex())
        self.core.encode_routed(self.router.decide("warm-up"), "warm-up", None, True)
        try:
            self._session(self.router.session_route(), key, "warm-up", True)
        finally:
            self.sessions.drop_session(key)

    # -- the handle API (model composition): the same JSON bodies as HTTP ------------------------------
    async def tokenize(self, body: dict) -> dict:
        out, _ = await self.tokenize_body(body)
        out["tokens"] = out["tokens"].tolist()
        return out

    async def detokenize(self, body: dict) -> dict:
        out, _ = await self.detokenize_body(body)
        return out

    # -- HTTP ------------------------------------------------------------------------------------------
    async def http(self, endpoint: str, content_length: "str | None",
                   chunks: AsyncIterable[bytes]) -> "tuple[int, bytes, dict[str, str]]":
        """One HTTP request: (status, JSON body, headers). A client error is a 4xx with a message,
        an internal one a 500 with a reference id (details only in the log)."""
        detok = endpoint == "detokenize"
        handler: Callable = self.detokenize_body if detok else self.tokenize_body
        limit = self.max_detokenize_bytes if detok else self.max_body
        status = 200
        self.inflight += 1
        try:
            # Refused unread: a body is never parsed, nor even read, past its endpoint's limit.
            if content_length is not None and content_length.isdigit() and int(content_length) > limit:
                raise BadRequest(f"body of {content_length} bytes exceeds the limit of {limit} for /{endpoint}", 413)
            parts = await self.read_body(chunks, limit)
            # CPU-heavy steps of a large body (parse, chat rendering, serialization) run off the
            # event loop, so one 3 MiB chat does not stall every other request on this replica.
            big = sum(map(len, parts)) > OFF_LOOP_BYTES
            parse = functools.partial(self._parse_body, detok, parts)
            body = await asyncio.to_thread(parse) if big else parse()
            del parts, parse
            result, where = await handler(body)
            tokens = result.get("tokens")
            many = tokens is not None and len(tokens) > MANY_TOKENS
            data = await asyncio.to_thread(dumps_json, result) if big or many else dumps_json(result)
            # Where the request ran: this replica, and whether its session was held here
            # ("held"), started here ("new") or is served without state ("-").
            return 200, data, {"x-delta-ray-replica": self.replica_id, "x-delta-ray-session": where or "-"}
        except BadRequest as exc:
            status = exc.status
            return status, _error(str(exc), "BadRequestError", status), {}
        except (ChatTemplateError, ValueError, TypeError) as exc:
            status = 400
            return 400, _error(str(exc), "BadRequestError", 400), {}
        except RecursionError:
            status = 400
            return 400, _error("the request is nested too deeply", "BadRequestError", 400), {}
        except Exception:  # noqa: BLE001 - this request alone fails; internals stay in the log
            status = 500
            ref = uuid.uuid4().hex[:12]
            log.exception("internal error on /%s (ref %s)", endpoint, ref)
            return 500, _error(f"internal error (ref {ref})", "InternalServerError", 500), {}
        finally:
            self.inflight -= 1
            self._record.record_http(endpoint, status)

    @staticmethod
    async def read_body(chunks: AsyncIterable[bytes], limit: int) -> "list[bytes]":
        """The body's chunks, refused with 413 as soon as they stream past ``limit`` bytes (a
        chunked upload has no Content-Length to refuse it by)."""
        parts, size = [], 0
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise BadRequest(f"body exceeds the limit of {limit} bytes", 413)
            parts.append(chunk)
        return parts

    def _parse_body(self, detok: bool, parts: "list[bytes]") -> Any:
        """The JSON body, its items bounded before any parse holds the GIL (``request_body.py``)."""
        raw = parts[0] if len(parts) == 1 else b"".join(parts)
        if detok:
            return parse_id_body(raw, self.max_detokenize, self.max_json_items)
        return parse_bounded(raw, self.max_json_items)

    # -- /detokenize -----------------------------------------------------------------------------------
    async def detokenize_body(self, body: Any) -> "tuple[dict, str]":
        # The size check is O(1) on the loop; the per-ID validation and the decode are O(n) and run
        # in a thread for long lists (8M IDs held a replica's loop for over a second).
        n = detokenize_size(body, self.max_detokenize)
        if n > OFF_LOOP_IDS:
            return {"prompt": await asyncio.to_thread(self._detokenize, body)}, ""
        return {"prompt": self._detokenize(body)}, ""

    def _detokenize(self, body: Any) -> str:
        return self._decode(parse_detokenize(body, self.served, self.vocab_size), True)

    # -- /tokenize -------------------------------------------------------------------------------------
    async def tokenize_body(self, body: Any) -> "tuple[dict, str]":
        # Validation walks the message list (and the body's keys): in a thread when they are many.
        req = await self._off_loop_if(_many_items(body), parse_tokenize, body, self.served)
        if self.require_tenant and req.tenant is None:
            raise BadRequest("this service requires a tenant: give 'cache_salt'", 400)
        if req.append is not None:
            return await self._append_request(req)
        text = await self._text(req)
        add = bool(req.add_special_tokens)
        key = None if req.session is None else session_key(req.session, req.tenant)
        where, version = "", None
        route = self.router.decide(text, key, busy=self.inflight > self.overflow_inflight)
        if route is POOL:
            # Long keyless texts in chunks on the pool's workers; overflow while this replica is busy.
            # The tenant goes along: what the pool reuses by content stays inside it.
            arr = await self.pool.encode_async(text, add_special_tokens=add, tenant=req.tenant)
            tokens = ids_to_numpy(arr)
            self._record.record_path("serve_pool")
        elif route is HERE or route is UNADMITTED:
            tokens = await self._off_loop_if(not self._on_loop(len(text), text), self.core.encode_routed,
                                             route, text, None, add)
        elif route is CONTENT:
            # Keyless long prompts continue the conversation they extend (_core/keyless.py), always
            # inside the caller's tenant, so one tenant's timing can never reveal another's text.
            # The lookup compares stored texts: on the loop only for a text the loop may encode.
            if self._on_loop(len(text), text):
                tokens, where = self._keyless(text, req.tenant, add, on_loop=True) or await asyncio.to_thread(
                    self._keyless, text, req.tenant, add)
            else:
                tokens, where = await asyncio.to_thread(self._keyless, text, req.tenant, add)
            if where:
                self._record.record_path(f"serve_session_{where}")
            if req.tenant is None:  # content every tenantless client shares: held/new is no client's to read
                where = ""
        else:
            tokens, where, version = await self._off_loop_if(
                not self._on_loop(len(text), text) or self._locks.busy(key), self._session, route, key, text, add)
            self._record.record_path(f"serve_session_{where}")
        out: dict[str, Any] = {"count": int(len(tokens)), "max_model_len": self.max_model_len, "tokens": tokens}
        if version is not None:
            out["session_version"] = version
        if req.return_token_strs:
            out["token_strs"] = await self._off_loop_if(len(tokens) > OFF_LOOP_IDS, self._token_strs, tokens)
        return out, where

    async def _text(self, req: TokenizeRequest) -> str:
        if req.messages is None:
            return req.prompt
        if self.template is None:
            raise BadRequest("this tokenizer has no chat template: send 'prompt'")
        # Always in a thread: a few messages can carry megabytes, and so can the tools.
        return await asyncio.to_thread(self._render, req)

    def _render(self, req: TokenizeRequest) -> str:
        return self.template.render(req.messages, add_generation_prompt=req.add_generation_prompt, tools=req.tools,
                                    **req.chat_template_kwargs)

    def _on_loop(self, chars: int, text: str, stored: int = 0) -> bool:
        """Whether work of ``chars`` characters (``text`` the new ones, ``stored`` the rest: a
        session's text after its last checkpoint) is bounded enough for the event loop: at most the
        reference's budget, or the fast engine's where it encodes all of it (the fast tier in use,
        its guard allowing the new text, the stored part within the reference's budget: a guarded
        code point there costs at most that much of the reference). Anything else runs in a thread."""
        if chars <= OFF_LOOP_CHARS_REFERENCE:
            return True
        return chars <= OFF_LOOP_CHARS and stored <= OFF_LOOP_CHARS_REFERENCE and self.core.fast_allows(text)

    @staticmethod
    async def _off_loop_if(cond: bool, fn: Callable, *args):
        return await asyncio.to_thread(fn, *args) if cond else fn(*args)

    def _token_strs(self, tokens: np.ndarray) -> list:
        return [self.id_to_token(t) for t in tokens.tolist()]

    def _keyless(self, text: str, tenant: "str | None", add: bool,
                 on_loop: bool = False) -> "tuple[np.ndarray, str] | None":
        """A keyless text's IDs through the conversation it continues (or a new one), and
        "held"/"new" ("": too short to be kept, encoded stateless). ``on_loop``: None instead of
        waiting for a key another request holds (the caller then runs this in a thread)."""
        choice = self.sessions.choose_keyless(text, tenant)
        if choice is None:
            return self.core.encode_routed(self.router.in_passing(), text, None, add), ""
        if on_loop and self._locks.busy(choice.key):
            return None
        ids, where, _ = self._session(self.router.session_route(), choice.key, text, add)
        return ids, where

    def _session(self, route: Route, key: str, text: str, add: bool) -> "tuple[np.ndarray, str, str | None]":
        """A whole-text turn of a session (``route``: its turn, or the reference's when unadmitted):
        its IDs, "held"/"new", and the version it leaves."""
        with self._locks.hold(key):
            where = "held" if self.sessions.has_session(key) else "new"
            ids = self.core.encode_routed(route, text, key, add)
            return ids, where, self._version_of(key, add)

    # -- append: only the delta travels in, only the IDs that changed travel out --------------------------
    def _version(self, key: str, state_version: int, add: bool) -> str:
        """The ``session_version`` of a held state as answered with ``add_special_tokens=add``: a
        keyed digest, so a version is valid only here, for this key, state and flag."""
        h = hashlib.blake2b(key=self._version_key, digest_size=16, person=b"delta-ray-sver")
        h.update(b"%d:%d:" % (add, state_version))
        h.update(key.encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def _version_of(self, key: str, add: bool) -> "str | None":
        state = self.sessions.store.get(key)
        return None if state is None else self._version(key, state.version, add)

    async def _append_request(self, req: TokenizeRequest) -> "tuple[dict, str]":
        key = session_key(req.session, req.tenant)  # an append names its session (parse_tokenize checks)
        # By work, not by the delta's size: a turn re-encodes everything after the stored state's
        # last checkpoint, which a long run without a safe cut can put megabytes back.
        chars = self.sessions.turn_chars(key, len(req.append))
        big = not self._on_loop(chars, req.append, chars - len(req.append)) or self._locks.busy(key)
        try:
            start, count, tail, version = await self._off_loop_if(
                big, self._append, key, req.session, req.append, req.add_special_tokens, req.session_version)
        except SessionNotFound as exc:
            raise BadRequest(f"{exc}", 409) from None
        self._record.record_path("serve_append")
        return {"count": count, "max_model_len": self.max_model_len, "start": start, "tokens": tail,
                "session_version": version}, "held"

    def _append(self, key: str, name: str, delta: str, add: "bool | None",
                claimed: str) -> "tuple[int, int, np.ndarray, str | None]":
        """Extend the held session by ``delta`` if it is the state ``claimed`` names: (start, count,
        IDs from start on, the new version), where the session's IDs are the answer that named
        ``claimed`` cut to ``start`` followed by the tail.

        Messages name the session by the client's own id, ``name``: ``key`` carries the tenant's
        ``cache_salt``, which no answer or log line may show."""
        not_held = (f"session {name!r} is not held here (unknown, evicted or moved to this replica): "
                    "send the whole text with 'prompt'")
        with self._locks.hold(key):
            state = self.sessions.store.get(key)
            if state is None:
                raise SessionNotFound(not_held)
            add = self._check_version(key, name, state.version, add, claimed)
            try:
                if self.router.session_route() is REFERENCE_SESSION:  # unadmitted: the reference, whole answer
                    ids = self.sessions.extend(key, delta, add).to_numpy()
                    return 0, len(ids), ids, self._version_of(key, add)
                # expect_version: refused if the state changed since it was checked (it cannot under
                # the key lock, but the store is shared with nothing else only by convention)
                version, k, tail = self.sessions.encode_session_delta(key, None, known_version=state.version,
                                                                   delta=delta, expect_version=state.version)
            except SessionNotFound:  # evicted meanwhile; the core's message names the key, salt and all
                raise SessionNotFound(not_held) from None
        tail = np.asarray(tail, dtype=np.int32)
        template = self.core.template.when(add)
        return template.start(k), template.count(k + len(tail)), template.tail(k, tail), \
            self._version(key, version, add)

    def _check_version(self, key: str, name: str, state_version: int, add: "bool | None", claimed: str) -> bool:
        """The flag the append runs with, if ``claimed`` names the held state; else 409 (another
        state: resend the whole text) or 400 (the same state, answered with the other flag)."""
        for flag in ((True, False) if add is None else (add,)):
            if hmac.compare_digest(_b(claimed), _b(self._version(key, state_version, flag))):
                return flag
        if add is not None and hmac.compare_digest(_b(claimed), _b(self._version(key, state_version, not add))):
            raise BadRequest(f"add_special_tokens={str(add).lower()} differs from this session's "
                             f"({str(not add).lower()}): IDs with and without the template cannot be spliced", 400)
        raise SessionNotFound(f"session {name!r} here is not the state 'session_version' names (a turn served "
                              "elsewhere, a retried append, or a restart): send the whole text with 'prompt'")


def _many_items(body: Any) -> bool:
    """Whether validating ``body`` walks more than a few dozen items (O(1) to tell)."""
    if not isinstance(body, dict):
        return False
    messages = body.get("messages")
    return len(body) > len(TOKENIZE_FIELDS) or (isinstance(messages, list) and len(messages) > MANY_MESSAGES)


def _b(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


def _error(message: str, kind: str, status: int) -> bytes:
    return dumps_json({"error": {"message": message, "type": kind, "code": status}})
