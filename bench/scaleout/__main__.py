"""The pool at 16-256 cores on 1-16 nodes: a simulation driven by the real scheduler, checked here.

This machine has 2 cores, so a pool on 64 cores cannot be measured here. This bench instead

1. measures the service times (:mod:`.measure`) of every step a request takes on this machine (the orchestrator's
   CPU per session call and per chunk dispatch over a transport that answers at once, and its
   growth with the number of workers it routes over; the hand-off to the pool's loop; a side-channel
   round trip to a worker process; a Ray actor call, a task launch and an object put; a worker's
   1.3K turn at 100K and 1M characters of context; a chunk's encode per character; planning and
   assembly), all in this one run;
2. validates the simulation (``bench/scaleout/simulation.py``: the real dispatcher, policies and
   rendezvous routing on a fake clock, with those service times) against the real
   ``TokenizerPool`` on local Ray with 1 and 2 workers (closed loops of session turns and of
   stateless 1M-character texts, each in rounds): measured and predicted throughput and P99 side by
   side, predicted both from the costs above and from each request's CPU per process as lone
   requests measured it seconds before each round (the machine's speed drifts in between; a lone
   turn's CPU beyond the costs' sum charged per wake of a sleeping loop or worker), with the
   stalls those lone requests showed; a round is rerun while the VM's steal exceeds 2.5% of its cores
   (:mod:`.validate`);
3. runs the simulation at 16, 64 and 256 cores on 1, 4 and 16 nodes for chat sessions (100K-1M
   characters of context, +1.3K a turn, Poisson arrivals), long stateless texts (1-3M characters)
   and a mixed load (1% of requests are long texts), and prints each throughput curve and the first
   component to saturate (:mod:`.grid`).

    .venv/bin/python -m bench.scaleout [--engine fast] [--quick] [--no-ray] [--keep-cores-awake]

The network between nodes cannot be measured on one machine: 10 Gbit/s per node and direction is
assumed (``Costs.net_mb_per_ms``), and a cross-node call costs what a Ray actor call costs here.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys

os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")

from bench import bench_ceilings as ceil  # noqa: E402
from delta_ray._core.loading import load_tokenizer  # noqa: E402
from delta_ray.apps.bundled import bundled_tokenizer_path  # noqa: E402

from . import validate as validation  # noqa: E402
from .grid import grid, workload  # noqa: E402
from .measure import measure_costs, with_orchestrator  # noqa: E402
from .simulation import Cluster, sweep  # noqa: E402
from .validate import cores_kept_awake  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="qwen-3")
    ap.add_argument("--engine", default="fast", choices=("fast", "reference"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-ray", action="store_true", help="skip Ray (its costs from NOTES.md) and the validation")
    ap.add_argument("--drivers", default="1", help="caller processes attached to the pool, e.g. 1,16")
    ap.add_argument("--no-validate", action="store_true", help="measure Ray's costs but skip the validation")
    ap.add_argument("--no-grid", action="store_true", help="stop after the validation")
    ap.add_argument("--keep-cores-awake", action="store_true",
                    help="hold a CPU latency request of 0 us while measuring: idle cores poll, not halt (root)")
    ap.add_argument("--kinds", default="chat,stateless,mixed", help="workloads of the grid")
    ap.add_argument("--ab", default=None, metavar="REV",
                    help="also simulate chat sessions with the orchestrator's costs on scheduler/ as of REV")
    args = ap.parse_args()
    if args.ab:
        ceil.BASELINE = ceil.scheduler_at(args.ab)
    path = bundled_tokenizer_path(args.tokenizer)
    loaded = load_tokenizer(path)
    print(f"# bench_scaleout: {args.tokenizer}, engine {args.engine}, {os.cpu_count()} cores here, "
          f"load {os.getloadavg()[0]:.2f}")
    ray = None
    awake = contextlib.ExitStack()
    if not args.no_ray and args.keep_cores_awake:
        held = awake.enter_context(cores_kept_awake())
        print("idle cores kept from halting (a CPU latency request of 0 us) while Ray runs: "
              + ("held" if held else "not held (/dev/cpu_dma_latency needs root)"))
    if not args.no_ray:
        import ray as ray_mod

        from delta_ray.actors.local_ray import local_init_kwargs
        ray_mod.init(address="local", **local_init_kwargs())
        ray = ray_mod
    try:
        costs, raw = measure_costs(loaded, args.engine, ray, args.quick)
        print("\n## Service times measured here (ms)")
        for k, v in raw.items():
            print(f"  {k:<24}{v:>10.4f}")
        print("  -> simulation costs: " + ", ".join(f"{f.name}={getattr(costs, f.name):.4g}"
                                                    for f in dataclasses.fields(costs)
                                                    if not isinstance(getattr(costs, f.name), tuple)))
        print(f"  -> each worker turn's time varies as its CPU-time samples over their mean (other steps: means) "
              f"({len(costs.spread)} quantiles; P99 {raw['turn_cpu_p99_over_median']:.2f}x the median; "
              f"in wall time {raw['turn_p99_over_median']:.2f}x)")
        if ray is not None and not args.no_validate:
            print("\n## Validation: the real TokenizerPool on local Ray vs the simulation (closed loops)")
            print(validation.throughput_header())
            rows = validation.validate(path, costs, args.engine, args.quick)
            for row in rows:
                print(validation.throughput_row(*row))
            print(f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: wall-clock throughput and P99 "
                  "only compare on a quiet machine")
            validation.print_chunk_table(rows)
            validation.print_demand_table(rows)
    finally:
        if ray is not None:
            ray.shutdown()
        awake.close()
    if args.no_grid:
        return 0
    costs = dataclasses.replace(costs, driver_background_ms_per_s=validation.BACKGROUND)
    print("\n## Simulation: 16-256 cores on 1-16 nodes (workers = task slots = cores; driver on node 0)")
    if args.ab:
        before = with_orchestrator(costs, raw, "_base")
        print(f"\n## Before/after: chat sessions with the orchestrator's costs on scheduler/ as of {args.ab}"
              f" ({before.orch_session_ms:.3f} + {before.orch_session_ms_per_worker * 1e3:.2f} us/worker ms a call)"
              f" and now ({costs.orch_session_ms:.3f} + {costs.orch_session_ms_per_worker * 1e3:.2f} us/worker)")
        print(f"{'cores':>6}{'nodes':>6}{'before max/s':>14}{'after max/s':>13}{'gain':>7}  first to saturate after")
        for cores, nodes in [(16, 1), (64, 1), (64, 4), (256, 4), (256, 16)]:
            cl = Cluster(nodes=nodes, cores_per_node=cores // nodes)
            rates = [250, 500, 1000, 2000, 4000, 8000, 16000]
            b = max(r.throughput() for _, r in sweep(cl, before, workload("chat", cores), rates, duration_ms=600,
                                                      warmup_ms=200))
            res = sweep(cl, costs, workload("chat", cores), rates, duration_ms=600, warmup_ms=200)
            a = max(r.throughput() for _, r in res)
            name, util = res[-1][1].bottleneck()
            print(f"{cores:>6}{nodes:>6}{b:>14.0f}{a:>13.0f}{a / b:>6.1f}x  {name} ({util:.0%})")
    for d in (int(x) for x in args.drivers.split(",")):
        grid(costs, d, args.quick, kinds=tuple(args.kinds.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
