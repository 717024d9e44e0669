"""Start a named delta-ray pool spanning the cluster and serve it over HTTP (run on the head node).

    RAY_ADDRESS=auto python examples/start_pool.py --tokenizer /path/to/tokenizer.json
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
args = ap.parse_args()

ray.init(address="auto")
cpus = int(ray.cluster_resources()["CPU"])
pool = TokenizerPool(args.tokenizer, num_workers=cpus, name="delta-ray")  # one worker per core, all nodes
serve.start(http_options={"host": "0.0.0.0", "port": args.port})
serve.run(serve_app(args.tokenizer, pool_name="delta-ray", num_replicas=args.replicas), name="delta-ray")
print(f"pool of {pool.num_workers} workers; HTTP on :{args.port}")
while True:
    time.sleep(3600)
