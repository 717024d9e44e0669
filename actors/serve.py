"""Ray Serve: delta-ray as an HTTP service and as a deployment other deployments call.

``serve_app(tokenizer, **options)`` returns an application for ``serve.run``. Its HTTP API is that
of vLLM's and SGLang's OpenAI-compatible servers (``POST /tokenize``, ``POST /detokenize``,
``GET /health``), so existing clients work; a ``DeploymentHandle`` can call ``tokenize`` and
``detokenize`` with the same JSON bodies (model composition).

Sessions are served where they arrive: every replica holds a :class:`~delta_ray.tokenizer.TokenizerCore` with its
sessions in process, and the deployment's request router (``serve_router.SessionRouter``) sends
a session's requests to the replica that holds it, by the ``x-session-id`` header
(:func:`routing_headers`). There is no second hop on a session turn. A pool (``pool_name`` or
``num_workers``) takes what one replica should not do alone: long keyless texts, cut into chunks
that run on its workers and tasks, and keyless overflow while the replica is busy.
"""

import asyncio
import functools
import json
import logging
import time
import uuid
from typing import Any

import numpy as np

from delta_ray import constants as C
from delta_ray.loading import TokenizerLike, load_tokenizer
from delta_ray.session_store import SessionNotFound

from . import metrics
from .http_api import (BadRequest, content_session_key, dumps_json, loads_json, parse_detokenize, parse_tokenize,
                       session_key)
from .serve_router import SESSION_HEADER, SessionRouter, routing_headers  # noqa: F401 - re-exported

log = logging.getLogger("delta_ray.serve")
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
OFF_LOOP_BYTES = 256 * 1024  # bodies larger than this are parsed and serialized in a thread
OFF_LOOP_CHARS = 128 * 1024  # session texts longer than this are encoded in a thread
MANY_TOKENS = 65536  # answers with more IDs than this are serialized in a thread
# Serve settings read by each replica process at import (Ray 2.60; RAY_SERVE_THROUGHPUT_OPTIMIZED sets
# the same ones cluster-wide): no hop between Serve's loop and a user-code thread per request,
# request-path logs buffered, no per-request log line to stderr.
FAST_REPLICA_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
                    "RAY_SERVE_LOG_TO_STDERR": "0"}


def _chat_config(tokenizer: Any, tokenizer_config: Any) -> "dict | None":
    """The tokenizer_config.json to take the chat template from (explicit, beside the file, or bundled)."""
    from pathlib import Path

    if isinstance(tokenizer_config, dict):
        return tokenizer_config
    candidates = []
    if tokenizer_config is not None:
        candidates.append(Path(tokenizer_config))
    if isinstance(tokenizer, (str, Path)):
        p = Path(tokenizer)
        candidates.append((p if p.is_dir() else p.parent) / "tokenizer_config.json")
    for c in candidates:
        c = c / "tokenizer_config.json" if c.is_dir() else c
        if c.exists():
            return json.loads(c.read_text(encoding="utf-8"))
    return None


_CORE_OPTIONS = ("chunk_size", "cut_threshold", "max_chunks", "engine", "shadow_rate", "max_session_bytes",
                 "max_sessions")


def serve_app(tokenizer: TokenizerLike, *, model_name: "str | None" = None, pool_name: "str | None" = None,
              num_workers: "int | None" = None, num_replicas: int = 1, autoscaling_config: "dict | None" = None,
              max_ongoing_requests: int = 32, session_routing: bool = True, num_fallback_replicas: int = 1,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_model_len: "int | None" = None,
              tokenizer_config: Any = None, replica_cpus: float = 0.25, threads: "int | None" = None,
              require_tenant: bool = False, pool_secret: "str | None" = None, pool_min_chars: "int | None" = None,
              overflow_inflight: "int | None" = None, fast_replica: bool = True, **options: Any):
    """A Ray Serve application serving exact tokenization for one tokenizer.

    Each replica encodes in process (a ``TokenizerCore`` with ``threads`` threads for chunks,
    its sessions in memory); ``session_routing`` installs the session request router, so a request
    carrying ``x-session-id`` (:func:`routing_headers`) runs on the replica holding that session
    (rendezvous hashing over CRC-32; ``num_fallback_replicas`` next replicas take it when the
    home's queue is full). ``autoscaling_config`` (Serve's) replaces ``num_replicas``; a session
    that moves re-initializes on its new home from the whole transcript, exactly, and an
    ``append`` to it answers 409 (the client resends the whole transcript).

    A pool takes keyless texts from ``pool_min_chars`` characters (default: ``cut_threshold``) and
    keyless overflow while ``overflow_inflight`` requests run on the replica: ``pool_name``
    attaches to a running named ``TokenizerPool`` (its ``secret.hex()`` in ``pool_secret`` or
    ``$DELTA_RAY_POOL_SECRET``); ``num_workers`` starts one per replica; neither, no pool.
    ``require_tenant`` refuses requests without a ``cache_salt``: session ids are then private to a
    tenant, never names shared by all callers. Other keyword arguments (``chunk_size``,
    ``cut_threshold``, ``max_chunks``, ``engine``, ``shadow_rate``, ``max_session_bytes``,
    ``max_sessions``) configure the replica's tokenizer and the pool; the rest go to the pool.

    ``fast_replica`` (default) trims Serve's per-request work in the replicas: user code on the
    replica's own event loop (``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0``: the handlers only
    await, heavy steps run in threads), buffered request-path logs and no access log lines.
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    loaded = load_tokenizer(tokenizer)
    config = _chat_config(tokenizer, tokenizer_config)
    if max_model_len is None and config:
        mml = config.get("model_max_length")
        max_model_len = mml if isinstance(mml, int) and mml < 10 ** 12 else None
    name = model_name or (loaded.source if loaded.source.startswith("<") else None) or "delta-ray"
    core = {k: options[k] for k in _CORE_OPTIONS if k in options}
    pool_options = {k: v for k, v in options.items() if k not in ("max_session_bytes", "max_sessions")}
    app = FastAPI(title="delta-ray", description="Exact tokenization (vLLM/SGLang-compatible /tokenize)")
    init_args = dict(config_bytes=loaded.config_bytes, digest=loaded.digest, chat_config=config,
                     pool_name=pool_name, num_workers=num_workers, max_body_bytes=max_body_bytes,
                     max_model_len=max_model_len, model_name=name, pool_options=pool_options,
                     require_tenant=require_tenant, pool_secret=pool_secret, core_options=core, threads=threads,
                     pool_min_chars=pool_min_chars, overflow_inflight=overflow_inflight)
    deployment_options: dict[str, Any] = {"ray_actor_options": {"num_cpus": replica_cpus},
                                          "max_ongoing_requests": max_ongoing_requests}
    if fast_replica:
        deployment_options["ray_actor_options"]["runtime_env"] = {"env_vars": dict(FAST_REPLICA_ENV)}
        deployment_options["logging_config"] = {"enable_access_log": False}
    if autoscaling_config is not None:
        deployment_options["autoscaling_config"] = autoscaling_config
    else:
        deployment_options["num_replicas"] = num_replicas
    if session_routing:
        deployment_options["request_router_config"] = RequestRouterConfig(
            request_router_class=SessionRouter, request_router_kwargs={"num_fallback_replicas": num_fallback_replicas})

    @serve.deployment(**deployment_options)
    @serve.ingress(app)
    class TokenizerService:
        def __init__(self, config_bytes, digest, chat_config, pool_name, num_workers, max_body_bytes,
                     max_model_len, model_name, pool_options, require_tenant=False, pool_secret=None,
                     core_options=None, threads=None, pool_min_chars=None, overflow_inflight=None):
            from delta_ray.chat_template import ChatTemplate
            from delta_ray.loading import LoadedTokenizer
            from delta_ray.tokenizer import TokenizerCore

            loaded = LoadedTokenizer.from_bytes(config_bytes, expected_digest=digest)
            core_options = dict(core_options or {})
            self.delta = TokenizerCore(loaded, threads=threads, **core_options)
            self.pool = None
            if pool_name:
                from .pool import TokenizerPool
                self.pool = TokenizerPool.connect(pool_name, pool_secret)
            elif num_workers:
                from .pool import TokenizerPool
                self.pool = TokenizerPool(loaded, num_workers=num_workers, **pool_options)
            self.pool_min_chars = pool_min_chars or core_options.get("cut_threshold", C.CUT_THRESHOLD)
            self.overflow_inflight = overflow_inflight or 2 * (threads or 2)
            self.inflight = 0
            self.require_tenant = require_tenant
            self.tok = loaded.tokenizer
            from delta_ray.reference_api import id_to_token_fn, vocab_size  # 0.x API or tokenizer.json (1.x)
            self.vocab_size = vocab_size(self.tok, loaded.config)
            self.id_to_token = id_to_token_fn(self.tok, loaded.config)
            self.template = ChatTemplate.from_config(chat_config)
            self.max_body = max_body_bytes
            self.max_model_len = max_model_len
            self.served = {model_name}
            adm = self.delta.admission
            self.prefix = np.asarray(adm.prefix_ids, dtype=np.int32)
            self.suffix = np.asarray(adm.suffix_ids, dtype=np.int32)
            try:
                from ray import serve as _serve
                self.replica_id = _serve.get_replica_context().replica_id.unique_id
            except Exception:  # noqa: BLE001 - outside a replica (unit use)
                self.replica_id = ""

        def __del__(self):
            try:
                if self.pool is not None:
                    self.pool.close()
            except Exception:  # noqa: BLE001
                pass

        # -- handle API (model composition): same JSON bodies as HTTP ------------------------
        async def tokenize(self, body: dict) -> dict:
            out, _ = await self._tokenize_body(body)
            out["tokens"] = out["tokens"].tolist()
            return out

        async def _tokenize_body(self, body: dict) -> "tuple[dict, str]":
            req = parse_tokenize(body, self.served)
            if self.require_tenant and req.tenant is None:
                raise BadRequest("this service requires a tenant: give 'cache_salt'", 400)
            return await self._tokenize(req)

        async def detokenize(self, body: dict) -> dict:
            out, _ = await self._detokenize_body(body)
            return out

        async def _detokenize_body(self, body: dict) -> "tuple[dict, str]":
            tokens = parse_detokenize(body, self.served, self.vocab_size)
            if len(tokens) > 65536:
                return {"prompt": await asyncio.to_thread(self.delta.decode, tokens)}, ""
            return {"prompt": self.delta.decode(tokens)}, ""

        # -- HTTP ----------------------------------------------------------------------------
        @app.get("/health")
        async def health(self):
            return Response(status_code=200)

        @app.post("/tokenize")
        async def tokenize_http(self, request: Request):
            return await self._http("tokenize", request, self._tokenize_body)

        @app.post("/detokenize")
        async def detokenize_http(self, request: Request):
            return await self._http("detokenize", request, self._detokenize_body)

        async def _http(self, endpoint: str, request: Request, handler):
            from delta_ray.chat_template import ChatTemplateError
            status = 200
            self.inflight += 1
            try:
                length = request.headers.get("content-length")
                if length is not None and length.isdigit() and int(length) > self.max_body:
                    raise BadRequest(f"body of {length} bytes exceeds the limit of {self.max_body}", 413)
                raw = await self._read_body(request)
                # CPU-heavy steps of a large body (parse, chat rendering, serialization) run off the
                # event loop, so one 3 MiB chat does not stall every other request on this replica.
                big = len(raw) > OFF_LOOP_BYTES
                body = await asyncio.to_thread(loads_json, raw) if big else loads_json(raw)
                del raw
                result, where, *by = await handler(body)
                tokens = result.get("tokens")
                many = tokens is not None and len(tokens) > MANY_TOKENS
                data = await asyncio.to_thread(dumps_json, result) if big or many else dumps_json(result)
                # Where the request ran: this replica, and whether its session was held here
                # ("held"), started here ("new") or is served without state ("-").
                headers = {"x-delta-ray-replica": by[0] if by else self.replica_id, "x-delta-ray-session": where or "-"}
                return Response(data, media_type="application/json", headers=headers)
            except BadRequest as exc:
                status = exc.status
                return JSONResponse({"error": {"message": str(exc), "type": "BadRequestError", "code": status}},
                                    status_code=status)
            except (ChatTemplateError, ValueError, TypeError) as exc:
                status = 400
                return JSONResponse({"error": {"message": str(exc), "type": "BadRequestError", "code": 400}},
                                    status_code=400)
            except RecursionError:
                status = 400
                return JSONResponse({"error": {"message": "the request is nested too deeply", "type": "BadRequestError",
                                               "code": 400}}, status_code=400)
            except Exception:  # noqa: BLE001 - this request alone fails; internals stay in the log
                status = 500
                ref = uuid.uuid4().hex[:12]
                log.exception("internal error on /%s (ref %s)", endpoint, ref)
                return JSONResponse({"error": {"message": f"internal error (ref {ref})",
                                               "type": "InternalServerError", "code": 500}}, status_code=500)
            finally:
                self.inflight -= 1
                metrics.record_http(endpoint, status)

        async def _read_body(self, request: Request) -> bytes:
            """The body, refused with 413 as soon as it streams past the limit (chunked uploads too)."""
            parts, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body:
                    raise BadRequest(f"body exceeds the limit of {self.max_body} bytes", 413)
                parts.append(chunk)
            return parts[0] if len(parts) == 1 else b"".join(parts)

        # -- encoding ------------------------------------------------------------------------
        def _append(self, key: str, delta: str, add: bool) -> "tuple[int, int, np.ndarray]":
            """Extend a held session by ``delta``: (start, count, IDs from start on), where the
            session's IDs are this session's previous answer cut to ``start`` followed by the tail."""
            state = self.delta.store.get(key)
            if state is None:
                raise SessionNotFound(f"session {key!r} is not held here (unknown, evicted or moved to this "
                                      "replica): send the whole text with 'prompt'")
            if self.delta.predicate is None:  # unadmitted configuration: the reference, whole answer
                ids = self.delta.extend(key, delta, add_special_tokens=add).to_numpy()
                return 0, len(ids), ids
            _, k, tail = self.delta.encode_session_delta(key, None, known_version=state.version, delta=delta)
            tail = np.asarray(tail, dtype=np.int32)
            core = k + len(tail)
            if not add or (not len(self.prefix) and not len(self.suffix)):
                return k, core, tail
            if k:
                return k + len(self.prefix), core + len(self.prefix) + len(self.suffix), \
                    np.concatenate([tail, self.suffix])
            return 0, core + len(self.prefix) + len(self.suffix), np.concatenate([self.prefix, tail, self.suffix])

        def _session(self, key: str, text: str, add: bool) -> "tuple[np.ndarray, str]":
            where = "held" if self.delta.has_session(key) else "new"
            ids = self.delta.encode(text, session=key, add_special_tokens=add)
            return ids.to_numpy(), where

        def _stateless(self, text: str, add: bool) -> np.ndarray:
            return self.delta.encode(text, add_special_tokens=add).to_numpy(zero_copy_only=False)

        async def _tokenize(self, req) -> "tuple[dict, str]":
            if req.append is not None:
                # Append over HTTP: only the delta travels in, only the IDs that changed travel out.
                key = session_key(req.session, req.tenant)
                try:
                    if len(req.append) > OFF_LOOP_CHARS:
                        start, count, tail = await asyncio.to_thread(self._append, key, req.append,
                                                                     req.add_special_tokens)
                    else:
                        start, count, tail = self._append(key, req.append, req.add_special_tokens)
                except SessionNotFound as exc:
                    raise BadRequest(f"{exc}", 409) from None
                metrics.record_path("serve_append")
                return {"count": count, "max_model_len": self.max_model_len, "start": start, "tokens": tail}, "held"
            if req.messages is not None:
                if self.template is None:
                    raise BadRequest("this tokenizer has no chat template: send 'prompt'")
                render = functools.partial(self.template.render, req.messages,
                                           add_generation_prompt=req.add_generation_prompt, tools=req.tools,
                                           **req.chat_template_kwargs)
                text = await asyncio.to_thread(render) if len(req.messages) > 64 else render()
            else:
                text = req.prompt
            add = req.add_special_tokens
            key = session_key(req.session, req.tenant)
            where = ""
            if key is None and self.pool is not None and (len(text) >= self.pool_min_chars
                                                          or self.inflight > self.overflow_inflight):
                # Long keyless texts in chunks on the pool's workers; overflow while this replica is busy.
                tokens = (await self.pool.encode_async(text, add_special_tokens=add)).to_numpy(zero_copy_only=False)
                metrics.record_path("serve_pool")
            else:
                if key is None and len(text) * 4 >= C.LOCAL_MAX_BYTES and \
                        len(text.encode("utf-8", "surrogatepass")) >= C.LOCAL_MAX_BYTES:
                    # Keyless long prompts are reused by content, always inside the caller's tenant,
                    # so one tenant's timing can never reveal another's text.
                    from delta_ray.scheduler import content_key
                    key = content_session_key(content_key(text), req.tenant)
                if key is None:
                    tokens = await asyncio.to_thread(self._stateless, text, add) if len(text) > OFF_LOOP_CHARS \
                        else self._stateless(text, add)
                else:
                    tokens, where = await asyncio.to_thread(self._session, key, text, add) \
                        if len(text) > OFF_LOOP_CHARS else self._session(key, text, add)
                    metrics.record_path(f"serve_session_{where}")
            out = {"count": int(len(tokens)), "max_model_len": self.max_model_len, "tokens": tokens}
            if req.return_token_strs:
                out["token_strs"] = [self.id_to_token(int(t)) for t in tokens]
            return out, where

    return TokenizerService.bind(**init_args)


def replica_endpoints(app_name: str, timeout_s: float = 30.0) -> "list[tuple[str, int, str]]":
    """``(node ip, port, replica id)`` of each running replica of ``app_name`` under direct ingress.

    A replica listens on the ``http_options`` host (``serve.start``), which may be loopback rather
    than the node's address.

    With ``RAY_SERVE_ENABLE_DIRECT_INGRESS=1`` in the environment of the process that starts Ray
    (Ray 2.60), every ingress replica listens for HTTP itself (ports from 30000) and no proxy
    stands in between: a client or load balancer routes sessions by :func:`rendezvous_order` of
    the session key over these replica ids, the same order the in-cluster router uses. This reads
    the Serve controller's target groups, a Serve internal (an alpha API in 2.60); returns [] when
    direct ingress is off.
    """
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    deadline = time.monotonic() + timeout_s
    while True:
        groups = ray.get(controller.get_target_groups.remote(app_name))
        # A target's name is the replica's actor name, "SERVE_REPLICA::<app>#<deployment>#<replica id>".
        out = [(t.ip, t.port, t.name.rsplit("#", 1)[-1]) for g in groups
               if str(getattr(g.protocol, "value", g.protocol)).upper() == "HTTP" and g.app_name == app_name
               for t in g.targets]
        if out or time.monotonic() > deadline:
            return out
        time.sleep(0.5)
