"""Start a named delta-ray pool spanning the cluster and serve it over HTTP (run on the head node).

    RAY_ADDRESS=auto python examples/start_pool.py --tokenizer /path/to/tokenizer.json

HTTP listens on 127.0.0.1 unless you pass --host; the service has no authentication of its own, so
expose it only behind a proxy that authenticates (and pass --require-tenant so every request names
its tenant). The pool's secret is printed once: other processes attach with it
(``TokenizerPool.connect("delta-ray", secret)`` or ``$DELTA_RAY_POOL_SECRET``).
"""
import argparse
import time

import ray
from ray import serve

from delta_ray import TokenizerPool, serve_app

ap = argparse.ArgumentParser()
ap.add_argument("--tokenizer", required=True)
ap.add_argument("--replicas", type=int, default=2)
ap.add_argument("--port", type=int, default=8000)
ap.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
ap.add_argument("--require-tenant", action="store_true", help="refuse requests without cache_salt")
args = ap.parse_args()

ray.init(address="auto")
cpus = int(ray.cluster_resources()["CPU"])
pool = TokenizerPool(args.tokenizer, num_workers=cpus, name="delta-ray")  # one worker per core, all nodes
serve.start(http_options={"host": args.host, "port": args.port})
serve.run(serve_app(args.tokenizer, pool_name="delta-ray", pool_secret=pool.secret.hex(), num_replicas=args.replicas,
                    require_tenant=args.require_tenant), name="delta-ray")
print(f"pool of {pool.num_workers} workers; HTTP on {args.host}:{args.port}")
print(f"pool secret (attach with TokenizerPool.connect): {pool.secret.hex()}")
while True:
    time.sleep(3600)
