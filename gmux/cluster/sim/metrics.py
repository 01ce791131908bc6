"""Results of a simulation: per-policy summaries, the JCT-ratio check against FIFO, a rich table and JSON.

Definitions (all times in seconds):
- JCT: finish - submit.
- Queueing: the time a job held no GPU at all (pending, or suspended), summed over its life. A packed or
  time-sliced job holds GPUs, so it is not queued, however slowly it runs: that shows as
- Slowed by sharing: JCT - queueing - solo run time, i.e. time on GPUs beyond running alone (time-slicing,
  packing, running spread over machines, and the stalls of resumes and migrations). Comparable across policies
  because queueing + slowed + solo time = JCT for every job (elastic jobs given more GPUs can go below zero).
- Time to first progress: first start - submit (what Gandiva's time-slicing exists to shorten).
- Makespan: last completion - first submission over all clusters (timers left after the last completion do not
  count).
- GPU utilisation: busy GPU-seconds / (GPUs x makespan). A GPU is busy while any job holds it, stalls included.
- Work utilisation: the jobs' work (solo GPU-seconds: duration x GPUs) / (GPUs x makespan), the clusters'
  capacity that went into training, counted at solo speed. Busy time counts a stalled or slowed GPU as used and a
  GPU shared by two jobs once, so packing that does the same work in fewer GPU-seconds lowers it; this one does
  not, and packing can lift it above 100% (two jobs on one GPU, each at more than half its solo speed). Every
  policy does the same work, so it ranks policies by makespan alone.
- Idle while jobs wait: GPU-seconds idle while some job was pending or suspended / (GPUs x makespan): the
  utilisation a policy left unused with work in hand (widths that do not fit the idle GPUs, fragmentation, a gang
  idled by a narrower job), apart from what the order of the last jobs costs once nothing waits.
- Suspends include the fluid count of time-slice switches (one per job per round of quanta); suspends per job
  divides them by the number of jobs.
"""
from __future__ import annotations

import json
import math

import numpy as np

from gmux.cluster.sim.engine import RunResult

COLS = ("job_id", "submit", "first_run", "finish", "gpus", "work", "suspends", "migrations", "packs", "held", "waited",
        "stalled")


def job_table(results: list[RunResult]) -> dict[str, np.ndarray]:
    rows = [r for res in results for r in res.jobs]
    if not rows:
        return {c: np.zeros(0) for c in COLS}
    arr = np.array(rows, dtype=float)
    return {c: arr[:, i] for i, c in enumerate(COLS)}


def summarize(results: list[RunResult]) -> dict:
    t = job_table(results)
    n = len(t["job_id"])
    if n == 0:
        return {"jobs": 0}
    jct = t["finish"] - t["submit"]
    queue = t["waited"]
    first = t["first_run"] - t["submit"]
    slowed = jct - queue - t["work"]
    start = min(r.start for r in results)
    end = max(r.end for r in results)
    span = max(end - start, 1e-9)
    gpus = sum(r.num_gpus for r in results)
    busy = sum(r.busy_gpu_s for r in results)
    c: dict = {}
    for r in results:
        for k, v in r.counters.items():
            c[k] = c.get(k, 0) + v
    useful = float((t["work"] * t["gpus"]).sum())
    return {
        "jobs": int(n),
        "avg_jct_s": float(jct.mean()),
        "p50_jct_s": float(np.percentile(jct, 50)),
        "p99_jct_s": float(np.percentile(jct, 99)),
        "avg_queue_s": float(queue.mean()),
        "p99_queue_s": float(np.percentile(queue, 99)),
        "avg_slowed_s": float(slowed.mean()),
        "avg_stall_s": float(t["stalled"].mean()),
        "avg_first_progress_s": float(first.mean()),
        "p99_first_progress_s": float(np.percentile(first, 99)),
        "makespan_s": float(span),
        "gpus": int(gpus),
        "utilisation": float(busy / (gpus * span)),
        "work_utilisation": useful / (gpus * span),
        "idle_while_waiting": float(sum(r.idle_waiting_gpu_s for r in results) / (gpus * span)),
        "useful_gpu_s": useful,
        "busy_gpu_s": float(busy),
        "suspends": int(round(float(t["suspends"].sum()))),
        "suspends_per_job": float(t["suspends"].sum() / n),
        "preemptions": int(c.get("suspends", 0)),
        "packs": int(c.get("packs", 0)),
        "unpacks": int(c.get("unpacks", 0)),
        "migrations": int(c.get("migrations", 0)),
        "grows": int(c.get("grows", 0)),
        "shrinks": int(c.get("shrinks", 0)),
        "decisions": int(sum(r.decisions for r in results)),
        "decide_s": float(sum(r.decide_s for r in results)),
        "sim_wall_s": float(sum(r.counters.get("wall_s", 0.0) for r in results)),
    }


def jct_ratio(results: list[RunResult], baseline: list[RunResult]) -> dict:
    """Per job JCT under `results` over JCT under `baseline` (same jobs): mean, p50, p99, max."""
    a, b = job_table(results), job_table(baseline)
    ja = dict(zip(a["job_id"].astype(int), a["finish"] - a["submit"]))
    jb = dict(zip(b["job_id"].astype(int), b["finish"] - b["submit"]))
    common = sorted(set(ja) & set(jb))
    if not common:
        return {}
    r = np.array([ja[j] / jb[j] for j in common])
    return {"mean": float(r.mean()), "p50": float(np.percentile(r, 50)), "p99": float(np.percentile(r, 99)),
            "max": float(r.max()), "over_2": int((r > 2).sum())}


def utilisation_series(results: list[RunResult], max_points: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
    """(hours since the first submission, fraction of all clusters' GPUs busy) per bucket: an hour, or as many
    whole hours as keep the series within `max_points` (a trace that spans centuries still plots)."""
    end = max((r.end for r in results), default=0.0)
    if end <= 0:
        return np.zeros(0), np.zeros(0)
    b = 3600.0 * max(1, math.ceil(end / 3600.0 / max_points))
    edges = np.arange(math.ceil(end / b) + 1) * b
    busy = np.zeros(len(edges) - 1)
    for r in results:
        if r.busy_steps:
            t, level = (np.array(x, dtype=float) for x in zip(*r.busy_steps))
            # busy GPU-seconds up to each change point, then up to each bucket edge
            done = np.concatenate(([0.0], np.cumsum(level[:-1] * np.diff(t))))
            x = np.minimum(edges, r.end)      # nothing runs after the last completion
            i = np.searchsorted(t, x, side="right") - 1
            at_edges = np.where(i >= 0, done[i.clip(0)] + level[i.clip(0)] * (x - t[i.clip(0)]), 0.0)
            busy += np.diff(at_edges)
    return edges[:-1] / 3600.0, busy / (sum(r.num_gpus for r in results) * b)


def render_table(summaries: dict[str, dict], ratios: dict[str, dict] | None = None, title: str = "") -> str:
    """The results as a rich table, returned as text (so callers can print or log it)."""
    import io

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title) if title else None)     # a title naming a file is not read as markup
    cols = [("policy", None), ("avg JCT h", "avg_jct_s"), ("p50 JCT h", "p50_jct_s"), ("p99 JCT h", "p99_jct_s"),
            ("avg queue h", "avg_queue_s"), ("slowed h", "avg_slowed_s"), ("p99 1st prog h", "p99_first_progress_s"),
            ("makespan d", "makespan_s"), ("util %", "utilisation"), ("work %", "work_utilisation"),
            ("suspends", "suspends"), ("packs", "packs"), ("unpacks", "unpacks"), ("migr.", "migrations"),
            ("p99 JCT/fifo", None)]
    rows = []
    for pol, s in summaries.items():
        if not s.get("jobs"):
            continue
        row = [pol]
        for name, key in cols[1:-1]:
            v = s[key]
            if key in ("utilisation", "work_utilisation"):
                row.append(f"{100 * v:.1f}")
            elif key == "makespan_s":       # (a short trace's in days to two figures, not 0.0)
                row.append(f"{v / 86400:.1f}" if v >= 86400 else f"{v / 86400:.2g}")
            elif key.endswith("_s"):
                row.append(f"{round(v / 3600, 2) + 0.0:.2f}")    # (+ 0.0: a rounding error shows no "-0.00")
            else:
                row.append(f"{v:,}")
        rr = (ratios or {}).get(pol)
        row.append(f"{rr['p99']:.2f}" if rr else "-")
        rows.append(row)
    # Each column as wide as its widest figure and its header, narrowed (its header wrapping) while the table is
    # wider than 160 characters, the column with the most to spare first, never below a figure or a header word.
    figures = [max(len(r[i]) for r in rows) for i in range(len(cols))] if rows else [0] * len(cols)
    widths = [max(f, len(name)) for f, (name, _) in zip(figures, cols)]
    least = [max([f] + [len(w) for w in name.split()]) for f, (name, _) in zip(figures, cols)]
    while sum(widths) + 3 * len(cols) + 1 > 160 and widths != least:
        i = max(range(len(cols)), key=lambda k: widths[k] - least[k])
        widths[i] -= 1
    for (name, _), width in zip(cols, widths):
        table.add_column(name, justify="right" if name != "policy" else "left", width=width)
    for row in rows:
        table.add_row(*row)
    console = Console(width=max(160, sum(widths) + 3 * len(cols) + 1), record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def write_json(path: str, payload: dict) -> None:
    """Atomic write (gmux.util.atomic), so a reader never sees half a result file."""
    import os

    from gmux.util.atomic import atomic_open

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_open(path, mode=0o644, text=True) as f:   # a result file is for everyone to read
        dump_json(payload, f)


def dump_json(payload: dict, f) -> None:
    """The results as JSON into an open text file (a results file, or standard output under `--json -`)."""
    json.dump(_plain(payload), f, indent=1, sort_keys=True)


def _plain(o):
    """`o` as JSON can hold it: NaN and infinities (no JSON number) become null, numpy numbers Python's."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return o
