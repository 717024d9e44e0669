"""``delta-ray serve``: the HTTP tokenization service, in this process (``--local``) or on Ray Serve.

``--local`` runs it on uvicorn in this process without importing Ray (one machine); without it the
command starts (or joins) Ray and runs ``serve_app`` (replicas, autoscaling, a pool, direct
ingress). Both serve the same API with the same handler.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from ..server.serve_config import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CLIENT_INFLIGHT_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_INFLIGHT_BYTES,
)
from .bundled import BUNDLED, bundled_tokenizer_config, bundled_tokenizer_path

# Options only Ray Serve has: refused with --local, which runs one process
RAY_ONLY = {"workers": None, "replicas": 1, "autoscale": None, "direct_ingress": False}
# Options only the one-process server has (on Serve its proxy holds connections, Ray exports metrics):
# refused without --local. flag -> run_local's option
LOCAL_ONLY = {"metrics": "metrics", "max_connections": "max_connections", "max_header_bytes": "max_header_bytes",
              "header_timeout": "header_timeout_s", "max_inflight_bytes": "max_inflight_bytes",
              "max_client_inflight_bytes": "max_client_inflight_bytes"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", required=True, help="tokenizer.json, a directory holding one, or a bundled name")
    p.add_argument("--local", action="store_true",
                   help="serve from this process on uvicorn, without Ray (one machine: no proxy hop per request)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default; the service has no auth)")
    p.add_argument("--require-tenant", action="store_true", help="refuse /tokenize requests without cache_salt")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--threads", type=int, default=None,
                   help="threads per process (replica) for long texts' pieces (default: the CPU count)")
    p.add_argument("--workers", type=int, default=None,
                   help="Ray: pool workers per replica for long keyless texts and overflow (default: no pool)")
    p.add_argument("--replicas", type=int, default=1, help="Ray: Serve replicas (sessions routed by x-session-id)")
    p.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                   help="Ray: autoscale between MIN and MAX replicas instead of --replicas")
    p.add_argument("--direct-ingress", action="store_true",
                   help="Ray: replicas listen for HTTP themselves, no proxy (Ray 2.60 RAY_SERVE_ENABLE_DIRECT_INGRESS; "
                        "only when this command starts Ray; replica ports from 30000)")
    p.add_argument("--model-name", default=None, help="the name clients send as 'model'")
    p.add_argument("--max-body-bytes", type=int, default=None)
    local = p.add_argument_group("--local limits (defaults in delta_ray/server/serve_config.py; docs/serving.md)")
    local.add_argument("--metrics", action="store_true",
                       help="serve the request counters at GET /metrics (they tell held from new content: keep the "
                            "port behind your network)")
    local.add_argument("--max-connections", type=int, default=None, metavar="N",
                       help="open connections; the next is answered 503 and closed "
                            f"(default {DEFAULT_MAX_CONNECTIONS})")
    local.add_argument("--max-header-bytes", type=int, default=None, metavar="BYTES",
                       help="a request's line and headers; more is a 431 "
                            f"(default {DEFAULT_MAX_HEADER_BYTES >> 10} KiB)")
    local.add_argument("--header-timeout", type=float, default=None, metavar="S",
                       help="seconds for a request's line and headers to arrive; else a 408 "
                            f"(default {DEFAULT_HEADER_TIMEOUT_S:g})")
    local.add_argument("--max-inflight-bytes", type=int, default=None, metavar="BYTES",
                       help="body bytes all requests in progress hold; past it a 503 "
                            f"(default {DEFAULT_MAX_INFLIGHT_BYTES >> 20} MiB, or one client's if larger)")
    local.add_argument("--max-client-inflight-bytes", type=int, default=None, metavar="BYTES",
                       help="body bytes one client address's requests in progress hold; past it a 429 "
                            f"(default {DEFAULT_MAX_CLIENT_INFLIGHT_BYTES >> 20} MiB, or --max-body-bytes if larger)")


def _autoscaling(spec: "str | None") -> "dict | None":
    if not spec:
        return None
    lo, _, hi = spec.partition(":")
    return {"min_replicas": int(lo), "max_replicas": int(hi or lo), "target_ongoing_requests": 4}


def run(args: argparse.Namespace) -> int:
    tok, cfg = args.tokenizer, None
    if tok in BUNDLED and not os.path.exists(tok):
        tok, cfg = bundled_tokenizer_path(tok), bundled_tokenizer_config(args.tokenizer)
    if not os.path.exists(tok):
        print(f"delta-ray serve: no tokenizer at {tok!r}")
        return 2
    common = {"model_name": args.model_name or args.tokenizer, "tokenizer_config": cfg, "threads": args.threads,
              "max_body_bytes": args.max_body_bytes or DEFAULT_MAX_BODY_BYTES, "require_tenant": args.require_tenant}
    if args.local:
        return _run_local(args, tok, common)
    return _run_serve(args, tok, common)


def _run_local(args: argparse.Namespace, tok: str, common: dict) -> int:
    ray_only = [f"--{k.replace('_', '-')}" for k, default in RAY_ONLY.items() if getattr(args, k) != default]
    if ray_only:
        print(f"delta-ray serve --local: {', '.join(ray_only)} need Ray Serve (run without --local)", file=sys.stderr)
        return 2
    from ..server.local import run_local  # lazy: uvicorn, for --local only
    limits = {option: getattr(args, flag) for flag, option in LOCAL_ONLY.items()
              if getattr(args, flag) not in (None, False)}
    print(f"delta-ray serving {args.tokenizer} on http://{args.host}:{args.port} from this process, without Ray "
          "(Ctrl-C to stop)", flush=True)
    run_local(tok, args.host, args.port, **common, **limits)
    return 0


def _run_serve(args: argparse.Namespace, tok: str, common: dict) -> int:
    local_only = [f"--{k.replace('_', '-')}" for k in LOCAL_ONLY if getattr(args, k) not in (None, False)]
    if local_only:
        print(f"delta-ray serve: {', '.join(local_only)} are the one-process server's (--local); on Ray Serve "
              "its proxy holds the connections and Ray exports the metrics", file=sys.stderr)
        return 2
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    import ray  # the Ray path only: --local never imports it
    from ray import serve

    # lazy: the Ray glue, for the Ray path only
    from delta_ray.actors.local_ray import local_init_kwargs
    from delta_ray.actors.serve import replica_endpoints, serve_app

    if args.direct_ingress:
        os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "1"  # read by the Serve controller and replicas
    joined = bool(os.environ.get("RAY_ADDRESS"))
    if not ray.is_initialized():
        if joined:
            ray.init(address=os.environ["RAY_ADDRESS"])
        else:
            ray.init(**local_init_kwargs(metrics=True))  # the service's metrics are scraped (README)
    serve.start(http_options={"host": args.host, "port": args.port})
    app = serve_app(tok, num_workers=args.workers, num_replicas=args.replicas,
                    autoscaling_config=_autoscaling(args.autoscale), **common)
    serve.run(app, name="delta-ray", route_prefix="/")
    print(f"delta-ray serving {args.tokenizer} on http://{args.host}:{args.port} (Ray Serve; Ctrl-C to stop)",
          flush=True)
    if not joined and all(getattr(args, k) == default for k, default in RAY_ONLY.items()):
        print("  one replica on this machine: `delta-ray serve --local` serves the same API from one process "
              "without Ray's proxy hop per request", flush=True)
    if args.direct_ingress:
        for _, port, rid in replica_endpoints("delta-ray"):
            print(f"  replica {rid}: http://{args.host}:{port} (direct ingress)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
    return 0
