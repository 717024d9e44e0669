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
    p.add_argument("--workers", type=int, default=None, help="pool workers (default: one per CPU)")
    p.add_argument("--model-name", default=None, help="the name clients send as 'model'")
    p.add_argument("--max-body-bytes", type=int, default=None)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    import ray
    from ray import serve

    from delta_ray.actors.local_ray import local_init_kwargs
    from delta_ray.bundled import BUNDLED, bundled_tokenizer_config, bundled_tokenizer_path

    from .serve import DEFAULT_MAX_BODY_BYTES, serve_app

    tok, cfg = args.tokenizer, None
    if tok in BUNDLED and not os.path.exists(tok):
        tok, cfg = bundled_tokenizer_path(tok), bundled_tokenizer_config(args.tokenizer)
    if not os.path.exists(tok):
        print(f"delta-ray serve: no tokenizer at {tok!r}")
        return 2
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"])
        else:
            ray.init(**local_init_kwargs())
    serve.start(http_options={"host": args.host, "port": args.port})
    app = serve_app(tok, num_workers=args.workers, model_name=args.model_name or args.tokenizer,
                    tokenizer_config=cfg, max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
                    require_tenant=args.require_tenant)
    serve.run(app, name="delta-ray", route_prefix="/")
    print(f"delta-ray serving {args.tokenizer} on http://{args.host}:{args.port} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
    return 0
