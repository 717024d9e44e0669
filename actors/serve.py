"""Ray Serve: delta-ray as an HTTP service and as a deployment other deployments call.

``serve_app(tokenizer, **options)`` returns an application for ``serve.run``. Its HTTP API is that
of vLLM's and SGLang's OpenAI-compatible servers (``POST /tokenize``, ``POST /detokenize``,
``GET /health``), so existing clients work; a ``DeploymentHandle`` can call ``tokenize`` and
``detokenize`` with the same JSON bodies (model composition).

Sessions are served where they arrive: every replica holds a :class:`DeltaTokenizer` with its
sessions in process, and the deployment's request router (``serve_router.SessionRouter``) sends
a session's requests to the replica that holds it, by the ``x-session-id`` header
(:func:`routing_headers`). There is no second hop on a session turn. A pool (``pool_name`` or
``num_workers``) takes what one replica should not do alone: long keyless texts, cut into chunks
that run on its workers and tasks, and keyless overflow while the replica is busy.
"""

import json
import time
from typing import Any

from delta_ray.loading import TokenizerLike, load_tokenizer

from .serve_handler import DEFAULT_MAX_BODY_BYTES, RequestHandler  # noqa: F401 - re-exported
from .serve_router import SESSION_HEADER, SessionRouter, routing_headers  # noqa: F401 - re-exported

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

    Each replica encodes in process (a ``DeltaTokenizer`` with ``threads`` threads for chunks,
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
    if options.get("reuse", "session") == "content":
        # The tokenizer's own content reuse knows no tenants: one index for every caller would be a
        # cross-tenant timing oracle. Serve reuses keyless prompts by content per tenant itself.
        raise ValueError("serve_app does not take reuse='content': keyless prompts are already reused by "
                         "content, inside each tenant (cache_salt)")
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
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
            from delta_ray.tokenizer import DeltaTokenizer

            loaded = LoadedTokenizer.from_bytes(config_bytes, expected_digest=digest)
            core_options = dict(core_options or {})
            delta = DeltaTokenizer(loaded, threads=threads, **core_options)
            self.pool = None
            if pool_name:
                from .pool import TokenizerPool
                self.pool = TokenizerPool.connect(pool_name, pool_secret)
            elif num_workers:
                from .pool import TokenizerPool
                self.pool = TokenizerPool(loaded, num_workers=num_workers, **pool_options)
            try:
                from ray import serve as _serve
                replica_id = _serve.get_replica_context().replica_id.unique_id
            except Exception:  # noqa: BLE001 - outside a replica (unit use)
                replica_id = ""
            self.handler = RequestHandler(
                loaded, delta, template=ChatTemplate.from_config(chat_config), pool=self.pool, served={model_name},
                max_body_bytes=max_body_bytes, max_model_len=max_model_len, require_tenant=require_tenant,
                pool_min_chars=pool_min_chars, overflow_inflight=overflow_inflight or 2 * (threads or 2),
                replica_id=replica_id)

        def __del__(self):
            try:
                if self.pool is not None:
                    self.pool.close()
            except Exception:  # noqa: BLE001
                pass

        # -- handle API (model composition): same JSON bodies as HTTP ------------------------
        async def tokenize(self, body: dict) -> dict:
            return await self.handler.tokenize(body)

        async def detokenize(self, body: dict) -> dict:
            return await self.handler.detokenize(body)

        # -- HTTP ----------------------------------------------------------------------------
        @app.get("/health")
        async def health(self):
            return Response(status_code=200)

        @app.post("/tokenize")
        async def tokenize_http(self, request: Request):
            return await self._http("tokenize", request)

        @app.post("/detokenize")
        async def detokenize_http(self, request: Request):
            return await self._http("detokenize", request)

        async def _http(self, endpoint: str, request: Request):
            status, data, headers = await self.handler.http(endpoint, request.headers.get("content-length"),
                                                            request.stream())
            return Response(data, status_code=status, media_type="application/json", headers=headers)

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
