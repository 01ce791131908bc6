"""Where a VC's GPUs sit idle, policy by policy (issue 13's utilisation target): integrates the idle GPUs of one
simulated Philly VC between events, split by what was waiting at the time.

  fits        a waiting job fits the idle GPUs of one machine (the policy chose not to start it)
  by count    one fits the idle GPUs by count, but no machine has room (fragmentation)
  too wide    every waiting job is wider than all the idle GPUs
  none waits  nothing waits; of it, "drain": after the VC's last arrival

in GPU-days per GPU, with the makespan (days from the first arrival) and average JCT; the last line compares gmux's
idle-while-nothing-waits and makespan with FIFO-bf's (the baseline with the best utilisation at x0.25). Writes
benchmarks/results/sim_idle.json.

Run: .venv/bin/python benchmarks/sim_idle.py [--vc-scale 0.25] [--vc 103959] [--policies fifo-bf,srtf,tiresias,gmux]
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

from gmux.cli.argtypes import positive  # noqa: E402
from gmux.cluster.policies import POLICIES, make_policy  # noqa: E402
from gmux.cluster.sim.engine import Engine, make_machines  # noqa: E402
from gmux.cluster.sim.run import SimConfig, prepare  # noqa: E402

CLASSES = ("fits", "by count", "too wide", "none waits", "drain")
DAY = 86400.0


def idle_by_class(scale: float, vc: str, policy: str, traces: str) -> dict:
    cfg = SimConfig(trace=os.path.join(traces, "philly.csv"), vcs=os.path.join(traces, "philly_vc.csv"),
                    throughputs=os.path.join(traces, "gavel_throughputs.json"), bad_rows="skip", vc_scale=scale)
    prep = prepare(cfg)
    if vc not in prep.clusters:
        raise SystemExit(f"sim_idle: no VC {vc!r}; the trace has {', '.join(sorted(prep.clusters))}")
    machines, jobs = prep.clusters[vc]
    last_arrival = max(j.submit for j in jobs)
    idle = dict.fromkeys(CLASSES, 0.0)
    at = {"t": None, "cls": None, "idle": 0}

    def on_event(eng) -> None:
        snap, t = eng.snap, eng.now
        if at["t"] is not None and t > at["t"]:
            idle[at["cls"]] += at["idle"] * (t - at["t"])
            if at["t"] >= last_arrival and at["cls"] == "none waits":
                idle["drain"] += at["idle"] * (t - at["t"])
        waiting = [snap.jobs[j].num_gpus for j in list(snap.pending) + list(snap.suspended)]
        if not waiting:
            cls = "none waits"
        elif min(waiting) <= max(snap.machine_idle):
            cls = "fits"
        elif min(waiting) <= snap.total_idle:
            cls = "by count"
        else:
            cls = "too wide"
        at.update(t=t, cls=cls, idle=snap.total_idle)

    engine = Engine(make_machines(machines, cfg.gpus_per_machine), jobs, make_policy(policy), prep.tput, cfg.costs,
                    cluster_name=vc, on_event=on_event)
    res = engine.run()
    gpus = machines * cfg.gpus_per_machine
    return {"gpus": gpus, "jobs": len(res.jobs),
            "avg_jct_h": sum(r[3] - r[1] for r in res.jobs) / len(res.jobs) / 3600,
            "makespan_d": (res.end - res.start) / DAY, "last_arrival_d": (last_arrival - res.start) / DAY,
            "idle_gpu_days_per_gpu": {k: v / DAY / gpus for k, v in idle.items()}}


def _policies(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",")]
    bad = [x for x in names if x not in POLICIES]
    if bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: give policies once each, from {', '.join(POLICIES)}")
    return names


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vc-scale", type=positive, default=0.25)
    p.add_argument("--vc", default="103959")
    p.add_argument("--policies", type=_policies, default="fifo-bf,srtf,tiresias,gmux")
    p.add_argument("--traces", default=os.path.join(ROOT, "..", "shared", "traces"))
    a = p.parse_args()
    t0 = time.perf_counter()
    out = {pol: idle_by_class(a.vc_scale, a.vc, pol, a.traces) for pol in a.policies}
    table = Table(title=f"Idle GPU-days per GPU in VC {a.vc} at x{a.vc_scale}")
    for col in ("policy", "avg JCT h", "makespan d", *CLASSES):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for pol, r in out.items():
        table.add_row(pol, f"{r['avg_jct_h']:.1f}", f"{r['makespan_d']:.1f}",
                      *(f"{r['idle_gpu_days_per_gpu'][c]:.2f}" for c in CLASSES))
    Console().print(table)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "sim_idle.json"), "w") as f:
        json.dump({"vc": a.vc, "vc_scale": a.vc_scale, "policies": out}, f, indent=2)
    if "gmux" in out and "fifo-bf" in out:
        g, b = out["gmux"], out["fifo-bf"]
        print(f"sim_idle: gmux_vs_fifo_bf_idle_nothing_waiting="
              f"{g['idle_gpu_days_per_gpu']['none waits'] / max(b['idle_gpu_days_per_gpu']['none waits'], 1e-9):.2f} "
              f"gmux_vs_fifo_bf_makespan={g['makespan_d'] / b['makespan_d']:.3f} "
              f"seconds={time.perf_counter() - t0:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
