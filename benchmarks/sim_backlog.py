"""What a scheduling decision costs when thousands of jobs wait: one overloaded cluster, policy by policy.

A trace from a cluster busier than Philly's VCs (or one VC given a whole trace) keeps a deep backlog for days;
each arrival and completion is a decision over it. Synthetic streams (gmux.cluster.sim.synthetic: `exp`,
exponential sizes, and `modal`, wide jobs of typical lengths) offered at 1.3x the capacity of 16 machines x 8
GPUs, so that thousands wait by the end. Printed per policy: decisions, seconds spent deciding, per decision,
the most jobs waiting at once, and average JCT; the last line gives gmux's time per decision over Tiresias' (a
priority policy with a bounded scan, the honest baseline) and FIFO's. Writes benchmarks/results/sim_backlog.json.

Run: .venv/bin/python benchmarks/sim_backlog.py [--jobs 10000] [--load 1.3] [--shapes exp,modal]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from gmux.cluster.policies import make_policy  # noqa: E402
from gmux.cluster.sim.engine import Engine, make_machines  # noqa: E402
from gmux.cluster.sim.synthetic import job_stream  # noqa: E402
from gmux.cluster.sim.throughputs import Throughputs  # noqa: E402

MACHINES, PER = 16, 8
POLICIES = ("fifo", "tiresias", "gmux")


def run(shape: str, load: float, jobs: int, policy: str, tput: Throughputs) -> dict:
    stream = job_stream(shape, load, MACHINES * PER, jobs, tput, seed=0)
    deepest = [0]

    def on_event(eng) -> None:
        deepest[0] = max(deepest[0], len(eng.snap.pending) + len(eng.snap.suspended))

    res = Engine(make_machines(MACHINES, PER), stream, make_policy(policy), tput, timer_fn=time.perf_counter,
                 on_event=on_event).run()
    return {"decisions": res.decisions, "decide_s": res.decide_s, "ms_per_decision": 1e3 * res.decide_s /
            max(1, res.decisions), "deepest_backlog": deepest[0],
            "avg_jct_h": sum(r[3] - r[1] for r in res.jobs) / len(res.jobs) / 3600}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=10000)
    p.add_argument("--load", type=float, default=1.3)
    p.add_argument("--shapes", default="exp,modal")
    p.add_argument("--traces", default=os.path.join(ROOT, "..", "shared", "traces"))
    a = p.parse_args()
    t0 = time.perf_counter()
    tput = Throughputs(os.path.join(a.traces, "gavel_throughputs.json"))
    out = {s: {pol: run(s, a.load, a.jobs, pol, tput) for pol in POLICIES} for s in a.shapes.split(",")}
    table = Table(title=f"{a.jobs:,} jobs offered at {a.load:g}x {MACHINES} machines x {PER} GPUs")
    for col in ("shape", "policy", "decisions", "deciding s", "ms / decision", "most waiting", "avg JCT h"):
        table.add_column(col, justify="left" if col in ("shape", "policy") else "right")
    for s, rows in out.items():
        for pol, r in rows.items():
            table.add_row(s, pol, f"{r['decisions']:,}", f"{r['decide_s']:.1f}", f"{r['ms_per_decision']:.3f}",
                          f"{r['deepest_backlog']:,}", f"{r['avg_jct_h']:.1f}")
    Console().print(table)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "sim_backlog.json"), "w") as f:
        json.dump({"jobs": a.jobs, "load": a.load, "machines": MACHINES, "gpus_per_machine": PER, "shapes": out}, f,
                  indent=2)
    worst = lambda base: max(r["gmux"]["ms_per_decision"] / max(r[base]["ms_per_decision"], 1e-9)  # noqa: E731
                             for r in out.values())
    print(f"sim_backlog: gmux_vs_tiresias_per_decision_worst={worst('tiresias'):.1f} "
          f"gmux_vs_fifo_per_decision_worst={worst('fifo'):.1f} seconds={time.perf_counter() - t0:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
