"""What a trace tells about a job's length before it has run (issue 13: is the gap to SRTF information?).

For each class of jobs a policy tells apart without durations (one VC, one GPU count; at least 100 jobs), the share
of the variance of log(duration) that each feature known at arrival explains (R^2 of the class split by the
feature: 1 - within-group variance / total), beside what the same split explains by chance (the feature shuffled,
mean of 20 draws: more groups explain more by chance). Features:

  hour      hour of submission, in six 4-hour groups
  weekday   day of the week
  gap       time since the class's previous submission (log10 seconds, whole groups)
  position  the job's place in its sweep (submissions of its class less than 30 minutes apart; log2 groups)
  sibling   the previous member of its sweep's log(duration) (a linear fit's R^2): known only once that member has
            ended, so an upper bound on what sweep evidence can give; over the jobs that have such a member

The summary row weighs each class by its job-hours (where a scheduler's gains and losses are). Writes
benchmarks/results/trace_features.json; the last line is
`trace_features: best_at_arrival_excess_r2=<r> sibling_r2=<r> seconds=<n>`, where the first is the best feature's
job-hour-weighted R^2 above chance.

Run: .venv/bin/python benchmarks/trace_features.py [--trace ../shared/traces/philly.csv] [--min-jobs 100]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from datetime import timedelta

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

from gmux.cli.argtypes import nonneg_int, output_dir  # noqa: E402
from gmux.cluster.sim.trace import TraceError, load_trace  # noqa: E402
from gmux.util.atomic import atomic_open  # noqa: E402
from gmux.util.text import printable  # noqa: E402

SWEEP_GAP_S = 1800.0
AT_ARRIVAL = ("hour", "weekday", "gap", "position")
SHUFFLES = 20


def explained(y: np.ndarray, groups: np.ndarray) -> float:
    """The share of y's variance between the groups."""
    total = y.var()
    if total == 0:
        return 0.0
    _, index = np.unique(groups, return_inverse=True)
    means = np.bincount(index, weights=y) / np.bincount(index)
    return float(1 - ((y - means[index]) ** 2).mean() / total)


def features(submits: np.ndarray, origin) -> dict:
    """Each feature known at arrival, as group labels, for one class's jobs in submission order."""
    when = [origin + timedelta(seconds=float(s)) for s in submits]
    gaps = np.diff(submits, prepend=-math.inf)
    position = np.zeros(len(submits), dtype=int)
    for i in range(1, len(submits)):
        position[i] = position[i - 1] + 1 if gaps[i] <= SWEEP_GAP_S else 0
    return {"hour": np.array([w.hour // 4 for w in when]), "weekday": np.array([w.weekday() for w in when]),
            "gap": np.clip(np.floor(np.log10(np.maximum(gaps, 1.0))), 0, 7).astype(int),
            "position": np.minimum(np.floor(np.log2(position + 1)), 5).astype(int)}


def classes(trace_path: str, min_jobs: int, seed: int = 0) -> list[dict]:
    trace = load_trace(trace_path, bad_rows="skip")
    by_class: dict = {}
    for j in sorted(trace.jobs, key=lambda j: j.submit):
        by_class.setdefault((j.vc, j.num_gpus), []).append(j)
    rng = np.random.default_rng(seed)
    out = []
    for (vc, gpus), jobs in sorted(by_class.items()):
        if len(jobs) < min_jobs:
            continue
        submits = np.array([j.submit for j in jobs])
        y = np.log(np.array([j.duration for j in jobs]))
        row = {"vc": vc, "gpus": gpus, "jobs": len(jobs), "job_hours": sum(j.duration * gpus for j in jobs) / 3600,
               "sd_log": float(y.std())}
        for name, groups in features(submits, trace.origin).items():
            row[name] = explained(y, groups)
            row[name + "_chance"] = float(np.mean([explained(y, rng.permutation(groups)) for _ in range(SHUFFLES)]))
        follows = np.diff(submits) <= SWEEP_GAP_S
        row["with_sibling"] = float(follows.mean()) if len(follows) else 0.0     # (one job: none; NaN in the JSON)
        row["sibling"] = float(np.corrcoef(y[:-1][follows], y[1:][follows])[0, 1] ** 2) \
            if follows.sum() >= 10 and y[1:][follows].std() > 0 and y[:-1][follows].std() > 0 else None
        out.append(row)
    return out


def weighted(rows: list[dict], key) -> float | None:
    """The job-hour-weighted mean of `key` over the rows that have it; None where none has (no class has a
    sweep of ten jobs to fit a sibling's R^2 on: a small trace, or a small --min-jobs, ended in a ZeroDivisionError)."""
    pairs = [(r["job_hours"], key(r)) for r in rows if key(r) is not None]
    total = sum(w for w, _ in pairs)
    return sum(w * v for w, v in pairs) / total if total > 0 else None


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", help="a Philly-format trace (default: ../shared/traces/philly.csv, skipped where absent)")
    p.add_argument("--min-jobs", type=nonneg_int, default=100)
    p.add_argument("--out", default=os.path.join(HERE, "results", "trace_features.json"))
    a = p.parse_args(argv)
    try:
        output_dir(os.path.dirname(os.path.abspath(a.out)))
    except argparse.ArgumentTypeError as e:
        p.error(f"--out {a.out}: {e}")
    if a.trace is not None and not os.path.isfile(a.trace):
        # (skipped in silence with exit 0, as the default is where ../shared is not: a mistyped path hid)
        p.error(f"--trace {a.trace}: " + ("a directory, not a file" if os.path.isdir(a.trace) else "no such file"))
    if a.trace is None:
        a.trace = os.path.join(ROOT, "..", "shared", "traces", "philly.csv")
        if not os.path.isfile(a.trace):
            print(f"trace_features: skipped: no trace at {a.trace} (../shared/traces beside the project)")
            return 0
    t0 = time.perf_counter()
    try:
        rows = classes(a.trace, a.min_jobs)
    except TraceError as e:
        print(f"trace_features: {printable(e)}", file=sys.stderr)
        return 2
    if not rows:
        print(f"trace_features: no class (a VC and a GPU count) has {a.min_jobs} jobs or more in {a.trace}: give a "
              f"smaller --min-jobs", file=sys.stderr)
        return 2
    # A VC's name and the file's are the trace's words: shown as Text, never read as rich markup ('[/x]' was a
    # MarkupError), and with their control characters escaped (an escape code drove the terminal).
    t = Table(title=Text(f"R^2 of log(duration) within each class (chance in brackets), "
                         f"{printable(os.path.basename(a.trace))}"), title_justify="left")
    for col in ("VC", "GPUs", "jobs", "job-h", "sd log", *AT_ARRIVAL, "sibling (after it ends)", "has one"):
        t.add_column(col, justify="left" if col == "VC" else "right")

    def cell(r, name):
        return f"{r[name]:.2f} ({r[name + '_chance']:.2f})"
    for r in rows:
        t.add_row(Text(printable(r["vc"])), str(r["gpus"]), str(r["jobs"]), f"{r['job_hours']:,.0f}",
                  f"{r['sd_log']:.2f}",
                  *(cell(r, n) for n in AT_ARRIVAL), "-" if r["sibling"] is None else f"{r['sibling']:.2f}",
                  f"{r['with_sibling']:.2f}")
    summary = {n: weighted(rows, lambda r, n=n: r[n]) for n in AT_ARRIVAL}
    summary.update({n + "_chance": weighted(rows, lambda r, n=n: r[n + "_chance"]) for n in AT_ARRIVAL})
    summary["sibling"] = weighted(rows, lambda r: r["sibling"])
    summary["with_sibling"] = weighted(rows, lambda r: r["with_sibling"])
    t.add_row("by job-hours", "", str(sum(r["jobs"] for r in rows)), f"{sum(r['job_hours'] for r in rows):,.0f}",
              "", *(f"{summary[n]:.2f} ({summary[n + '_chance']:.2f})" for n in AT_ARRIVAL),
              _shown(summary["sibling"]), _shown(summary["with_sibling"]))
    Console(width=200).print(t)
    best = max(summary[n] - summary[n + "_chance"] for n in AT_ARRIVAL)
    seconds = time.perf_counter() - t0
    with atomic_open(a.out, mode=0o644, text=True) as f:
        json.dump({"trace": a.trace, "classes": rows, "summary": summary, "seconds": seconds}, f, indent=1)
    sibling = "none" if summary["sibling"] is None else f"{summary['sibling']:.3f}"
    print(f"trace_features: best_at_arrival_excess_r2={best:.3f} sibling_r2={sibling} seconds={seconds:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
