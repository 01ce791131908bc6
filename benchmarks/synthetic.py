"""gmux on job streams unlike Philly's (gmux/cluster/sim/synthetic.py): does what was tuned on Philly hold?

Six shapes (heavy-tailed one-GPU trials, exponential, two typical lengths per GPU count, wide jobs, sweeps, and
30 users' interleaved sweeps), each at offered loads 0.7, 0.95 and 1.1 of the cluster, three seeds each, 4,000
jobs; 64 GPUs (8 machines of 8), 256 for the wide shape. Policies: FIFO with backfilling, the SRTF oracle,
Tiresias and gmux (Gandiva is left out: its time slices make it ten times slower to simulate, and it is not what
gmux must beat here). Prints, per shape and load, average JCT (mean over seeds), gmux over SRTF and over Tiresias
(worst seed), suspends per job, and the utilisation gap: the best baseline's work utilisation (the jobs' work
over the capacity up to the last completion, as in simulate.py) over gmux's, worst seed, and the same gap for the
SRTF oracle against FIFO-bf and Tiresias; writes benchmarks/results/synthetic.json. On the shape whose jobs name
their users, gmux also runs with the users hidden, and the ratio of average JCTs per seed says what sweeps by user
are worth. The last line is

    synthetic: gmux_vs_tiresias_worst=<r> gmux_vs_srtf_worst=<r> suspends_vs_tiresias_worst=<r>
               best_util_vs_gmux_worst=<r> best_util_vs_srtf_worst=<r> seconds=<n>   (one line)

each the worst over every shape, load and seed.

Run: .venv/bin/python benchmarks/synthetic.py [--workers 2] [--jobs 4000] [--seeds 3] [--traces ../shared/traces]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from gmux.cli.argtypes import output_dir, positive_int  # noqa: E402
from gmux.cluster.policies import make_policy  # noqa: E402
from gmux.cluster.sim.engine import Engine, make_machines  # noqa: E402
from gmux.cluster.sim.metrics import summarize, write_json  # noqa: E402
from gmux.cluster.sim.synthetic import SHAPES, job_stream  # noqa: E402
from gmux.cluster.sim.throughputs import Throughputs  # noqa: E402

POLICIES = ("fifo-bf", "srtf", "tiresias", "gmux")
LOADS = (0.7, 0.95, 1.1)
GPUS = {"wide": 256}           # the others: 64
HIDDEN = "gmux, users hidden"


def _run(task) -> tuple:
    shape, load, seed, jobs, table = task
    tput = Throughputs(table)
    gpus = GPUS.get(shape, 64)
    stream = job_stream(shape, load, gpus, jobs, tput, seed)
    out = {}
    runs = [(p, p, stream) for p in POLICIES]
    if any(j.user for j in stream):
        # the same jobs with their users hidden: what knowing who submitted each job is worth to gmux
        runs.append((HIDDEN, "gmux", [dataclasses.replace(j, user="") for j in stream]))
    for key, p, jobs in runs:
        res = Engine(make_machines(gpus // 8, 8), jobs, make_policy(p), tput, cluster_name=shape).run()
        s = summarize([res])
        out[key] = {k: s[k] for k in ("avg_jct_s", "p99_jct_s", "suspends_per_job", "makespan_s", "work_utilisation")}
    return shape, load, seed, out


def main() -> int:
    t0 = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=os.path.normpath(os.path.join(ROOT, "..", "shared", "traces")))
    ap.add_argument("--workers", type=positive_int, default=2)
    ap.add_argument("--jobs", type=positive_int, default=4000)
    ap.add_argument("--seeds", type=positive_int, default=3)
    ap.add_argument("--out", type=output_dir, default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    table = os.path.join(args.traces, "gavel_throughputs.json")
    if not os.path.isfile(table):
        print(f"synthetic: {table} not found (the job types' throughputs; expected ../shared/traces)", file=sys.stderr)
        return 1
    tasks = [(sh, ld, seed, args.jobs, table) for sh in SHAPES for ld in LOADS for seed in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        results = list(pool.map(_run, tasks))
    by = {(sh, ld): [] for sh in SHAPES for ld in LOADS}
    for sh, ld, _, out in results:
        by[(sh, ld)].append(out)

    def ratio(runs, a, b, key="avg_jct_s"):
        return max(r[a][key] / max(r[b][key], 1e-9) for r in runs)

    def util_gap(runs, who, against):
        """The best work utilisation of `against` over `who`'s (above 1: `who` ended later), the worst seed."""
        return max(max(r[p]["work_utilisation"] for p in against) / max(r[who]["work_utilisation"], 1e-9)
                   for r in runs)

    print(f"average JCT (h, mean of {args.seeds} seeds); gmux/SRTF, gmux/Tiresias and the util gaps (the best "
          f"other policy's work utilisation over gmux's; SRTF's against FIFO-bf and Tiresias): the worst seed; "
          f"suspends per job (mean)")
    print(f"  {'shape':7s} {'load':>5s} " + " ".join(f"{p:>9s}" for p in POLICIES) +
          f" {'/SRTF':>6s} {'/Tir.':>6s} {'susp gmux':>9s} {'susp Tir.':>9s} {'util gap':>8s} {'SRTF gap':>8s}")
    rows = []
    for (sh, ld), runs in by.items():
        avg = {p: sum(r[p]["avg_jct_s"] for r in runs) / len(runs) / 3600 for p in POLICIES}
        sus = {p: sum(r[p]["suspends_per_job"] for r in runs) / len(runs) for p in POLICIES}
        row = {"shape": sh, "load": ld, "avg_jct_h": avg, "suspends_per_job": sus,
               "gmux_vs_srtf_worst": ratio(runs, "gmux", "srtf"),
               "gmux_vs_tiresias_worst": ratio(runs, "gmux", "tiresias"),
               "suspends_vs_tiresias_worst": ratio(runs, "gmux", "tiresias", "suspends_per_job"),
               "best_util_vs_gmux_worst": util_gap(runs, "gmux", ("fifo-bf", "srtf", "tiresias")),
               # what knowing every size does to a finite stream's end
               "best_util_vs_srtf_worst": util_gap(runs, "srtf", ("fifo-bf", "tiresias")),
               "runs": runs}
        rows.append(row)
        print(f"  {sh:7s} {ld:5.2f} " + " ".join(f"{avg[p]:9.2f}" for p in POLICIES) +
              f" {row['gmux_vs_srtf_worst']:6.2f} {row['gmux_vs_tiresias_worst']:6.2f} "
              f"{sus['gmux']:9.3f} {sus['tiresias']:9.3f} {row['best_util_vs_gmux_worst']:8.3f} "
              f"{row['best_util_vs_srtf_worst']:8.3f}")
    users = [r for r in rows if HIDDEN in r["runs"][0]]
    for r in users:
        per_seed = [run["gmux"]["avg_jct_s"] / run[HIDDEN]["avg_jct_s"] for run in r["runs"]]
        r["gmux_vs_users_hidden"] = per_seed
        print(f"  {r['shape']} at {r['load']:.2f}: gmux knowing each job's user / with users hidden, average JCT per "
              f"seed: " + ", ".join(f"{x:.3f}" for x in per_seed) +
              f" (hidden: {sum(run[HIDDEN]['avg_jct_s'] for run in r['runs']) / len(r['runs']) / 3600:.2f} h)")
    worst = {k: max(r[k] for r in rows) for k in ("gmux_vs_tiresias_worst", "gmux_vs_srtf_worst",
                                                   "suspends_vs_tiresias_worst", "best_util_vs_gmux_worst",
                                                   "best_util_vs_srtf_worst")}
    seconds = time.perf_counter() - t0
    write_json(os.path.join(args.out, "synthetic.json"), {"rows": rows, "jobs": args.jobs, "seeds": args.seeds,
                                                          **worst, "seconds": seconds})
    print(f"wrote {os.path.join(args.out, 'synthetic.json')}")
    print(f"synthetic: gmux_vs_tiresias_worst={worst['gmux_vs_tiresias_worst']:.3f} "
          f"gmux_vs_srtf_worst={worst['gmux_vs_srtf_worst']:.3f} "
          f"suspends_vs_tiresias_worst={worst['suspends_vs_tiresias_worst']:.2f} "
          f"best_util_vs_gmux_worst={worst['best_util_vs_gmux_worst']:.3f} "
          f"best_util_vs_srtf_worst={worst['best_util_vs_srtf_worst']:.3f} seconds={seconds:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
