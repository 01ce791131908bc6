"""Loading and validating the inputs of a simulation: the job trace and the cluster layout (throughputs.py: the
throughput table).

Every input here is untrusted: a bad row is reported with its line number and either skipped or the whole load
refused (`bad_rows="skip"|"refuse"`); a bad file raises TraceError naming the file and the problem.
"""
from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np

from gmux.cluster.sim.lines import LineTooLong, bounded_lines, first_undecodable


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
    user: str = ""              # who submitted it, where the trace says ("": not known)


@dataclass
class Trace:
    jobs: list[TraceJob]
    origin: datetime            # wall-clock time of submit == 0
    path: str
    bad_rows: list[tuple[int, str]] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)   # rows that are no finished GPU job: why -> how many
    notes: list[str] = field(default_factory=list)           # the choices the loader made about the data


# What each column means, under the names published GPU-cluster traces give it: Philly's as the Pollux artifact
# converted it (this loader's first format), Helios' and Acme's (SenseTime and Shanghai AI Lab: submit_time,
# gpu_num, vc, user, start_time, end_time, duration), Alibaba PAI's task table (inst_num instances, each asking for
# plan_gpu), Alibaba's openb pod list (creation_time, scheduled_time, deletion_time, num_gpu), and common
# spellings. `columns=` names others. Header names are matched whatever their case.
COLUMNS = {
    "submit": ("timestamp", "submit_time", "submitted_time", "submission_time", "creation_time"),
    "duration": ("duration", "run_time", "runtime"),
    "gpus": ("num_gpus", "gpu_num", "gpus", "num_gpu", "gpu_count", "plan_gpu"),
    "vc": ("cluster", "vc", "virtual_cluster"),
    "start": ("start_time", "scheduled_time"),
    "end": ("end_time", "deletion_time"),
    "instances": ("inst_num", "num_instances", "instance_num"),
    "user": ("user", "user_id", "user_name", "username"),
}
ONE_VC = "all"      # the VC of every job of a trace without a VC column
# the times a datetime can show (a trace's origin is one)
EARLIEST, LATEST = (datetime(*ymd, tzinfo=timezone.utc).timestamp() for ymd in ((1, 1, 2), (9999, 12, 31)))
# A longer run is a corrupt field: one such job would hold its GPUs for the whole simulated span.
MAX_DURATION = 100 * 365.25 * 86400
# A shorter run is a corrupt field too, and a simulated clock thousands of years from the trace's origin cannot
# tell it from none (its job would end as it arrives, with a JCT of 0).
MIN_DURATION = 1e-3
# More machines than any cluster has: a VC this large is a corrupt field, and building it would exhaust memory.
MAX_MACHINES = 100_000
MAX_GPUS_PER_MACHINE = 64      # beyond any machine built; a larger count is a typo, not a cluster
MAX_JOB_GPUS = MAX_MACHINES * MAX_GPUS_PER_MACHINE
# How many units of a GPU column make one GPU. The simulator places whole GPUs, so a job asking for part of one
# gets a whole one (rounded up).
GPU_UNITS = {"gpus": 1, "percent": 100, "milli": 1000}
# GPU columns whose published meaning is a part of a GPU: Alibaba PAI 2020's plan_gpu (percent: 50 is half a
# GPU, 800 eight) and Alibaba's 2023 openb pod list's gpu_milli (thousandths), read so under gpu_unit="auto".
UNIT_OF_COLUMN = {"plan_gpu": "percent", "gpu_milli": "milli"}
# openb gives a pod's GPUs as num_gpu (whole) and gpu_milli (the share of each it asks for).
SHARE_COLUMN = "gpu_milli"
# Seconds per unit of a trace's numeric times and durations (dates are dates whatever the unit): Google's
# traces count microseconds, many loggers milliseconds.
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
# Half a trace's jobs running longer than this says its times are not in seconds (a note, not a refusal).
LONG_MEDIAN = 30 * 86400


class _Times:
    """A trace's time values: all dates and times (ISO 8601, as YYYY-MM-DD HH:MM:SS) or all seconds (a Unix
    time, or since any origin), whichever its first time has; dates all with a zone offset or all without. A
    value of the other kind is a bad row: reading a mix would shift jobs by the offset, silently."""

    def __init__(self, scale: float = 1.0):
        self.scale = scale      # seconds per numeric unit (TIME_UNITS)
        self.numeric: bool | None = None
        self.zoned: bool | None = None
        self.decided_by: int | None = None     # the line whose times fixed the kind and the zone
        self._line: int | None = None
        self._before_row = (None, None, None)

    def row(self, line: int) -> None:
        """A row begins: what its values fix stands only if it is accepted (`reject`)."""
        self._line = line
        self._before_row = (self.numeric, self.zoned, self.decided_by)

    def reject(self) -> None:
        """The row is bad: a bad row decides nothing, even with its times well formed."""
        self.numeric, self.zoned, self.decided_by = self._before_row

    def parse(self, what: str, text: str) -> float:
        """Seconds since the Unix epoch (dates and times without a zone are taken as UTC). The trace's kind
        and zone are fixed by its first accepted row."""
        text = text.strip()
        zoned = None
        numeric = _DECIMAL.fullmatch(text) is not None
        if numeric:
            value = float(text) * self.scale
        else:
            try:
                when = datetime.fromisoformat(text)
            except ValueError:
                raise ValueError(f"{what} {text!r} is neither a date and time (YYYY-MM-DD HH:MM:SS) nor "
                                 f"seconds") from None
            zoned = when.tzinfo is not None
            if self.zoned is not None and zoned != self.zoned:
                raise ValueError(f"{what} {text!r} {'has a' if zoned else 'has no'} zone offset, the trace's "
                                 f"first date (line {self.decided_by}) {'has one' if self.zoned else 'has none'}")
            when = when if zoned else when.replace(tzinfo=timezone.utc)
            value = when.timestamp()
        if self.numeric is not None and numeric != self.numeric:
            raise ValueError(f"{what} {text!r} is {'seconds' if numeric else 'a date'}, the trace's first row "
                             f"(line {self.decided_by}) {'seconds' if self.numeric else 'a date'}")
        if not EARLIEST <= value <= LATEST:
            hint = " (milliseconds or microseconds since the epoch? say so with --time-unit ms or us)" \
                if numeric and self.scale == 1.0 and LATEST < value <= 1e6 * LATEST else ""
            raise ValueError(f"{what} {text!r} is not a time from 0001-01-02 to 9999-12-31 00:00 UTC, the times "
                             f"a date can show with a day to spare for zones{hint}")
        if self.numeric is None or (zoned is not None and self.zoned is None):
            self.decided_by = self._line
        self.numeric = numeric
        if zoned is not None:
            self.zoned = zoned
        return value


def _resolve(path: str, header: list[str], columns: dict[str, str] | None) -> dict[str, int]:
    """Column meaning -> index in the header, from COLUMNS and the caller's `columns` (meaning -> name)."""
    unknown = set(columns or ()) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown column meaning(s) {', '.join(sorted(unknown))}: give some of "
                         f"{', '.join(COLUMNS)}")
    lower = [h.lower() for h in header]
    found: dict[str, int] = {}
    for meaning, names in COLUMNS.items():
        if columns and meaning in columns:
            if columns[meaning].strip().lower() not in lower:
                raise TraceError(f"{path}: no column {columns[meaning]!r} (given for {meaning}; the header has "
                                 f"{', '.join(header)})")
            found[meaning] = lower.index(columns[meaning].strip().lower())
            continue
        present = [n for n in names if n in lower]
        if len(present) > 1:
            raise TraceError(f"{path}: columns {' and '.join(repr(header[lower.index(n)]) for n in present)} could "
                             f"each be the {meaning}: say which with --columns {meaning}=NAME")
        if present:
            found[meaning] = lower.index(present[0])
    if "gpus" not in found and SHARE_COLUMN in lower:
        found["gpus"] = lower.index(SHARE_COLUMN)       # thousandths of one GPU (openb's GPU-sharing pods)
    twice = sorted({header[i] for i in found.values() if lower.count(lower[i]) > 1})
    if twice:
        raise TraceError(f"{path}: the header has column(s) {', '.join(map(repr, twice))} more than once: which "
                         f"one holds the values cannot be told")
    by_index: dict[int, list[str]] = {}
    for meaning, i in found.items():
        by_index.setdefault(i, []).append(meaning)
    for i, meanings in by_index.items():
        if len(meanings) > 1 and set(meanings) != {"submit", "start"}:    # arrival at launch is a reading
            raise TraceError(f"{path}: column {header[i]!r} cannot be both {' and '.join(meanings)}: "
                             f"give each meaning its own column (--columns MEANING=NAME)")
    if "submit" not in found and "start" in found:
        found["submit"] = found["start"]        # PAI's task table: a task's launch is all it tells of its arrival
    missing = [m for m in ("submit", "gpus") if m not in found]
    if "duration" not in found and not {"start", "end"} <= set(found):
        missing.append("duration")
    if missing:
        headless = not found and any(math.isfinite(_number(h)) for h in header)
        other = next((name for sep, name in ((";", "semicolons"), ("\t", "tabs")) if len(header) == 1
                      and sep in header[0]), None)
        shown = ", ".join(header[:20]) + (f", ... ({len(header)} in all)" if len(header) > 20 else "")
        raise TraceError(f"{path}: header lacks column(s) for {', '.join(missing)}; names understood: " +
                         "; ".join(f"{m}: {', '.join(COLUMNS[m])}" for m in missing) +
                         " (gmux-sim --columns MEANING=NAME names another)" +
                         (f"; its fields are separated by {other}: gmux-sim reads commas" if other else "") +
                         ("; its first line looks like data: a trace published without a header line (Alibaba's "
                          "give theirs in a separate .header file) needs one put first" if headless else "") +
                         f". It has: {shown}")
    return found


# Python's float() also reads digits of other scripts ('٣' is 3) and underscores ('1_0' is 10): a trace that
# spells a number so was not written by a cluster's logger, and reading it would hide that.
_DECIMAL = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*|\s*[+-]?(inf|infinity|nan)\s*",
                      re.ASCII | re.IGNORECASE)


def _number(text: str) -> float:
    """A numeric field, in ASCII; NaN for one that is not a number, which the caller reports in its own words."""
    return float(text) if _DECIMAL.fullmatch(text) else math.nan


def _run_time(row: list[str], col: dict[str, int], name: dict[str, str],
              times: _Times) -> tuple[float, str | None, bool]:
    """Seconds the row's job ran, from its duration or else from end - start; or 0 and why the row is no finished
    job (it never started, or has not ended); and whether a duration given beside start and end disagrees with
    them by more than a second or 1%. `name`: the header's name of each column, for messages."""
    text = row[col["duration"]].strip() if "duration" in col else ""
    start, end = (row[col[k]].strip() if k in col else "" for k in ("start", "end"))
    if start and not end and "end" in col:
        return 0.0, "unfinished", False        # still running when the trace was taken: a duration is only its age
    span = None
    if start and end:
        span = times.parse(name["end"], end) - times.parse(name["start"], start)
        if span < 0:
            raise ValueError(f"{name['end']} {end!r} is before {name['start']} {start!r}")
    if text:
        dur = _number(text) * times.scale
        if not math.isfinite(dur) or dur < 0:
            raise ValueError(f"{name['duration']} {text!r} is not a number >= 0")
    elif span is not None:
        dur = span
    elif "start" in col and "end" in col:
        return 0.0, "never ran", False
    else:
        raise ValueError(f"empty {name['duration']}")
    if dur > MAX_DURATION:
        raise ValueError(f"duration {dur:.3g} s is more than 100 years" +
                         (" (are the trace's times not seconds? --time-unit ms or us)" if times.scale == 1.0 else ""))
    if 0 < dur < MIN_DURATION:
        raise ValueError(f"duration {dur:.3g} s is under a millisecond, finer than any cluster times a job")
    return dur, None, bool(text) and span is not None and abs(dur - span) > max(1.0, 0.01 * span)


def load_trace(path: str, bad_rows: str = "refuse", max_report: int = 20,
               columns: dict[str, str] | None = None, gpu_unit: str = "auto", time_unit: str = "s") -> Trace:
    """Read a job trace CSV: Philly's (timestamp,duration,num_gpus,gpu_time,cluster), Helios' or Acme's
    (submit_time, gpu_num, vc, duration or start_time and end_time), Alibaba PAI's task table (start_time, end_time,
    plan_gpu per instance, inst_num; its launch is a job's arrival), or any whose columns `columns` names
    (meaning -> column: submit, duration, gpus, vc, start, end, instances, user). `gpu_unit` says what the GPU column
    counts (GPU_UNITS; "auto": UNIT_OF_COLUMN by its name, else whole GPUs), `time_unit` what its numeric times and
    durations count (TIME_UNITS). Rows that are no finished GPU job (no or
    an empty GPU count, never started, not ended, duration 0) are not bad: they are counted in `skipped`. Each
    choice made about the data is stated in the trace's `notes`."""
    if bad_rows not in ("refuse", "skip"):
        raise ValueError(f"bad_rows must be 'refuse' or 'skip', not {bad_rows!r}")
    if gpu_unit != "auto" and gpu_unit not in GPU_UNITS:
        raise ValueError(f"gpu_unit must be auto or one of {', '.join(GPU_UNITS)}, not {gpu_unit!r}")
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {', '.join(TIME_UNITS)}, not {time_unit!r}")
    if not os.path.isfile(path):
        raise TraceError(f"{path}: no such trace file")
    rows: list[tuple[int, float, float, int, str, str]] = []
    bad: list[tuple[int, str]] = []
    skipped = {"no GPU": 0, "never ran": 0, "unfinished": 0}
    rounded = shared = disagree = 0
    times = _Times(TIME_UNITS[time_unit])
    reader = None
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(bounded_lines(f), strict=True)    # a quote left open would swallow the rest of the file
            header = next((r for r in reader if r), None)      # blank lines before the header are no header
            if header is None:
                raise TraceError(f"{path}: empty file")
            header = [h.strip() for h in header]
            lower = [h.lower() for h in header]
            col = _resolve(path, header, columns)
            name = {m: header[i] for m, i in col.items()}
            gpu_name = lower[col["gpus"]]
            unit = GPU_UNITS[UNIT_OF_COLUMN.get(gpu_name, "gpus") if gpu_unit == "auto" else gpu_unit]
            gpu_time = lower.index("gpu_time") if "gpu_time" in lower else None
            share = lower.index(SHARE_COLUMN) if SHARE_COLUMN in lower and gpu_name != SHARE_COLUMN else None
            line_end = reader.line_num
            for row in reader:
                line, line_end = line_end + 1, reader.line_num     # a quoted field may span lines
                if not row:
                    continue
                times.row(line)
                try:
                    if len(row) != len(header):
                        raise ValueError(f"{len(row)} fields, header has {len(header)}")
                    if col["submit"] == col.get("start") and not row[col["start"]].strip():
                        skipped["never ran"] += 1       # a task still waiting (PAI's), which has no arrival here
                        continue
                    ts = times.parse(name["submit"], row[col["submit"]])
                    dur, unfit, disagrees = _run_time(row, col, name, times)
                    text = row[col["gpus"]].strip()
                    need = _number(text) / unit if text else 0.0     # empty: a task that asked for no GPU
                    if not math.isfinite(need) or need < 0 or (unit == 1 and need != int(need)):
                        raise ValueError(f"{name['gpus']} {text!r} is not a " +
                                         ("whole number >= 0" if unit == 1 else "number >= 0"))
                    instances = _instances(row, col, name) if need else 1
                    g = math.ceil(need) * instances
                    if g > MAX_JOB_GPUS:
                        raise ValueError(f"{name['gpus']} {text!r} makes {g:,} GPUs, more than the largest "
                                         f"cluster gmux-sim builds ({MAX_JOB_GPUS:,})")
                    if gpu_time is not None:
                        gt = _number(row[gpu_time])
                        want = dur * need * instances / times.scale     # (in the trace's own units)
                        if not math.isfinite(gt) or abs(gt - want) > 1e-6 * max(1.0, gt):
                            raise ValueError(f"gpu_time {row[gpu_time]!r} is not the job's duration x GPUs "
                                             f"({want:.6g} in the trace's units, at --gpu-unit and --time-unit)")
                    part = _number(row[share]) if share is not None and g else 1000.0
                    if not 0 < part <= 1000:
                        raise ValueError(f"{header[share]} {row[share]!r} is not a number in (0, 1000]")
                    vc = row[col["vc"]].strip() if "vc" in col else ONE_VC
                    user = row[col["user"]].strip() if "user" in col else ""
                    if not vc:
                        raise ValueError("empty cluster")
                except ValueError as e:
                    times.reject()
                    bad.append((line, str(e)))
                    continue
                why = "no GPU" if g == 0 else unfit or ("never ran" if dur == 0 else None)
                if why:
                    skipped[why] += 1
                    continue
                rounded += math.ceil(need) != need
                disagree += disagrees
                shared += part < 1000
                rows.append((line, ts, dur, g, vc, user))
    except (UnicodeDecodeError, csv.Error, OSError, LineTooLong) as e:
        line = reader.line_num if reader and isinstance(e, csv.Error) else \
            first_undecodable(path) if isinstance(e, UnicodeDecodeError) else None
        raise unreadable(path, e, line) from None
    if bad and bad_rows == "refuse":
        shown = "; ".join(f"line {ln}: {msg}" for ln, msg in bad[:max_report])
        more = f" (and {len(bad) - max_report} more)" if len(bad) > max_report else ""
        raise TraceError(f"{path}: {len(bad)} bad row(s): {shown}{more}. Skip them with --bad-rows skip "
                         f"(bad_rows='skip').")
    if not rows:
        left_out = ", ".join(f"{n} {why}" for why, n in skipped.items() if n)
        left_out += f"{', ' if left_out else ''}{len(bad)} bad (skipped)" if bad else ""
        raise TraceError(f"{path}: no usable job rows" + (f" ({left_out})" if left_out else ""))
    notes = []
    if time_unit != "s":
        notes.append(f"numeric times and durations read as {'milliseconds' if time_unit == 'ms' else 'microseconds'}"
                     f" (--time-unit)")
    median = float(np.median([r[2] for r in rows]))
    if median > LONG_MEDIAN:
        notes.append(f"half the jobs run longer than {median / 86400:,.0f} days: if the trace's times are not in "
                     f"{'seconds' if time_unit == 's' else 'the unit given'}, say which with --time-unit")
    if unit != 1:
        notes.append(f"GPU column {header[col['gpus']]} read as {'percent' if unit == 100 else 'thousandths'} of "
                     f"a GPU (--gpu-unit); {rounded} job(s) asking for part of a GPU rounded up to whole GPUs")
    if share is not None:
        notes.append(f"{shared} job(s) ask for part of a GPU ({header[share]} < 1000); each runs on whole GPUs "
                     f"here (the simulator places whole GPUs)")
    if disagree:
        notes.append(f"{disagree} job(s) have a {name['duration']} that differs from {name['end']} - "
                     f"{name['start']} by more than a second or 1%; their {name['duration']} is used")
    if "instances" in col:
        notes.append(f"each job's GPUs are its {name['gpus']} per instance times its {name['instances']} "
                     f"instances")
    if col["submit"] == col.get("start"):
        notes.append(f"no submission time column: each job arrives at its {name['start']} (the wait it had in "
                     f"the traced cluster is not replayed)")
    if "user" in col:
        users = len({r[5] for r in rows if r[5]})
        notes.append(f"{users} user(s) in {name['user']}: a job's sweep is among its own user's jobs")
    if times.zoned is False:
        notes.append("the trace's times are dates without a zone, taken as UTC")
    first = min(r[1] for r in rows)
    origin = datetime.fromtimestamp(first, timezone.utc).replace(tzinfo=None)
    jobs = [TraceJob(job_id=i, line=ln, submit=ts - first, duration=d, num_gpus=g, vc=vc, user=user)
            for i, (ln, ts, d, g, vc, user) in enumerate(rows)]
    return Trace(jobs=jobs, origin=origin, path=path, bad_rows=bad,
                 skipped={k: n for k, n in skipped.items() if n}, notes=notes)


def _instances(row: list[str], col: dict[str, int], name: dict[str, str]) -> int:
    """How many instances of the row's task ran, each asking for the GPU column's count (1 without the column)."""
    if "instances" not in col:
        return 1
    text = row[col["instances"]].strip()
    n = _number(text)
    if not (math.isfinite(n) and n == int(n) and 0 <= n <= MAX_MACHINES):
        raise ValueError(f"{name['instances']} {text!r} is not a whole number of instances from 0 to "
                         f"{MAX_MACHINES:,}")
    return int(n)


def unreadable(path: str, e: Exception, line: int | None = None) -> TraceError:
    if isinstance(e, UnicodeDecodeError):
        where = f" at line {line}" if line else ""
        return TraceError(f"{path}: not a text file in UTF-8{where} (byte {e.object[e.start]:#04x}: "
                          f"{e.reason}); save it as UTF-8")
    if isinstance(e, LineTooLong):
        return TraceError(f"{path}: {e}")
    if isinstance(e, csv.Error):
        return TraceError(f"{path}: malformed CSV{f' by line {line}' if line else ''} ({e})")
    return TraceError(f"{path}: cannot be read ({e.strerror or e})")


def load_vcs(path: str) -> dict[str, int]:
    """Read philly_vc.csv (vc,node num) -> {vc: machines}."""
    if not os.path.isfile(path):
        raise TraceError(f"{path}: no such VC layout file")
    reader = None
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(bounded_lines(f), strict=True)
            return _read_vcs(path, reader)
    except (UnicodeDecodeError, csv.Error, OSError, LineTooLong) as e:
        line = reader.line_num if reader and isinstance(e, csv.Error) else \
            first_undecodable(path) if isinstance(e, UnicodeDecodeError) else None
        raise unreadable(path, e, line) from None


def _read_vcs(path: str, reader) -> dict[str, int]:
    out: dict[str, int] = {}
    header = [h.strip() for h in next(reader, [])]
    if len(header) < 2 or header[0].lower() != "vc":
        raise TraceError(f"{path}: expected header 'vc,node num', got {','.join(header)!r}")
    line_end = reader.line_num
    for row in reader:
        line, line_end = line_end + 1, reader.line_num
        if not row:
            continue
        n = _number(row[1]) if len(row) > 1 else math.nan
        if not (math.isfinite(n) and n == int(n) and n >= 1):
            raise TraceError(f"{path}: line {line}: node count " +
                             (f"{row[1]!r} is not a positive integer" if len(row) > 1 else "missing"))
        if not row[0].strip():
            raise TraceError(f"{path}: line {line}: no VC name")
        if n > MAX_MACHINES:
            raise TraceError(f"{path}: line {line}: node count {row[1]!r} is more than {MAX_MACHINES:,} "
                             f"machines")
        if row[0].strip() in out:
            raise TraceError(f"{path}: line {line}: VC {row[0]!r} listed twice")
        out[row[0].strip()] = int(n)
    if not out:
        raise TraceError(f"{path}: no VCs")
    return out


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
