"""``delta-ray serve``: start the HTTP tokenization service on a local or running Ray cluster."""
from __future__ import annotations

import argparse
import os
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", required=True, help="tokenizer.json, a directory holding one, or a bundled name")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default; the service has no auth)")
    p.add_argument("--require-tenant", action="store_true", help="refuse /tokenize requests without cache_salt")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=None,
                   help="pool workers per replica for long keyless texts and overflow (default: no pool)")
    p.add_argument("--replicas", type=int, default=1, help="Serve replicas (sessions routed by x-session-id)")
    p.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                   help="autoscale between MIN and MAX replicas instead of --replicas")
    p.add_argument("--direct-ingress", action="store_true",
                   help="replicas listen for HTTP themselves, no proxy (Ray 2.60 RAY_SERVE_ENABLE_DIRECT_INGRESS; "
                        "only when this command starts Ray; replica ports from 30000)")
    p.add_argument("--model-name", default=None, help="the name clients send as 'model'")
    p.add_argument("--max-body-bytes", type=int, default=None)


def _autoscaling(spec: "str | None") -> "dict | None":
    if not spec:
        return None
    lo, _, hi = spec.partition(":")
    return {"min_replicas": int(lo), "max_replicas": int(hi or lo), "target_ongoing_requests": 4}


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    import ray
    from ray import serve

    from delta_ray.actors.local_ray import local_init_kwargs
    from delta_ray.apps.bundled import BUNDLED, bundled_tokenizer_config, bundled_tokenizer_path

    from .serve import serve_app
    from .serve_config import DEFAULT_MAX_BODY_BYTES

    tok, cfg = args.tokenizer, None
    if tok in BUNDLED and not os.path.exists(tok):
        tok, cfg = bundled_tokenizer_path(tok), bundled_tokenizer_config(args.tokenizer)
    if not os.path.exists(tok):
        print(f"delta-ray serve: no tokenizer at {tok!r}")
        return 2
    if args.direct_ingress:
        os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "1"  # read by the Serve controller and replicas
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"])
        else:
            ray.init(**local_init_kwargs(metrics=True))  # the service's metrics are scraped (README)
    serve.start(http_options={"host": args.host, "port": args.port})
    app = serve_app(tok, num_workers=args.workers, model_name=args.model_name or args.tokenizer,
                    tokenizer_config=cfg, max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
                    require_tenant=args.require_tenant, num_replicas=args.replicas,
                    autoscaling_config=_autoscaling(args.autoscale))
    serve.run(app, name="delta-ray", route_prefix="/")
    print(f"delta-ray serving {args.tokenizer} on http://{args.host}:{args.port} (Ctrl-C to stop)", flush=True)
    if args.direct_ingress:
        from .serve import replica_endpoints
        for _, port, rid in replica_endpoints("delta-ray"):
            print(f"  replica {rid}: http://{args.host}:{port} (direct ingress)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
    return 0
