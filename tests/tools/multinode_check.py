"""Run by tests/pool/test_multinode.py in a fresh process: a pool across a 3-node ray.cluster_utils.Cluster."""
import os
import sys

os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from delta_ray import TokenizerPool  # noqa: E402
from delta_ray.apps.bundled import bundled_tokenizer_path  # noqa: E402
from delta_ray.apps.sample_text import stdlib_prose  # noqa: E402

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
cluster.wait_for_nodes()
ray.init(address=cluster.address, log_to_driver=False)
path = bundled_tokenizer_path(sys.argv[1] if len(sys.argv) > 1 else "qwen-3")
ref = Tokenizer.from_file(path)
text = stdlib_prose()[:40_000]
try:
    pool = TokenizerPool(path, num_workers=3, chunk_size=8192, cut_threshold=20_000)
    placed = {w.ready.remote() for w in pool._workers.values()}
    node_ids = {info["node"] for info in ray.get(list(placed))}
    assert len(node_ids) >= 2, f"workers not spread: {node_ids}"
    sessions = {f"k{i}": text[i * 3000:i * 3000 + 9000] for i in range(6)}
    for turn in range(3):
        for key in sessions:
            sessions[key] += f" turn {turn} " + text[turn * 100:(turn + 1) * 100]
            assert pool.encode(sessions[key], session=key).to_pylist() == ref.encode(sessions[key]).ids
    stats = pool.worker_stats()
    repairs = sum(s["paths"].get("repair", 0) for s in stats.values())
    assert repairs >= 6 * 2, stats  # sticky: later turns repaired on the same worker
    assert pool.encode(text).to_pylist() == ref.encode(text).ids
    # Remove a node that holds workers: its sessions move to their new home and stay exact.
    # The victim is a node whose worker holds sessions, so the next turns must notice the death
    # (a worker with none is only found dead when a call reaches it).
    holding = {wid for wid, s in stats.items() if s["sessions"]}
    worker_nodes = {ray.get(w.ready.remote())["node"]: wid for wid, w in pool._workers.items()}
    victim = next(n for n in nodes if worker_nodes.get(n.node_id) in holding)
    cluster.remove_node(victim)
    for key in sessions:
        sessions[key] += " after removal"
        assert pool.encode(sessions[key], session=key).to_pylist() == ref.encode(sessions[key]).ids
    assert pool.num_workers < 3, pool.num_workers
    pool.close()
    print("MULTINODE OK", len(node_ids), "nodes;", repairs, "repairs")
finally:
    ray.shutdown()
    cluster.shutdown()
