"""The simulation's grid: 16-256 cores on 1-16 nodes, each workload's throughput curve and what saturates first.

Chat sessions (100K-1M characters of context, +1.3K a turn, Poisson arrivals), long stateless texts
(1-3M characters) and a mixed load (1% of requests are long texts).
"""
from __future__ import annotations

from .costs import Costs
from .simulation import Cluster, Simulation, sweep

GRID = [(16, 1), (16, 4), (16, 16), (64, 1), (64, 4), (64, 16), (256, 1), (256, 4), (256, 16)]


def workload(kind: str, cores: int):
    def chat(sim: Simulation, rate: float, until: float) -> None:
        sim.add_sessions(max(256, 8 * cores))
        sim.chat(rate, until)

    def texts(sim: Simulation, rate: float, until: float) -> None:
        sim.stateless(rate, until)

    def mixed(sim: Simulation, rate: float, until: float) -> None:
        sim.add_sessions(max(256, 8 * cores))
        sim.chat(rate * 0.99, until)
        sim.stateless(rate * 0.01, until)
    return {"chat": chat, "stateless": texts, "mixed": mixed}[kind]


RATES = {"chat": [500, 1000, 2000, 4000, 8000, 16000, 32000],
         "stateless": [5, 10, 20, 40, 80, 160, 320],
         "mixed": [250, 500, 1000, 2000, 4000, 8000]}


def grid(costs: Costs, drivers: int, quick: bool, kinds=("chat", "stateless", "mixed")) -> dict:
    """Each workload on each cluster: offered rates double until the pool falls behind twice; the
    first component to saturate is the busiest one at the highest rate offered."""
    out = {}
    for kind in kinds:
        # several caller processes go further: start higher, so the sweep reaches their ceiling
        rates = RATES[kind] if drivers == 1 else [r * 8 for r in RATES[kind]]
        print(f"\n### {kind}: completed requests/s at each offered rate ({drivers} driver process(es))")
        print(f"{'cores':>6}{'nodes':>6} " + "".join(f"{r:>8}" for r in rates) + "   max/s  first to saturate")
        for cores, nodes in GRID if drivers == 1 else [(64, 1), (64, 4), (256, 16)]:
            cl = Cluster(nodes=nodes, cores_per_node=cores // nodes, drivers=drivers)
            dur = 1_000.0 if kind == "chat" or quick else 3_000.0
            res, behind = [], 0
            for rate in rates:
                res += sweep(cl, costs, workload(kind, cores), [rate], duration_ms=dur, warmup_ms=dur / 4)
                behind += res[-1][1].throughput() < 0.8 * rate
                if behind >= 2:
                    break
            done = [r.throughput() for _, r in res]
            name, util = res[-1][1].bottleneck()
            also = [k for k in res[-1][1].saturated() if k != name]
            out[(kind, cores, nodes)] = (max(done), name, util, res)
            print(f"{cores:>6}{nodes:>6} " + "".join(f"{d:>8.0f}" for d in done) + " " * 8 * (len(rates) - len(done))
                  + f"{max(done):>8.0f}  {name} ({util:.0%})" + (f"; also {', '.join(also)}" if also else ""))
    return out
