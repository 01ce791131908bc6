"""Loading and validating the inputs of a simulation: the job trace, the cluster layout, the throughput table.

Every input here is untrusted: a bad row is reported with its line number and either skipped or the whole load
refused (`bad_rows="skip"|"refuse"`); a bad file raises TraceError naming the file and the problem.

Job types. philly.csv has no model names, so each job gets a job type from gavel_throughputs.json: a seeded
random choice (numpy's PCG64 seeded with `seed`, one draw per row in file order) among the types measured at the
job's scale factor (1, 2, 4 or 8 GPUs; jobs with other counts use the largest measured scale below theirs).
The same seed and file always give the same assignment, whatever window or sample is then selected.

Suspect V100 pairs. About 80 V100 pairs report a packed throughput exactly equal to the solo one (packing would
be free), mostly with ResNet-18. We treat an exact equality as a measurement artefact: by default
(`suspect="p100"`) the pair's slowdown ratios are taken from the same pair measured on P100, the closest GPU
in the table; `suspect="drop"` marks the pair unmeasured-and-unpackable; `suspect="keep"` believes them.
"""
from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from gmux.cluster.policies.api import PairRate

SCALES = (1, 2, 4, 8)


class TraceError(Exception):
    """An input file cannot be used; the message names the file and the problem."""


@dataclass(slots=True)
class TraceJob:
    job_id: int                 # 0-based row index in the file (stable across windows and samples)
    line: int                   # line number in the file, for messages
    submit: float               # seconds since the trace's first submission
    duration: float             # seconds the job ran alone (its work)
    num_gpus: int
    vc: str
    job_type: str = ""
    elastic: bool = False


@dataclass
class Trace:
    jobs: list[TraceJob]
    origin: datetime            # wall-clock time of submit == 0
    path: str
    bad_rows: list[tuple[int, str]] = field(default_factory=list)


def _parse_time(text: str) -> datetime:
    return datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S")


def load_trace(path: str, bad_rows: str = "refuse", max_report: int = 20) -> Trace:
    """Read a Philly-format CSV (timestamp,duration,num_gpus,gpu_time,cluster)."""
    if bad_rows not in ("refuse", "skip"):
        raise ValueError(f"bad_rows must be 'refuse' or 'skip', not {bad_rows!r}")
    if not os.path.isfile(path):
        raise TraceError(f"{path}: no such trace file")
    need = ("timestamp", "duration", "num_gpus", "cluster")
    rows: list[tuple[int, datetime, float, int, str]] = []
    bad: list[tuple[int, str]] = []
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{path}: empty file")
            header = [h.strip() for h in header]
            missing = [c for c in need if c not in header]
            if missing:
                raise TraceError(f"{path}: header lacks column(s) {', '.join(missing)} (has {', '.join(header)})")
            col = {c: header.index(c) for c in header}
            for line, row in enumerate(reader, start=2):
                if not row:
                    continue
                problem = None
                try:
                    if len(row) != len(header):
                        raise ValueError(f"{len(row)} fields, header has {len(header)}")
                    try:
                        ts = _parse_time(row[col["timestamp"]])
                    except ValueError:
                        raise ValueError(f"timestamp {row[col['timestamp']]!r} is not YYYY-MM-DD HH:MM:SS") from None
                    dur = float(row[col["duration"]])
                    if not math.isfinite(dur) or dur <= 0:
                        raise ValueError(f"duration {row[col['duration']]!r} is not a positive number")
                    g = float(row[col["num_gpus"]])
                    if not math.isfinite(g) or g != int(g) or g < 1:
                        raise ValueError(f"num_gpus {row[col['num_gpus']]!r} is not a positive integer")
                    g = int(g)
                    if "gpu_time" in col:
                        gt = float(row[col["gpu_time"]])
                        if not math.isfinite(gt) or abs(gt - dur * g) > 1e-6 * max(1.0, gt):
                            raise ValueError(f"gpu_time {row[col['gpu_time']]!r} != duration x num_gpus")
                    vc = row[col["cluster"]].strip()
                    if not vc:
                        raise ValueError("empty cluster")
                except ValueError as e:
                    problem = str(e)
                if problem is not None:
                    bad.append((line, problem))
                    continue
                rows.append((line, ts, dur, g, vc))
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not a text CSV file ({e})") from None
    except csv.Error as e:
        raise TraceError(f"{path}: malformed CSV ({e})") from None
    if bad and bad_rows == "refuse":
        shown = "; ".join(f"line {ln}: {msg}" for ln, msg in bad[:max_report])
        more = f" (and {len(bad) - max_report} more)" if len(bad) > max_report else ""
        raise TraceError(f"{path}: {len(bad)} bad row(s): {shown}{more}. Skip them with --bad-rows skip (bad_rows='skip').")
    if not rows:
        raise TraceError(f"{path}: no usable job rows")
    origin = min(r[1] for r in rows)
    jobs = [TraceJob(job_id=i, line=ln, submit=(ts - origin).total_seconds(), duration=d, num_gpus=g, vc=vc)
            for i, (ln, ts, d, g, vc) in enumerate(rows)]
    return Trace(jobs=jobs, origin=origin, path=path, bad_rows=bad)


def load_vcs(path: str) -> dict[str, int]:
    """Read philly_vc.csv (vc,node num) -> {vc: machines}."""
    if not os.path.isfile(path):
        raise TraceError(f"{path}: no such VC layout file")
    out: dict[str, int] = {}
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        if len(header) < 2 or header[0] != "vc":
            raise TraceError(f"{path}: expected header 'vc,node num', got {','.join(header)!r}")
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                n = int(row[1])
                if n < 1:
                    raise ValueError
            except (ValueError, IndexError):
                raise TraceError(f"{path}: line {line}: node count {row[1:2]} is not a positive integer") from None
            if row[0].strip() in out:
                raise TraceError(f"{path}: line {line}: VC {row[0]!r} listed twice")
            out[row[0].strip()] = n
    if not out:
        raise TraceError(f"{path}: no VCs")
    return out


def _type_key(name: str) -> tuple[str, int]:
    # Keys look like "('ResNet-18 (batch size 16)', 1)"; parse without eval (untrusted file).
    inner = name.strip()
    if not (inner.startswith("('") and inner.endswith(")") and "', " in inner):
        raise ValueError(f"unrecognised job type key {name!r}")
    model, _, scale = inner[2:-1].rpartition("', ")
    return model, int(scale)


class Throughputs:
    """gavel_throughputs.json for one GPU type: solo rates, pair rates (relative to solo), consolidation ratios."""

    def __init__(self, path: str, gpu_type: str = "v100", suspect: str = "p100"):
        if suspect not in ("p100", "drop", "keep"):
            raise ValueError(f"suspect must be 'p100', 'drop' or 'keep', not {suspect!r}")
        if not os.path.isfile(path):
            raise TraceError(f"{path}: no such throughput file")
        try:
            with open(path) as f:
                data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise TraceError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(data, dict) or gpu_type not in data:
            raise TraceError(f"{path}: no GPU type {gpu_type!r} (has {', '.join(sorted(data)) if isinstance(data, dict) else 'nothing'})")
        table = data[gpu_type]
        self.gpu_type = gpu_type
        self.solo: dict[str, float] = {}
        self.by_scale: dict[int, list[str]] = {s: [] for s in SCALES}
        try:
            for key, val in table.items():
                model, scale = _type_key(key)
                solo = float(val["null"])
                if not solo > 0:
                    raise ValueError(f"{key}: solo throughput {solo} is not positive")
                self.solo[key] = solo
                if scale in self.by_scale:
                    self.by_scale[scale].append(key)
        except (ValueError, KeyError, TypeError) as e:
            raise TraceError(f"{path}: {gpu_type}: {e}") from None
        for s, keys in self.by_scale.items():
            if not keys:
                raise TraceError(f"{path}: {gpu_type}: no job type at scale factor {s}")
            keys.sort()
        ref = data.get("p100", {})
        self.pairs: dict[tuple[str, str], PairRate] = {}
        self.no_fit: set[tuple[str, str]] = set()
        self.suspect_pairs: list[tuple[str, str]] = []
        for a, val in table.items():
            for b, pair in val.items():
                if b == "null":
                    continue
                if b not in self.solo or not (isinstance(pair, list) and len(pair) == 2):
                    raise TraceError(f"{path}: {gpu_type}: {a} -> {b}: expected a known type and [rate, rate]")
                ta, tb = float(pair[0]), float(pair[1])
                if ta == 0 and tb == 0:
                    self.no_fit.add((a, b))
                    continue
                ra, rb = ta / self.solo[a], tb / self.solo[b]
                if ta == self.solo[a] or tb == self.solo[b]:
                    self.suspect_pairs.append((a, b))
                    if suspect == "drop":
                        continue
                    if suspect == "p100":
                        alt = ref.get(a, {}).get(b)
                        if isinstance(alt, list) and len(alt) == 2 and alt != [0, 0]:
                            ra, rb = float(alt[0]) / float(ref[a]["null"]), float(alt[1]) / float(ref[b]["null"])
                        else:
                            continue
                self.pairs[(a, b)] = PairRate(min(ra, 1.0), min(rb, 1.0))
        self.unconsolidated: dict[str, float] = {}
        uncons = data.get(gpu_type + "_unconsolidated", {})
        for key, val in uncons.items():
            if key in self.solo and isinstance(val, dict) and "null" in val:
                # Above 1.0 is measurement noise: spreading a job never makes it faster.
                self.unconsolidated[key] = min(1.0, float(val["null"]) / self.solo[key])

    def pair(self, a: str, b: str) -> PairRate | None:
        return self.pairs.get((a, b))

    def fits(self, a: str, b: str) -> bool:
        return (a, b) not in self.no_fit and (b, a) not in self.no_fit

    @staticmethod
    def scale_of(num_gpus: int) -> int:
        return max(s for s in SCALES if s <= num_gpus)


def assign_types(trace: Trace, tput: Throughputs, seed: int = 0, elastic_fraction: float = 0.0) -> None:
    """Give each job a type (and, for a seeded fraction of single-machine jobs, elasticity), in file order."""
    if not 0.0 <= elastic_fraction <= 1.0:
        raise ValueError(f"elastic_fraction must be in [0, 1], not {elastic_fraction}")
    rng = np.random.Generator(np.random.PCG64(seed))
    picks = rng.random(len(trace.jobs))
    elastic = rng.random(len(trace.jobs))
    for j, u, e in zip(trace.jobs, picks, elastic):
        keys = tput.by_scale[tput.scale_of(j.num_gpus)]
        j.job_type = keys[int(u * len(keys))]
        j.elastic = bool(e < elastic_fraction)


def select(trace: Trace, start: float | None = None, end: float | None = None,
           sample: float | None = None, seed: int = 0) -> list[TraceJob]:
    """Jobs submitted in [start, end) seconds since the trace origin, then a seeded fraction of them."""
    jobs = trace.jobs
    if start is not None:
        jobs = [j for j in jobs if j.submit >= start]
    if end is not None:
        jobs = [j for j in jobs if j.submit < end]
    if sample is not None:
        if not 0.0 < sample <= 1.0:
            raise ValueError(f"sample must be in (0, 1], not {sample}")
        rng = np.random.Generator(np.random.PCG64(seed + 1))
        keep = rng.random(len(trace.jobs)) < sample   # drawn over the whole file: same job, same fate
        jobs = [j for j in jobs if keep[j.job_id]]
    return jobs
