"""Ray Serve: delta-ray as an HTTP service and as a deployment other deployments call.

``serve_app(tokenizer, **options)`` returns an application for ``serve.run``. Its HTTP API is that
of vLLM's and SGLang's OpenAI-compatible servers (``POST /tokenize``, ``POST /detokenize``,
``GET /health``), so existing clients work; a ``DeploymentHandle`` can call ``tokenize`` and
``detokenize`` with the same JSON bodies (model composition).

Sessions are served where they arrive: every replica holds a :class:`~delta_ray._tokenizer_core.TokenizerCore` with its
sessions in process, and the deployment's request router (``serve_router.SessionRouter``) sends
a session's requests to the replica that holds it, by the ``x-session-id`` header
(:func:`routing_headers`). There is no second hop on a session turn. A pool (``pool_name`` or
``num_workers``) takes what one replica should not do alone: long keyless texts, cut into chunks
that run on its workers and tasks, and keyless overflow while the replica is busy.

A replica answers with the Ray-free handler and ASGI app of ``delta_ray/server``; on one
machine ``delta-ray serve --local`` runs the same two in one process without Ray. Serve is the
path for replicas, nodes, autoscaling and a pool.
"""

import time
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from delta_ray._core.loading import LoadedTokenizer, TokenizerLike
from delta_ray._runtime.heap import freeze_heap
from delta_ray.server.asgi import TokenizerASGI
from delta_ray.server.serve_config import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DETOKENIZE_TOKENS,
    DEFAULT_MAX_JSON_ITEMS,
    ServeConfig,
)
from delta_ray.server.service import build_handler, service_spec

from . import metrics
from .pool import TokenizerPool
from .serve_router import SessionRouter

# Serve settings read by each replica process at import (Ray 2.60; RAY_SERVE_THROUGHPUT_OPTIMIZED sets
# the same ones cluster-wide): no hop between Serve's loop and a user-code thread per request,
# request-path logs buffered, no per-request log line to stderr.
FAST_REPLICA_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
                    "RAY_SERVE_LOG_TO_STDERR": "0"}


@serve.deployment
@serve.ingress()
class TokenizerService:
    """One replica: a :class:`~delta_ray._tokenizer_core.TokenizerCore` with its sessions, an optional pool, and
    the Ray-free :class:`~delta_ray.server.serve_handler.RequestHandler` that answers requests.

    Built by :func:`serve_app` (deployment options, the tokenizer's bytes, its chat config and a
    :class:`ServeConfig`); this class only binds the handler to Serve: its HTTP ingress is the
    same ASGI app the one-process server runs (``server/asgi.py``), built over this replica's
    handler, and its handle methods take the same JSON bodies.
    """

    def __init__(self, config_bytes: bytes, digest: str, chat_config: "dict | None", config: ServeConfig):
        loaded = LoadedTokenizer.from_bytes(config_bytes, expected_digest=digest)
        self.pool = None
        if config.pool_name:
            self.pool = TokenizerPool.connect(config.pool_name, config.pool_secret)
        elif config.pool is not None:
            self.pool = TokenizerPool(loaded, config.pool)
        try:
            replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - outside a replica (unit use)
            replica_id = ""
        self.handler = build_handler(loaded, chat_config, config, pool=self.pool, replica_id=replica_id,
                                     record=metrics)
        freeze_heap()  # a replica's process is ours: its full collections skip what set-up built

    def __serve_build_asgi_app__(self) -> TokenizerASGI:
        """The replica's HTTP ingress (Serve calls it after ``__init__``): the shared ASGI app over
        this replica's handler; its metrics go to Ray's export, so no ``/metrics`` route here."""
        return TokenizerASGI(self.handler)

    def __del__(self):
        try:
            if self.pool is not None:
                self.pool.close()
        except Exception:  # noqa: BLE001
            pass

    # -- handle API (model composition): the same JSON bodies as HTTP -----------------------------------
    async def tokenize(self, body: dict) -> dict:
        return await self.handler.tokenize(body)

    async def detokenize(self, body: dict) -> dict:
        return await self.handler.detokenize(body)


def serve_app(tokenizer: TokenizerLike, *, model_name: "str | None" = None, pool_name: "str | None" = None,
              num_workers: "int | None" = None, num_replicas: int = 1, autoscaling_config: "dict | None" = None,
              max_ongoing_requests: int = 32, session_routing: bool = True, num_fallback_replicas: int = 1,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_model_len: "int | None" = None,
              tokenizer_config: Any = None, replica_cpus: float = 0.25, threads: "int | None" = None,
              require_tenant: bool = False, pool_secret: "str | None" = None, pool_min_chars: "int | None" = None,
              overflow_inflight: "int | None" = None, fast_replica: bool = True,
              max_detokenize_tokens: int = DEFAULT_MAX_DETOKENIZE_TOKENS, max_json_items: int = DEFAULT_MAX_JSON_ITEMS,
              **options: Any):
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
    tenant, never names shared by all callers. Request limits, each a 413 with a message:
    ``max_body_bytes`` per body, ``max_detokenize_tokens`` IDs per /detokenize (whose body may
    take 16 bytes an ID), ``max_json_items`` JSON values and keys per body, counted before it is
    parsed (a parse holds the replica's event loop however it is threaded). Other keyword arguments are
    :class:`~delta_ray._core.config.TokenizerConfig` fields (``chunk_size``, ``cut_threshold``, ``engine``,
    ...: the replica's tokenizer and the pool's workers; ``max_session_bytes`` and ``max_sessions``
    only the replica's) or, with ``num_workers``, :class:`~delta_ray._core.config.PoolConfig` fields; any
    other name is a TypeError. They are validated here, once, into a :class:`ServeConfig`.

    ``fast_replica`` (default) trims Serve's per-request work in the replicas: user code on the
    replica's own event loop (``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0``: the handlers only
    await, heavy steps run in threads), buffered request-path logs and no access log lines.
    """
    spec = service_spec(
        tokenizer, options, model_name=model_name, tokenizer_config=tokenizer_config, max_model_len=max_model_len,
        threads=threads, num_workers=num_workers, pool_name=pool_name, pool_secret=pool_secret,
        max_body_bytes=max_body_bytes, require_tenant=require_tenant, pool_min_chars=pool_min_chars,
        overflow_inflight=overflow_inflight, max_detokenize_tokens=max_detokenize_tokens, max_json_items=max_json_items)
    deployment = TokenizerService.options(**_deployment_options(
        replica_cpus=replica_cpus, max_ongoing_requests=max_ongoing_requests, fast_replica=fast_replica,
        num_replicas=num_replicas, autoscaling_config=autoscaling_config, session_routing=session_routing,
        num_fallback_replicas=num_fallback_replicas))
    return deployment.bind(spec.loaded.config_bytes, spec.loaded.digest, spec.chat_config, spec.config)


def _deployment_options(*, replica_cpus: float, max_ongoing_requests: int, fast_replica: bool, num_replicas: int,
                        autoscaling_config: "dict | None", session_routing: bool,
                        num_fallback_replicas: int) -> dict[str, Any]:
    """Serve's options for the deployment (resources, scaling, the session router, replica settings)."""
    options: dict[str, Any] = {"ray_actor_options": {"num_cpus": replica_cpus},
                               "max_ongoing_requests": max_ongoing_requests}
    if fast_replica:
        options["ray_actor_options"]["runtime_env"] = {"env_vars": dict(FAST_REPLICA_ENV)}
        options["logging_config"] = {"enable_access_log": False}
    if autoscaling_config is not None:
        options["autoscaling_config"] = autoscaling_config
    else:
        options["num_replicas"] = num_replicas
    if session_routing:
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=SessionRouter, request_router_kwargs={"num_fallback_replicas": num_fallback_replicas})
    return options


def replica_endpoints(app_name: str, timeout_s: float = 30.0) -> "list[tuple[str, int, str]]":
    """``(node ip, port, replica id)`` of each running replica of ``app_name`` under direct ingress.

    A replica listens on the ``http_options`` host (``serve.start``), which may be loopback rather
    than the node's address.

    With ``RAY_SERVE_ENABLE_DIRECT_INGRESS=1`` in the environment of the process that starts Ray
    (Ray 2.60), every ingress replica listens for HTTP itself (ports from 30000) and no proxy
    stands in between: a client or load balancer routes sessions by :func:`rendezvous_order` of
    the routing key (``tenant_keys.routing_key``, the ``x-session-id`` value) over these replica
    ids, the same order the in-cluster router uses. This reads
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
