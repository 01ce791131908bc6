"""Cluster simulation benchmark: every policy on the full Philly trace, per-VC clusters (issue 5).

Prints the results table, the JCT ratio of each policy to FIFO, the published figures on this data beside ours,
and the time one scheduling decision takes on a 1,000-machine / 8,000-GPU cluster with 10,000 active jobs.
Writes benchmarks/results/simulate.json and two PNG plots. The last line is

    sim_philly: fifo_jct=<s> tiresias_jct=<s> gandiva_jct=<s> gmux_jct=<s> seconds=<n>

Run: .venv/bin/python benchmarks/simulate.py [--workers 2] [--traces ../shared/traces]
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

from gmux.cluster.policies import POLICIES, Event, EventKind, make_policy  # noqa: E402
from gmux.cluster.sim.engine import Engine, make_machines  # noqa: E402
from gmux.cluster.sim.metrics import render_table, write_json  # noqa: E402
from gmux.cluster.sim.plots import plot_jct_cdf, plot_utilisation  # noqa: E402
from gmux.cluster.sim.run import SimConfig, prepare, report, simulate  # noqa: E402
from gmux.cluster.sim.trace import Throughputs, TraceJob  # noqa: E402

# HeliosArtifact (SC'21), per-VC Philly on these VC sizes (from ../shared/traces/README.md).
PUBLISHED = {"fifo": {"avg_jct_s": 86072, "avg_queue_s": 56531},
             "sjf": {"avg_jct_s": 34272, "avg_queue_s": 4731},
             "srtf": {"avg_jct_s": 30683, "avg_queue_s": 1138}}


def decision_time(tput: Throughputs, policy_name: str, machines: int = 1000, per: int = 8, active: int = 10000,
                  probes: int = 30, seed: int = 0) -> dict:
    """Seconds per policy.decide() for an arrival, on a cluster of `machines` x `per` GPUs with `active` jobs.

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
        # Apply through the engine's own path (without re-deciding) so the next probe sees the new state.
        eng.policy = _Replay(eng.policy, actions)
        eng._decide(Event(EventKind.ARRIVAL, job_id=tj.job_id))
        eng.policy = eng.policy.inner
    s = eng.snap
    state = {"running": len(s.running), "waiting": len(s.pending) + len(s.suspended), "active_jobs": len(s.jobs)}
    # Completions: the other kind of decision, where freed GPUs are refilled (and, for the sharing policies,
    # shared jobs spread out and spread jobs consolidated). Oldest running jobs finish, one at a time.
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
    return {"policy": policy_name, "machines": machines, "gpus": s.total_gpus, **state,
            "p50_ms": 1e3 * statistics.median(times), "max_ms": 1e3 * max(times), "probes": len(times),
            "completion_p50_ms": 1e3 * statistics.median(done_times), "completion_max_ms": 1e3 * max(done_times)}


class _Replay:
    """Hands the engine actions already decided, so a timed decision is applied exactly once."""

    def __init__(self, inner, actions):
        self.inner, self.actions, self.name = inner, actions, inner.name

    def decide(self, snap, event):
        return self.actions


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=os.path.normpath(os.path.join(ROOT, "..", "shared", "traces")))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--no-decision-bench", action="store_true")
    args = ap.parse_args()
    paths = {n: os.path.join(args.traces, n) for n in ("philly.csv", "philly_vc.csv", "gavel_throughputs.json")}
    missing = [p for p in paths.values() if not os.path.isfile(p)]
    if missing:
        print(f"simulate: trace files not found: {', '.join(missing)} (expected ../shared/traces)", file=sys.stderr)
        return 1
    policies = list(POLICIES)
    cfg = SimConfig(trace=paths["philly.csv"], vcs=paths["philly_vc.csv"], throughputs=paths["gavel_throughputs.json"],
                    workers=args.workers)
    t0 = time.perf_counter()
    prep = prepare(cfg)
    out = simulate(cfg, policies, prep)
    seconds = time.perf_counter() - t0
    payload = report(cfg, prep, out)
    payload["seconds"] = seconds
    payload["workers"] = args.workers
    summ, ratios = payload["summary"], payload["jct_ratio_to_fifo"]
    for note in prep.notes:
        print(f"note: {note}")
    print(render_table(summ, ratios, title=f"Philly, per-VC clusters, {summ['fifo']['jobs']} jobs, "
                                           f"{summ['fifo']['gpus']} GPUs"), end="")
    print(f"all {len(policies)} policies on the full trace: {seconds:.1f} s wall with {args.workers} worker(s); "
          f"simulation CPU per policy: " + ", ".join(f"{p} {summ[p]['sim_wall_s']:.0f} s" for p in policies))
    print("\nJCT under each policy / JCT under FIFO, per job:")
    for p, r in ratios.items():
        print(f"  {p:9s} mean {r['mean']:.3f}  p50 {r['p50']:.3f}  p99 {r['p99']:.3f}  max {r['max']:.2f}  "
              f"jobs over 2x: {r['over_2']}")

    print("\nPublished (HeliosArtifact, SC'21, their own Philly job set) beside ours:")
    print(f"  {'':6s} {'their avg JCT':>14s} {'ours':>10s} {'their avg queue':>16s} {'ours':>10s}")
    for p, pub in PUBLISHED.items():
        print(f"  {p:6s} {pub['avg_jct_s']:>14,} {summ[p]['avg_jct_s']:>10,.0f} {pub['avg_queue_s']:>16,} "
              f"{summ[p]['avg_queue_s']:>10,.0f}")
    for p in ("sjf", "srtf"):
        print(f"  FIFO/{p.upper()} avg JCT ratio: theirs {PUBLISHED['fifo']['avg_jct_s'] / PUBLISHED[p]['avg_jct_s']:.2f}, "
              f"ours {summ['fifo']['avg_jct_s'] / summ[p]['avg_jct_s']:.3f}")
    payload["published_helios"] = PUBLISHED

    if not args.no_decision_bench:
        print("\nOne scheduling decision, 1,000 machines x 8 GPUs, 10,000 active jobs (arrival | completion):")
        dec = []
        for p in policies:
            d = decision_time(prep.tput, p)
            dec.append(d)
            print(f"  {p:9s} arrival p50 {d['p50_ms']:6.2f} ms max {d['max_ms']:6.2f} ms | completion p50 "
                  f"{d['completion_p50_ms']:6.2f} ms max {d['completion_max_ms']:6.2f} ms  ({d['running']} running, "
                  f"{d['waiting']} waiting, {d['probes']} probes each)")
        payload["decision_time"] = dec

    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "simulate.json"), payload)
    plot_jct_cdf(out, os.path.join(args.out, "sim_jct_cdf.png"), "Philly (per-VC): JCT CDF per policy")
    plot_utilisation(out, os.path.join(args.out, "sim_utilisation.png"), "Philly (per-VC): GPU utilisation")
    print(f"\nwrote {os.path.join(args.out, 'simulate.json')}, sim_jct_cdf.png, sim_utilisation.png")
    print(f"sim_philly: fifo_jct={summ['fifo']['avg_jct_s']:.0f} tiresias_jct={summ['tiresias']['avg_jct_s']:.0f} "
          f"gandiva_jct={summ['gandiva']['avg_jct_s']:.0f} gmux_jct={summ['gmux']['avg_jct_s']:.0f} "
          f"seconds={seconds:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
