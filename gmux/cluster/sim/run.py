"""Running a whole simulation: split the trace into clusters, run each policy on each, in worker processes.

Layouts:
- "philly" (default): each virtual cluster of philly_vc.csv is its own cluster of `nodes x gpus_per_machine`
  GPUs and a job runs only in its VC, as in Philly. Four tiny VCs of the trace (18 jobs) are absent from
  philly_vc.csv; `unknown_vc="smallest"` (default) gives each of them a cluster the size of the smallest listed VC
  (8 machines), so every trace job is simulated; `"skip"` leaves their jobs out; `"refuse"` stops.
- a single cluster of `machines` machines that runs every job (`machines=N`).
`vc_scale` shrinks or grows every VC (a stress test: Philly's VCs run at ~10% average utilisation).
A job that needs more GPUs than its cluster has can never run; such jobs are reported and skipped or refused
with the bad rows (`bad_rows`), and are not counted among the jobs a note says run.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime

from gmux.cluster.policies import make_policy
from gmux.cluster.sim.cluster import Costs
from gmux.cluster.sim.engine import Engine, RunResult, make_machines
from gmux.cluster.sim.throughputs import Throughputs, assign_types
from gmux.cluster.sim.trace import MAX_GPUS_PER_MACHINE, MAX_MACHINES, ONE_VC, TraceError, load_trace, load_vcs, select


@dataclass
class SimConfig:
    trace: str
    vcs: str | None
    throughputs: str
    machines: int | None = None          # single-cluster layout when set
    gpus_per_machine: int = 8
    gpu_type: str = "v100"
    suspect: str = "p100"
    seed: int = 0
    start: float | datetime | None = None   # seconds since the trace's first submission, or a wall-clock time
    end: float | datetime | None = None
    sample: float | None = None
    bad_rows: str = "refuse"
    columns: dict | None = None          # the trace's column names where they are not ones it knows (trace.py)
    gpu_unit: str = "auto"               # what the trace's GPU column counts (trace.GPU_UNITS)
    time_unit: str = "s"                 # what its numeric times and durations count (trace.TIME_UNITS)
    unknown_vc: str = "smallest"
    vc_scale: float = 1.0                # multiply every VC's machine count (stress runs); at least 1 machine
    elastic_fraction: float = 0.0
    costs: Costs = field(default_factory=Costs)
    workers: int = 1
    only: tuple | None = None             # simulate only these clusters (VCs; "cluster" under machines=N)


@dataclass
class Prepared:
    clusters: dict                        # name -> (n_machines, [TraceJob])
    tput: Throughputs
    notes: list[str]
    skipped: list[tuple[int, str]]        # (line, why) of jobs not simulated


def _check_only(only: tuple, have: dict) -> None:
    unknown = [c for c in only if c not in have]
    if unknown:
        names = sorted(have)
        listed = ", ".join(names[:20]) + (f" (and {len(names) - 20} more)" if len(names) > 20 else "")
        raise ValueError(f"no cluster {', '.join(unknown)}; the trace has {listed}")


def _when(t) -> str:
    """A --start or --end as the user gave it."""
    return t.isoformat(sep=" ") if isinstance(t, datetime) else f"{t:g} s after the first submission"


def prepare(cfg: SimConfig) -> Prepared:
    if cfg.unknown_vc not in ("smallest", "skip", "refuse"):
        raise ValueError(f"unknown_vc must be smallest, skip or refuse, not {cfg.unknown_vc!r}")
    if not 1 <= cfg.gpus_per_machine <= MAX_GPUS_PER_MACHINE:
        raise ValueError(f"gpus_per_machine must be in 1..{MAX_GPUS_PER_MACHINE}, not {cfg.gpus_per_machine}")
    tput = Throughputs(cfg.throughputs, cfg.gpu_type, cfg.suspect)
    trace = load_trace(cfg.trace, bad_rows=cfg.bad_rows, columns=cfg.columns, gpu_unit=cfg.gpu_unit,
                       time_unit=cfg.time_unit)
    assign_types(trace, tput, seed=cfg.seed, elastic_fraction=cfg.elastic_fraction)
    start, end = (((t - trace.origin).total_seconds() if isinstance(t, datetime) else t) for t in (cfg.start, cfg.end))
    if start is not None and end is not None and end <= start:
        raise ValueError(f"the time window is empty: its end ({_when(cfg.end)}) is not after its start "
                         f"({_when(cfg.start)})")
    jobs = select(trace, start, end, cfg.sample, cfg.seed)
    if not jobs:
        raise TraceError(f"{cfg.trace}: no jobs in the selected window/sample")
    notes = list(trace.notes)
    if trace.skipped:
        notes.append("rows of no finished GPU job left out: "
                     + ", ".join(f"{n} {why}" for why, n in trace.skipped.items()))
    if trace.bad_rows:
        notes.append(f"skipped {len(trace.bad_rows)} bad row(s): " + _by_line(trace.bad_rows))
    if tput.cannot_run:
        notes.append(f"{len(tput.cannot_run)} job type(s) with no {cfg.gpu_type} throughput (solo rate 0: they do not "
                     f"run on it) are no choice: {', '.join(tput.cannot_run)}")
    if len(tput.suspect_pairs):
        notes.append(f"{len(tput.suspect_pairs)} suspect {cfg.gpu_type} pair entries (packed == solo): {cfg.suspect}")
    skipped: list[tuple[int, str]] = []
    too_big: list[tuple[int, str]] = []
    clusters: dict = {}
    if cfg.machines is not None:
        if not 1 <= cfg.machines <= MAX_MACHINES:
            raise ValueError(f"machines must be in 1..{MAX_MACHINES:,}, not {cfg.machines}")
        cap = cfg.machines * cfg.gpus_per_machine
        ok = [j for j in jobs if j.num_gpus <= cap]
        too_big += [(j.line, f"needs {j.num_gpus} GPUs, cluster has {cap}") for j in jobs if j.num_gpus > cap]
        clusters["cluster"] = (cfg.machines, ok)
        if cfg.only:
            _check_only(cfg.only, clusters)
    else:
        if cfg.vcs is None:
            raise ValueError("the philly layout needs a VC file (or give machines=N for one cluster)")
        sizes = load_vcs(cfg.vcs)
        if not cfg.vc_scale > 0:
            raise ValueError(f"vc_scale must be positive, not {cfg.vc_scale}")
        if cfg.vc_scale != 1.0:
            # (judged before rounding: a product past the largest float is infinite, which round() refuses)
            too_big = max(sizes.values()) * cfg.vc_scale > 2 * MAX_MACHINES
            sizes = {v: 0 if too_big else max(1, round(n * cfg.vc_scale)) for v, n in sizes.items()}
            if too_big or max(sizes.values()) > MAX_MACHINES:
                raise ValueError(f"vc_scale {cfg.vc_scale} makes a VC of more than {MAX_MACHINES:,} machines")
            notes.append(f"VC sizes scaled by {cfg.vc_scale}: {sum(sizes.values())} machines in all")
        smallest = min(sizes.values())
        by_vc: dict = {}
        for j in jobs:
            by_vc.setdefault(j.vc, []).append(j)
        # Judged on the whole trace: choosing one absent VC is not another cluster's trace.
        if by_vc and all(v not in sizes for v in by_vc) and cfg.unknown_vc != "skip":
            unknown = sorted(by_vc)
            # Another cluster's trace against Philly's layout: every job would run on a made-up cluster.
            which = ("has no VC column" if unknown == [ONE_VC] else
                     f"has none of its VC(s) ({', '.join(unknown[:5])}{', ...' if len(unknown) > 5 else ''}) in "
                     f"the layout {cfg.vcs}")
            raise TraceError(f"{cfg.trace} {which}: give its own layout (--vcs) or one cluster for every job "
                             f"(--machines N)")
        if cfg.only:
            # before anything is said about the VCs: the notes speak of what is simulated
            _check_only(cfg.only, by_vc)
            by_vc = {v: by_vc[v] for v in cfg.only}
            notes.append(f"only VC(s) {', '.join(cfg.only)}: {sum(map(len, by_vc.values()))} of {len(jobs)} jobs")
        unknown = sorted(v for v in by_vc if v not in sizes)
        if unknown:
            count = sum(len(by_vc[v]) for v in unknown)
            if cfg.unknown_vc == "refuse":
                raise TraceError(f"{cfg.trace}: {count} job(s) in VC(s) absent from {cfg.vcs}: {', '.join(unknown)}")
            if cfg.unknown_vc == "skip":
                for v in unknown:
                    skipped += [(j.line, f"VC {v} not in {cfg.vcs}") for j in by_vc.pop(v)]
                notes.append(f"skipped {count} job(s) of VC(s) absent from the layout: {', '.join(unknown)}")
        for v, js in sorted(by_vc.items()):
            n = sizes.get(v, smallest)
            cap = n * cfg.gpus_per_machine
            too_big += [(j.line, f"needs {j.num_gpus} GPUs, VC {v} has {cap}") for j in js if j.num_gpus > cap]
            clusters[v] = (n, [j for j in js if j.num_gpus <= cap])
        if unknown and cfg.unknown_vc == "smallest":
            run = sum(len(clusters[v][1]) for v in unknown)
            notes.append(f"{run} job(s) of VC(s) absent from the layout ({', '.join(unknown)}) each run on "
                         f"a cluster of {smallest} machines (the smallest listed VC)")
    if too_big:
        if cfg.bad_rows == "refuse":
            raise TraceError(f"{cfg.trace}: {len(too_big)} job(s) can never fit their cluster: " +
                             _by_line(too_big) +
                             ". Skip them with --bad-rows skip (bad_rows='skip'), or give larger clusters "
                             "(--vcs, --vc-scale, --machines).")
        notes.append(f"skipped {len(too_big)} job(s) larger than their cluster: " + _by_line(too_big))
        skipped += too_big
    if cfg.machines is None and any(js for _, js in clusters.values()):
        # (one cluster for all jobs, --machines, runs them all or none: nothing to say)
        idle = {v: n for v, (n, js) in clusters.items() if not js}
        if not cfg.only:
            idle.update((v, n) for v, n in sizes.items() if v not in clusters)
        if idle:
            names = sorted(idle)
            notes.append(f"no job runs in VC(s) {', '.join(names[:10])}{', ...' if len(names) > 10 else ''}: their "
                         f"{sum(idle.values()) * cfg.gpus_per_machine} GPUs are left out of utilisation and makespan, "
                         f"which are those of the clusters that ran jobs")
    if not any(js for _, js in clusters.values()):
        # A run of no jobs would print an empty table and exit 0, as if all had gone well.
        why = "; ".join(dict.fromkeys(msg for _, msg in skipped[:10])) or "the trace has no jobs"
        raise TraceError(f"{cfg.trace}: no job is left to simulate ({why})")
    return Prepared(clusters=clusters, tput=tput, notes=notes, skipped=skipped)


def _by_line(rows: list) -> str:
    """The first ten of (line, what) rows, as a note or an error says them."""
    return "; ".join(f"line {ln}: {msg}" for ln, msg in rows[:10])


_WORK: dict = {}
WORKER_POLL_S = 1.0     # how often a wait for a worker's result looks whether the workers are all alive


class WorkerDied(RuntimeError):
    """A worker process ended mid-run (killed, out of memory): its task will never be done."""


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_one(task) -> RunResult:
    policy_name, cluster, params = task
    prep: Prepared = _WORK["prep"]
    cfg: SimConfig = _WORK["cfg"]
    n_machines, jobs = prep.clusters[cluster]
    machines = make_machines(n_machines, cfg.gpus_per_machine, gpu_type=cfg.gpu_type)
    policy = make_policy(policy_name, **params.get(policy_name, {}))
    t0 = time.perf_counter()
    eng = Engine(machines, jobs, policy, prep.tput, cfg.costs, cluster_name=cluster, timer_fn=time.perf_counter)
    res = eng.run()
    res.counters["wall_s"] = time.perf_counter() - t0
    return res


def simulate(cfg: SimConfig, policies: list[str], prep: Prepared | None = None,
             params: dict | None = None) -> dict[str, list[RunResult]]:
    """Run every policy on every cluster; returns {policy: [RunResult per cluster]}."""
    prep = prep or prepare(cfg)
    params = params or {}
    for p in policies:
        make_policy(p, **params.get(p, {}))      # unknown names and bad parameters fail before any work
    # Biggest clusters first, so the slowest tasks do not start last.
    order = sorted(prep.clusters, key=lambda c: -len(prep.clusters[c][1]))
    tasks = [(p, c, params) for c in order for p in policies if prep.clusters[c][1]]
    _WORK["prep"], _WORK["cfg"] = prep, cfg
    out: dict[str, list[RunResult]] = {p: [] for p in policies}
    if cfg.workers > 1 and len(tasks) > 1 and "fork" in mp.get_all_start_methods():
        # (Ctrl-C is the parent's to report once; leaving the block terminates the workers)
        before = set(mp.active_children())
        with mp.get_context("fork").Pool(min(cfg.workers, os.cpu_count() or 1, len(tasks)), _ignore_interrupts) \
                as pool:
            workers = [p for p in mp.active_children() if p not in before]
            results = pool.imap_unordered(_run_one, tasks)
            for _ in tasks:
                res = _next(results, workers)
                out[res.policy].append(res)
    else:
        for t in tasks:
            res = _run_one(t)
            out[res.policy].append(res)
    for p in out:
        out[p].sort(key=lambda r: r.cluster)
    return out


def _next(results, workers: list) -> RunResult:
    """The next result; WorkerDied once a worker has ended. The pool starts another in a killed one's place and
    never does its task again: the run waited for ever."""
    while True:
        try:
            return results.next(timeout=WORKER_POLL_S)
        except mp.TimeoutError:
            gone = next((p for p in workers if p.exitcode is not None), None)
            if gone is not None:
                how = f"killed by signal {-gone.exitcode}" if gone.exitcode < 0 else f"exit status {gone.exitcode}"
                raise WorkerDied(f"worker process {gone.pid} ended mid-run ({how}; out of memory?): its clusters "
                                 f"were not simulated") from None


def report(cfg: SimConfig, prep: Prepared, out: dict, baseline: str = "fifo") -> dict:
    """Everything a result file holds: configuration, notes, per-policy summary and JCT ratio to the baseline."""
    from dataclasses import asdict

    from gmux.cluster.sim.metrics import jct_ratio, summarize
    summaries = {p: summarize(r) for p, r in out.items()}
    ratios = {p: jct_ratio(r, out[baseline]) for p, r in out.items() if baseline in out and p != baseline}
    conf = asdict(cfg)
    for k in ("start", "end"):
        if isinstance(conf[k], datetime):
            conf[k] = conf[k].isoformat(sep=" ")
    return {"config": conf, "notes": prep.notes, "skipped_jobs": len(prep.skipped),
            "clusters": {c: {"machines": n, "jobs": len(js)} for c, (n, js) in prep.clusters.items()},
            "costs": cfg.costs.table(), "summary": summaries, "jct_ratio_to_" + baseline: ratios}
