"""Cluster simulation benchmark: every policy on the full Philly trace, per-VC clusters, at four loads (issue 13).

The real layout loads Philly's VCs to ~13% on average, where every policy gives nearly the same JCT; shrinking
every VC (`vc_scale` x1, x0.5, x0.35, x0.25) is where scheduling matters. For each load and policy it prints
average and p99 JCT, the ratio to the SRTF oracle, queueing (time with no GPU) and time slowed by sharing,
suspends per job, utilisation and makespan (gmux-law, gmux told the size law but not the sizes, is the
yardstick for how much of gmux's distance to SRTF is learning the law); then the same split into the VCs the gmux
policy was tuned on and the others (cross-validation), the cost model's figures, the published ratios beside ours,
and the time of one decision on a 1,000-machine cluster. Writes benchmarks/results/simulate.json and
sim_load_curve.png (average JCT against load). The last line is

    sim_load: gmux_vs_srtf_worst=<r> gmux_vs_tiresias_worst=<r> suspends_vs_tiresias_worst=<r> seconds=<n>

each the largest over the loads x0.5, x0.35 and x0.25 of gmux's average JCT over SRTF's, over Tiresias', and of
its suspends per job over Tiresias'. seconds is the wall time of the whole benchmark.

Run: .venv/bin/python benchmarks/simulate.py [--workers 2] [--loads 1,0.5,0.35,0.25] [--traces ../shared/traces]
Philly trace: Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads",
USENIX ATC 2019 (CC BY 4.0).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from gmux.cli.argtypes import output_dir, positive, positive_int  # noqa: E402
from gmux.cluster.policies import POLICIES, Event, EventKind, make_policy  # noqa: E402
from gmux.cluster.sim.engine import Engine, make_machines  # noqa: E402
from gmux.cluster.sim.metrics import summarize, write_json  # noqa: E402
from gmux.cluster.sim.plots import plot_load_curve  # noqa: E402
from gmux.cluster.sim.run import SimConfig, prepare, simulate  # noqa: E402
from gmux.cluster.sim.throughputs import Throughputs  # noqa: E402
from gmux.cluster.sim.trace import TraceError, TraceJob  # noqa: E402

# HeliosArtifact (SC'21), per-VC Philly on these VC sizes (from ../shared/traces/README.md).
PUBLISHED = {"fifo": 86072, "sjf": 34272, "srtf": 30683}
# The VCs gmux's knobs were chosen on (gmux/cluster/policies/gmux_default.py); the rest are reported apart.
TUNE_VCS = ("11cb48", "6c71a0", "0e4a51", "7f04ca", "ed69ec")
TARGET_LOADS = (0.5, 0.35, 0.25)


def decision_time(tput: Throughputs, policy_name: str, machines: int = 1000, per: int = 8, active: int = 10000,
                  probes: int = 30, seed: int = 0) -> dict:
    """Seconds per policy.decide() for an arrival and a completion, on `machines` x `per` GPUs, `active` jobs.

    The cluster is filled by FIFO (fast, and policy-neutral: every job placed consolidated), then handed to the
    policy under test; one warm-up arrival lets it build its indexes, then `probes` arrivals are timed one by
    one. Job sizes follow Philly's mix (93% one GPU); durations are long so nothing completes meanwhile."""
    import numpy as np
    rng = np.random.Generator(np.random.PCG64(seed))
    sizes = rng.choice([1, 2, 4, 8], p=[0.93, 0.023, 0.024, 0.023], size=active + probes + 1)
    jobs = []
    for i, n in enumerate(sizes):
        keys = tput.by_scale[tput.scale_of(int(n))]
        jobs.append(TraceJob(job_id=i, line=i + 2, submit=float(i), duration=1e8, num_gpus=int(n), vc="bench",
                             job_type=keys[int(rng.integers(len(keys)))]))
    eng = Engine(make_machines(machines, per), jobs, make_policy("fifo"), tput, cluster_name="bench")
    oracle = POLICIES[policy_name].uses_oracle
    for tj in jobs[:active]:
        eng._advance(tj.submit)
        eng._arrive(tj, oracle)
        eng._decide(Event(EventKind.ARRIVAL, job_id=tj.job_id))
    eng.policy = make_policy(policy_name)
    times = []
    for k, tj in enumerate(jobs[active:]):
        eng._advance(tj.submit)
        eng._arrive(tj, oracle)
        t0 = time.perf_counter()
        actions = eng.policy.decide(eng.snap, Event(EventKind.ARRIVAL, job_id=tj.job_id))
        dt = time.perf_counter() - t0
        if k:                                   # the first call builds the policy's indexes
            times.append(dt)
        eng.policy = _Replay(eng.policy, actions)
        eng._decide(Event(EventKind.ARRIVAL, job_id=tj.job_id))
        eng.policy = eng.policy.inner
    s = eng.snap
    done_times = []
    for _ in range(probes):
        jid = next(iter(s.running))
        sj = eng.cluster.sim[jid]
        eng.cluster.settle(sj, eng.now)
        sj.progress = sj.work
        eng._complete(sj)
        t0 = time.perf_counter()
        actions = eng.policy.decide(s, Event(EventKind.COMPLETION, job_id=jid))
        done_times.append(time.perf_counter() - t0)
        eng.policy = _Replay(eng.policy, actions)
        eng._decide(Event(EventKind.COMPLETION, job_id=jid))
        eng.policy = eng.policy.inner
    return {"policy": policy_name, "running": len(s.running), "waiting": len(s.pending) + len(s.suspended),
            "p50_ms": 1e3 * statistics.median(times), "max_ms": 1e3 * max(times),
            "completion_p50_ms": 1e3 * statistics.median(done_times), "completion_max_ms": 1e3 * max(done_times)}


class _Replay:
    """Hands the engine actions already decided, so a timed decision is applied exactly once."""

    def __init__(self, inner, actions):
        self.inner, self.actions, self.name = inner, actions, inner.name

    def decide(self, snap, event):
        return self.actions


def _row(s: dict, srtf: dict) -> dict:
    keep = ("jobs", "avg_jct_s", "p99_jct_s", "avg_queue_s", "avg_slowed_s", "suspends_per_job", "utilisation",
            "work_utilisation", "idle_while_waiting", "makespan_s", "preemptions", "packs", "migrations",
            "sim_wall_s")
    out = {k: s[k] for k in keep}
    out["vs_srtf"] = s["avg_jct_s"] / srtf["avg_jct_s"]
    return out


def _loads(text: str) -> list[float]:
    loads = [positive(x) for x in text.split(",")]
    if len(set(loads)) != len(loads):
        raise argparse.ArgumentTypeError(f"{text}: a load is given twice")
    return loads


def main() -> int:
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=os.path.normpath(os.path.join(ROOT, "..", "shared", "traces")))
    ap.add_argument("--workers", type=positive_int, default=2)
    ap.add_argument("--loads", type=_loads, default="1,0.5,0.35,0.25", help="VC scales to run (comma-separated)")
    ap.add_argument("--out", type=output_dir, default=os.path.join(HERE, "results"))
    ap.add_argument("--no-decision-bench", action="store_true")
    args = ap.parse_args()
    paths = {n: os.path.join(args.traces, n) for n in ("philly.csv", "philly_vc.csv", "gavel_throughputs.json")}
    missing = [p for p in paths.values() if not os.path.isfile(p)]
    if missing:
        print(f"simulate: trace files not found: {', '.join(missing)} (expected ../shared/traces)", file=sys.stderr)
        return 1
    loads = args.loads
    policies = list(POLICIES)
    curve: dict = {}
    split: dict = {}
    # Every load's clusters are built before any is simulated: a load that cannot be (a VC scaled past the
    # largest cluster) ended the run with a traceback after the hours the loads before it took.
    runs = []
    for load in loads:
        cfg = SimConfig(trace=paths["philly.csv"], vcs=paths["philly_vc.csv"],
                        throughputs=paths["gavel_throughputs.json"], vc_scale=load, bad_rows="skip",
                        workers=args.workers)
        t0 = time.perf_counter()
        try:
            runs.append((load, cfg, prepare(cfg), time.perf_counter() - t0))
        except (TraceError, ValueError) as e:
            print(f"simulate: x{load:g}: {e}", file=sys.stderr)
            return 2
    prep = None
    for load, cfg, prep, prepared_s in runs:
        t0 = time.perf_counter() - prepared_s
        out = simulate(cfg, policies, prep)
        wall = time.perf_counter() - t0
        summ = {p: summarize(r) for p, r in out.items()}
        curve[load] = {p: _row(summ[p], summ["srtf"]) for p in policies}
        curve[load]["_wall_s"] = wall
        split[load] = {}
        for name, pick in (("tuned", lambda c: c in TUNE_VCS), ("held_out", lambda c: c not in TUNE_VCS)):
            ss = {p: summarize([r for r in out[p] if pick(r.cluster)])
                  for p in ("srtf", "tiresias", "gmux", "gmux-law")}
            split[load][name] = {p: ss[p]["avg_jct_s"] for p in ss}
        print(f"\nPhilly x{load:g} ({sum(n for n, _ in prep.clusters.values())} machines, "
              f"{summ['fifo']['jobs']} jobs): {wall:.0f} s wall with {args.workers} worker(s)")
        print(f"  {'policy':9s} {'avg JCT h':>9s} {'p99 h':>8s} {'/SRTF':>6s} {'queue h':>8s} {'slowed h':>8s} "
              f"{'susp/job':>8s} {'util %':>6s} {'work %':>6s} {'idle-w %':>8s} {'span d':>7s} {'cpu s':>6s}")
        for p in policies:
            r = curve[load][p]
            print(f"  {p:9s} {r['avg_jct_s'] / 3600:9.2f} {r['p99_jct_s'] / 3600:8.1f} {r['vs_srtf']:6.2f} "
                  f"{r['avg_queue_s'] / 3600:8.2f} {r['avg_slowed_s'] / 3600:8.2f} {r['suspends_per_job']:8.3f} "
                  f"{100 * r['utilisation']:6.1f} {100 * r['work_utilisation']:6.1f} "
                  f"{100 * r['idle_while_waiting']:8.1f} {r['makespan_s'] / 86400:7.1f} {r['sim_wall_s']:6.0f}")
    for line in cfg.costs.summary_lines():
        print(line)

    print("\nCross-validation: gmux's knobs were chosen on VCs " + ", ".join(TUNE_VCS) + "; average JCT (h):")
    for load in loads:
        for name in ("tuned", "held_out"):
            s = split[load][name]
            print(f"  x{load:<5g} {name:9s} srtf {s['srtf'] / 3600:7.2f}  tiresias {s['tiresias'] / 3600:7.2f}  "
                  f"gmux {s['gmux'] / 3600:7.2f}  gmux/srtf {s['gmux'] / s['srtf']:.2f}  "
                  f"gmux/tiresias {s['gmux'] / s['tiresias']:.2f}  gmux-law/srtf {s['gmux-law'] / s['srtf']:.2f}")

    print("\nPublished (HeliosArtifact, SC'21, their own Philly job set, its real load) beside ours:")
    for load in loads:
        c = curve[load]
        print(f"  x{load:<5g} FIFO/SJF {c['fifo']['avg_jct_s'] / c['sjf']['avg_jct_s']:.2f} "
              f"(theirs {PUBLISHED['fifo'] / PUBLISHED['sjf']:.2f})  FIFO/SRTF "
              f"{c['fifo']['avg_jct_s'] / c['srtf']['avg_jct_s']:.2f} "
              f"(theirs {PUBLISHED['fifo'] / PUBLISHED['srtf']:.2f})")

    print("\nThe issue's table (average JCT, hours; gmux/SRTF; gmux vs Tiresias), markdown:")
    print("| Philly | " + " | ".join(policies) + " | gmux/SRTF | gmux vs Tiresias | gmux-law/SRTF |")
    print("| --- |" + " ---: |" * (len(policies) + 3))
    for load in loads:
        c = curve[load]
        cells = [f"{c[p]['avg_jct_s'] / 3600:.2f}" for p in policies]
        print(f"| ×{load:g} | " + " | ".join(cells) + f" | {c['gmux']['vs_srtf']:.2f} | "
              f"{100 * (c['gmux']['avg_jct_s'] / c['tiresias']['avg_jct_s'] - 1):+.1f}% | "
              f"{c['gmux-law']['vs_srtf']:.2f} |")

    payload = {"loads": {str(k): v for k, v in curve.items()},
               "cross_validation": {str(k): v for k, v in split.items()}, "costs": cfg.costs.table(),
               "tune_vcs": list(TUNE_VCS), "published_helios_avg_jct_s": PUBLISHED, "workers": args.workers}
    if not args.no_decision_bench and prep is not None:
        print("\nOne scheduling decision, 1,000 machines x 8 GPUs, 10,000 active jobs (arrival | completion):")
        dec = []
        for p in policies:
            d = decision_time(prep.tput, p)
            dec.append(d)
            print(f"  {p:9s} arrival p50 {d['p50_ms']:6.2f} ms max {d['max_ms']:6.2f} ms | completion p50 "
                  f"{d['completion_p50_ms']:6.2f} ms max {d['completion_max_ms']:6.2f} ms")
        payload["decision_time"] = dec

    targets = [x for x in TARGET_LOADS if x in curve] or loads
    vs_srtf = max(curve[x]["gmux"]["vs_srtf"] for x in targets)
    vs_tir = max(curve[x]["gmux"]["avg_jct_s"] / curve[x]["tiresias"]["avg_jct_s"] for x in targets)
    sus = max(curve[x]["gmux"]["suspends_per_job"] / max(curve[x]["tiresias"]["suspends_per_job"], 1e-9)
              for x in targets)
    seconds = time.perf_counter() - t_start
    payload.update({"gmux_vs_srtf_worst": vs_srtf, "gmux_vs_tiresias_worst": vs_tir,
                    "suspends_vs_tiresias_worst": sus, "seconds": seconds})
    write_json(os.path.join(args.out, "simulate.json"), payload)
    plot_load_curve({p: {x: curve[x][p]["avg_jct_s"] for x in loads} for p in policies},
                    os.path.join(args.out, "sim_load_curve.png"), "Philly per-VC: average JCT against load")
    print(f"\nwrote {os.path.join(args.out, 'simulate.json')}, sim_load_curve.png")
    print(f"sim_load: gmux_vs_srtf_worst={vs_srtf:.3f} gmux_vs_tiresias_worst={vs_tir:.3f} "
          f"suspends_vs_tiresias_worst={sus:.2f} seconds={seconds:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
