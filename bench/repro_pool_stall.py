"""Reproduces the stateless 2-worker stall once seen in bench_scaleout's validation (issue 26; fixed).

After other Ray work in the same driver (many zero-CPU tasks, large arguments) and a 1-worker pool
opened and closed, a 2-worker pool ran 1M-character texts at 0.4-0.8/s with 8-15 s of P99 (once in
three runs here). Cause: the pool's warm-up held each warm task 0.5 s, but starting a chunk-task
process took seconds on this busy node, so both warm tasks ran one after another in the one warm
process; the first burst of two chunks then waited for a cold process (import, tokenizer load) and
Ray started more processes for the queued tasks, which took the CPUs. The warm-up now doubles its
hold until one round runs in n distinct processes (``actors.chunk_task.warm_distinct``): 3 of 3
runs at 19-24/s, P99 under 200 ms. Usage:

    .venv/bin/python bench/repro_pool_stall.py 1,2 5 qwen-3 fast --sessions --flood   # TC=0.5 env: task_cpus
"""
import os
import sys
import threading
import time

import numpy as np

from delta_ray import TokenizerPool
from delta_ray.apps.bundled import bundled_tokenizer_path
from delta_ray.apps.sample_text import corpus

ws = [int(x) for x in sys.argv[1].split(",")]
secs = float(sys.argv[2])
path = bundled_tokenizer_path(sys.argv[3] if len(sys.argv) > 3 else "llama3.2")
text1m = corpus("english", 1_000_000)
if "--flood" in sys.argv:
    import ray

    from delta_ray.actors.local_ray import local_init_kwargs
    ray.init(address="local", **local_init_kwargs())

    @ray.remote(num_cpus=0)
    def task(x):
        return 0

    ray.get([task.remote(0) for _ in range(300)])
    print("session", ray._private.worker._global_node.get_session_dir_path(), flush=True)
    big = corpus("english", 1_000_000)
    ray.get([task.remote(big) for _ in range(9)])
    import subprocess
    print("procs", subprocess.run("ps -eo args | grep -c '^ray::'", shell=True, capture_output=True, text=True).stdout)
for w in ws:
    with TokenizerPool(path, num_workers=w, max_inflight_tasks=w, placement=False,
                       engine=sys.argv[4] if len(sys.argv)>4 else "fast",
                       shadow_rate=0.0, request_timeout_s=120, task_cpus=float(os.environ.get("TC", "0"))) as pool:
        src = corpus("code", 3_000_000)
        if "--sessions" in sys.argv:
            for i in range(4):
                pool.encode(src[:100_000], session=f"v{i}")
            for k in range(200):
                pool.extend(f"v{k%4}", src[200_000+k*1300:200_000+(k+1)*1300])
        t=time.perf_counter()
        pool.encode(text1m)
        print("first", time.perf_counter()-t, flush=True)
        lat=[]
        stop=threading.Event()

        def run():
            while not stop.is_set():
                t0=time.perf_counter()
                pool.encode(text1m, add_special_tokens=False)
                lat.append(time.perf_counter()-t0)
        ts=[threading.Thread(target=run) for _ in range(2)]
        print("loop start", time.time(), flush=True)
        t0=time.perf_counter()
        for t in ts:
            t.start()
        time.sleep(secs)
        stop.set()
        for t in ts:
            t.join()
        wall=time.perf_counter()-t0
        print(f"w={w} {len(lat)/wall:.1f}/s p50 {np.median(lat)*1e3:.0f} ms p99 {np.percentile(lat,99)*1e3:.0f} ms "
              f"max {max(lat)*1e3:.0f}", flush=True)
        print(sorted(int(x*1e3) for x in lat)[-8:])
