"""gmux-sim: replay a cluster trace under scheduling policies (the same policy objects gmux-scheduler runs).

Thin wrapper: argument checking here, all work in gmux.cluster.sim.run."""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from datetime import datetime, timezone

from gmux.cli.argtypes import checked, fraction, json_object, nonneg_int, path, positive, positive_int
from gmux.cli.output import reader_gone
from gmux.cluster.sim.costs import COPY_GBPS, MAX_COST_S
from gmux.util.text import printable


def _default_traces() -> str:
    """../shared/traces from the working directory (the project's convention), else beside the source tree."""
    for base in (os.getcwd(), os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")):
        path = os.path.normpath(os.path.join(base, "..", "shared", "traces"))
        if os.path.isdir(path):
            return path
    return os.path.normpath(os.path.join(os.getcwd(), "..", "shared", "traces"))

EPILOG = """\
examples:
  gmux-sim                                   all policies, full Philly trace, per-VC clusters
  gmux-sim --policy fifo,gmux --end 7d       the first week only
  gmux-sim --sample 0.1 --seed 3             a seeded 10% sample of the jobs
  gmux-sim --machines 16 --policy gandiva    one 16-machine (128-GPU) cluster running every job
  gmux-sim --json out.json --plots out/      results as JSON and PNG plots
  gmux-sim --json - | jq .summary            results as JSON on standard output (the table on standard error)
  gmux-sim --vc-scale 0.25 --policy gmux --clusters 2869ce,103959 --params '{"gmux": {"sweep_quantile": 0}}'
                                             two VCs at a quarter of their size, gmux without sweep evidence
  gmux-sim --trace cluster_log.csv --vcs my_vcs.csv
                                             another cluster's trace (Helios', Acme's and openb's columns are
                                             known)
  gmux-sim --trace jobs.csv --machines 32 --columns submit=queued_at,gpus=n_gpu,duration=secs
                                             a trace whose columns have other names, on one 32-machine cluster
  gmux-sim --trace pai_task_table.csv --machines 32
                                             Alibaba PAI's tasks (header line put first): each arrives at its
                                             start_time with inst_num instances of plan_gpu, percent of a GPU

times (--start/--end) are offsets from the first submission with a unit (90s, 36h, 7d) or wall-clock
timestamps ("2017-10-01 00:00:00"). Job types come from gavel_throughputs.json, drawn with --seed.
A trace's times are dates and times (ISO 8601; without a zone taken as UTC) or seconds; rows of jobs that used no
GPU, never ran or have not ended are left out and counted. Jobs asking for part of a GPU get a whole one.
"""


def _duration(text: str):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if m:
        return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither an offset like 36h or 7d nor a date like 2017-10-01 "
                                         f"or 2017-10-01T06:00:00Z") from None
    # (a trace's times are UTC where they carry no zone: gmux.cluster.sim.trace)
    try:
        return when.astimezone(timezone.utc).replace(tzinfo=None) if when.tzinfo else when
    except OverflowError:     # (0001-01-01T00:00+05:00 is in year 0 in UTC: a traceback)
        raise argparse.ArgumentTypeError(f"{text!r} is not a time a date can show in UTC (0001-01-01 to "
                                         f"9999-12-31)") from None




def _unwritable(json_path: str | None, plots: str | None, made: list) -> str | None:
    """Why the results could not be written where asked, found before a run that may take minutes: the
    directories they go into are made now, and added to `made` (parents first) to be removed again if the run
    is refused or fails. A --json of - is standard output, which needs nothing made."""
    if plots == "-":
        # (- is standard output for --json; here it made a directory named -, which no user meant)
        return "--plots -: the plots are two PNG files, which standard output cannot take; give a directory " \
               "(./- for one named -)"
    if json_path == "-":
        json_path = None
    if json_path and plots and os.path.abspath(json_path) == os.path.abspath(plots):
        # (the plots' directory was made there, and the results file found it in its way only at the end)
        return f"--json and --plots name one path, {json_path}: the plots go into a directory beside the file"
    if json_path and plots and os.path.realpath(json_path) in (os.path.realpath(os.path.join(plots, name))
                                                               for name in PLOTS):
        # (the results were written, then the plot replaced them: exit 0 and no results)
        return f"--json {json_path} is a file the plots write ({', '.join(PLOTS)} in {plots}): the plot would " \
               f"replace the results"
    for flag, target, directory in (("--json", json_path, False), ("--plots", plots, True)):
        if target is None:
            continue
        if os.path.exists(target) and os.path.isdir(target) != directory:
            return f"{flag} {target}: " + ("not a directory" if directory else "a directory (give a file name)")
        if not directory and os.path.exists(target) and not os.path.isfile(target):
            # (an atomic write would put a file in place of the device or pipe, and a reader would get nothing)
            return f"{flag} {target}: not a regular file (a device, pipe or socket); give a file name"
        where = os.path.abspath(target) if directory else os.path.dirname(os.path.abspath(target))
        missing, part = [], where
        while not os.path.lexists(part):
            missing.append(part)
            part = os.path.dirname(part)
        made.extend(reversed(missing))      # (before: a makedirs that fails half-way has made some)
        try:
            os.makedirs(where, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            return f"{flag} {target}: a part of {where} is a file, not a directory"
        except OSError as e:
            return f"{flag} {target}: cannot make {where} ({e.strerror or e})"
        if not os.access(where, os.W_OK | os.X_OK):
            return f"{flag} {target}: cannot write into {where}"
    return None


def _columns(text: str) -> dict:
    from gmux.cluster.sim.trace import COLUMNS
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        meaning, eq, name = part.partition("=")
        meaning, name = meaning.strip(), name.strip()
        if not eq or not name or meaning not in COLUMNS or meaning in out:
            raise argparse.ArgumentTypeError(f"{part!r}: give MEANING=COLUMN once per meaning, MEANING one of "
                                             f"{', '.join(COLUMNS)}")
        out[meaning] = name
    if not out:
        raise argparse.ArgumentTypeError("give at least one MEANING=COLUMN")
    return out


def build_parser() -> argparse.ArgumentParser:
    from gmux.cluster.policies import POLICIES
    from gmux.cluster.sim.cluster import Costs
    d = Costs()
    p = argparse.ArgumentParser(prog="gmux-sim", description=__doc__.splitlines()[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("inputs")
    g.add_argument("--traces", default=_default_traces(), metavar="DIR",
                   help="directory holding philly.csv, philly_vc.csv, gavel_throughputs.json (default: %(default)s)")
    g.add_argument("--trace", type=path, metavar="CSV", help="job trace (default: DIR/philly.csv)")
    g.add_argument("--vcs", type=path, metavar="CSV", help="VC layout, vc,node num (default: DIR/philly_vc.csv)")
    g.add_argument("--throughputs", type=path, metavar="JSON",
                   help="Gavel throughput table (default: DIR/gavel_throughputs.json)")
    g.add_argument("--columns", type=_columns, metavar="MEANING=COLUMN[,...]",
                   help="the trace's columns where their names are not ones gmux-sim knows; meanings: submit, "
                        "duration, gpus, vc, start, end, instances, user (duration may come from start and end; "
                        "gpus is per instance; without submit a job arrives at its start; with user a job's sweep "
                        "is among its own user's jobs)")
    g.add_argument("--gpu-unit", choices=("auto", "gpus", "percent", "milli"), default="auto",
                   help="what the trace's GPU column counts: whole GPUs, percent of a GPU (100 = one GPU) or "
                        "thousandths; a job gets the whole GPUs it asks for, rounded up. auto: percent for a "
                        "column named plan_gpu (Alibaba PAI), thousandths for gpu_milli, else whole GPUs "
                        "(default: %(default)s)")
    g.add_argument("--time-unit", choices=("s", "ms", "us"), default="s",
                   help="what the trace's numeric times and durations count: seconds, milliseconds or "
                        "microseconds (Google's traces); dates are read as dates (default: %(default)s)")
    g.add_argument("--bad-rows", choices=("refuse", "skip"), default="refuse",
                   help="what to do with malformed trace rows (reported with line numbers; default: %(default)s)")
    g = p.add_argument_group("cluster")
    g.add_argument("--machines", type=positive_int, metavar="N",
                   help="one cluster of N machines for all jobs, instead of Philly's per-VC clusters")
    g.add_argument("--vc-scale", type=positive, metavar="X",
                   help="multiply every VC's machine count by X, at least 1 machine (stress runs; default: 1)")
    g.add_argument("--gpus-per-machine", type=positive_int, default=8, metavar="G", help="(default: %(default)s)")
    g.add_argument("--gpu-type", default="v100", choices=("v100", "p100", "k80"), help="(default: %(default)s)")
    g.add_argument("--unknown-vc", choices=("smallest", "skip", "refuse"),
                   help="jobs of VCs missing from the layout: run on a cluster the size of the smallest VC, "
                        "skip, or refuse (default: smallest)")
    g.add_argument("--suspect-pairs", choices=("p100", "drop", "keep"), default="p100",
                   help="throughput pairs whose packed rate equals the solo rate: take the P100 ratio, drop the "
                        "pair (never packed), or keep (default: %(default)s)")
    g.add_argument("--elastic-fraction", type=float, default=0.0, metavar="F",
                   help="seeded fraction of single-machine jobs that accept a GPU count in [n/2, 2n] (the trace "
                        "says nothing; default: %(default)s)")
    g = p.add_argument_group("jobs")
    g.add_argument("--policy", default=",".join(POLICIES), metavar="P[,P...]",
                   help=f"policies to run (default: all: {', '.join(POLICIES)})")
    g.add_argument("--clusters", metavar="VC[,VC...]",
                   help="simulate only these virtual clusters (each runs alone, so their results are those of a "
                        "full run: e.g. a cross-validation split)")
    g.add_argument("--params", metavar="JSON", default="{}",
                   help='policy parameters, e.g. \'{"gmux": {"sweep_quantile": 0}}\' (an ablation)')
    g.add_argument("--start", type=_duration, metavar="T", help="only jobs submitted at or after T")
    g.add_argument("--end", type=_duration, metavar="T", help="only jobs submitted before T")
    g.add_argument("--sample", type=fraction, metavar="F", help="keep a seeded fraction F of the jobs")
    g.add_argument("--seed", type=nonneg_int, default=0, help="seed for job types and sampling (default: %(default)s)")
    g = p.add_argument_group("costs (seconds; see gmux/cluster/sim/costs.py for where each default comes from)")
    g.add_argument("--suspend-s", type=cost_seconds, default=None,
                   help="flat copy-out time of every suspend (default: per job type, from the cost model)")
    g.add_argument("--resume-s", type=cost_seconds, default=None, help="flat copy-in time (default: the cost model)")
    g.add_argument("--migrate-s", type=cost_seconds, default=None,
                   help="flat migration time (default: the cost model)")
    g.add_argument("--copy-gbps", type=copy_rate, default=d.copy_gbps,
                   help="state copy rate of the cost model, GB/s (default: %(default)s, measured by native_swap)")
    g.add_argument("--quantum-s", type=cost_seconds, default=d.quantum_s, help="time slice (default: %(default)s)")
    g.add_argument("--measure-s", type=cost_seconds, default=d.measure_s,
                   help="pack measurement window (default: %(default)s)")
    g = p.add_argument_group("output")
    g.add_argument("--json", type=path, metavar="PATH",
                   help="write results as JSON to PATH; - writes them to standard output, and the notes and the "
                        "table then go to standard error (./- for a file named -)")
    g.add_argument("--plots", type=path, metavar="DIR", help="write jct_cdf.png and utilisation.png into DIR")
    g.add_argument("--workers", type=positive_int, default=1, help="worker processes (default: %(default)s)")
    g.add_argument("--quiet", action="store_true", help="no table, only errors")
    return p


cost_seconds = checked(float, "a number", lambda v: 0 <= v <= MAX_COST_S, "a number of seconds from 0 to "
                                                                         f"{MAX_COST_S:.4g} (100 years)")
copy_rate = checked(float, "a number", lambda v: COPY_GBPS[0] <= v <= COPY_GBPS[1],
                    f"a rate from {COPY_GBPS[0]:g} to {COPY_GBPS[1]:g} GB/s")
PLOTS = ("jct_cdf.png", "utilisation.png")     # the files --plots DIR writes
ERROR_LIMIT = 2000     # characters of one error line: a trace's names can be any length


def main(argv=None) -> int:
    made: list[str] = []    # directories made for the results: a run refused or failed leaves none behind
    written: list[str] = []     # the results files written, for an interrupt to say
    status = 2
    try:
        status = _main(argv, made, written)
        return status
    except KeyboardInterrupt:
        print(f"gmux-sim: interrupted ({', '.join(map(printable, written)) or 'nothing'} written)", file=sys.stderr)
        return 130
    except BrokenPipeError:     # (`gmux-sim | head`)
        return reader_gone()
    finally:
        if status != 0:
            for directory in reversed(made):
                with contextlib.suppress(OSError):     # (not empty: a result was written there after all)
                    os.rmdir(directory)


def _main(argv, made: list, written: list) -> int:
    from gmux.cluster.policies import POLICIES, PolicyError, make_policy
    from gmux.cluster.sim.cluster import Costs
    from gmux.cluster.sim.engine import SimulationError
    from gmux.cluster.sim.metrics import dump_json, write_json
    from gmux.cluster.sim.run import SimConfig, WorkerDied, prepare, report, simulate
    from gmux.cluster.sim.trace import TraceError

    parser = build_parser()
    args = parser.parse_args(argv)

    def fail(message: str):
        parser.error(printable(message, limit=ERROR_LIMIT))

    policies = [x.strip() for x in args.policy.split(",") if x.strip()]
    bad = [x for x in policies if x not in POLICIES]
    if bad or not policies:
        fail(f"unknown policy {', '.join(bad) or '(none given)'}; choose from {', '.join(POLICIES)}")
    if len(set(policies)) != len(policies):
        fail("a policy is listed twice")
    if not 0.0 <= args.elastic_fraction <= 1.0:
        fail(f"--elastic-fraction must be in [0, 1], not {args.elastic_fraction}")
    if args.machines:
        # each would be silently ignored: one cluster of N machines runs every job
        given = [flag for flag, value in (("--vcs", args.vcs), ("--vc-scale", args.vc_scale),
                                          ("--unknown-vc", args.unknown_vc), ("--clusters", args.clusters))
                 if value is not None]
        if given:
            fail(f"{' and '.join(given)} {'does' if len(given) == 1 else 'do'} not apply with --machines (one "
                 f"cluster of {args.machines} machines runs every job of the trace)")
    clusters = None
    if args.clusters is not None:
        clusters = tuple(dict.fromkeys(c.strip() for c in args.clusters.split(",") if c.strip()))
        if not clusters:
            fail(f"--clusters {args.clusters!r} names no cluster")
    try:
        params = json_object(args.params, "--params", "gmux-sim")
    except ValueError as e:
        fail(str(e))
    if not all(isinstance(v, dict) for v in params.values()):
        fail('--params must map policy names to parameter objects, e.g. {"gmux": {"min_run_s": 300}}')
    stray = [name for name in params if name not in policies]
    if stray:
        fail(f"--params names {', '.join(map(repr, stray))}, not among the policies run ({', '.join(policies)})")
    for name in policies:
        try:
            make_policy(name, **params.get(name, {}))     # before the trace is read: it may take minutes
        except (ValueError, TypeError) as e:
            fail(str(e))
    trace = args.trace or os.path.join(args.traces, "philly.csv")
    vcs = None if args.machines else (args.vcs or os.path.join(args.traces, "philly_vc.csv"))
    tput = args.throughputs or os.path.join(args.traces, "gavel_throughputs.json")
    inputs = (("trace", trace, "--traces DIR or --trace FILE"),
              ("VC layout", vcs, "--traces DIR, --vcs FILE or --machines N"),
              ("throughput table", tput, "--traces DIR or --throughputs FILE"))
    for label, file, hint in inputs:
        if file is not None and not os.path.isfile(file):
            what = "a directory" if os.path.isdir(file) else "not a regular file" if os.path.exists(file) else \
                "no such file"
            fail(f"{label} {file}: {what} (use {hint})")
    for label, file, _ in inputs:
        if args.json not in (None, "-") and file is not None and os.path.exists(args.json) and \
                os.path.samefile(args.json, file):
            fail(f"--json {args.json} is the {label} read: the results would overwrite it")
    unwritable = _unwritable(args.json, args.plots, made)
    if unwritable:
        fail(unwritable)
    try:
        costs = Costs(suspend_s=args.suspend_s, resume_s=args.resume_s, migrate_s=args.migrate_s,
                      quantum_s=args.quantum_s, measure_s=args.measure_s, copy_gbps=args.copy_gbps)
    except ValueError as e:
        fail(str(e))
    cfg = SimConfig(trace=trace, vcs=vcs, throughputs=tput, machines=args.machines,
                    gpus_per_machine=args.gpus_per_machine, gpu_type=args.gpu_type, suspect=args.suspect_pairs,
                    seed=args.seed, start=args.start, end=args.end, sample=args.sample, bad_rows=args.bad_rows,
                    columns=args.columns, gpu_unit=args.gpu_unit, time_unit=args.time_unit,
                    unknown_vc=args.unknown_vc or "smallest",
                    vc_scale=args.vc_scale or 1.0, elastic_fraction=args.elastic_fraction, costs=costs,
                    workers=args.workers, only=clusters)
    t0 = time.perf_counter()
    try:
        prep = prepare(cfg)
        out = simulate(cfg, policies, prep, params=params)
    except (TraceError, ValueError, TypeError, SimulationError) as e:
        print(f"gmux-sim: error: {printable(e, limit=ERROR_LIMIT)}", file=sys.stderr)
        return 2
    except WorkerDied as e:
        print(f"gmux-sim: error: {e}", file=sys.stderr)
        return 1
    except PolicyError as e:
        print(f"gmux-sim: error: a policy made a decision the cluster refused (its --params, or a bug in it): "
              f"{printable(e, limit=ERROR_LIMIT)}", file=sys.stderr)
        return 2
    payload = report(cfg, prep, out, baseline="fifo")
    payload["seconds"] = time.perf_counter() - t0
    status, lost = 0, None
    # Under --json - standard output carries the JSON alone, for a program to read: a table there would not parse.
    table = sys.stderr if args.json == "-" else sys.stdout
    try:
        _show(args, prep, costs, payload, trace, table)
    except OSError as e:
        if table is sys.stderr:
            status = 1      # (nothing to say it on: standard error is what failed; the JSON still goes out)
        else:
            # The results files are still written: `gmux-sim --json r.json | head -1` lost them, and so did a
            # table sent to a full disk. A reader gone has what it wanted; a device that failed is said once they
            # are.
            status = reader_gone()
            lost = None if isinstance(e, BrokenPipeError) else \
                f"cannot write to standard output ({e.strerror or e})"
    target = None
    try:
        if args.json == "-":
            target = "standard output"
            try:
                dump_json(payload, sys.stdout)
                print(flush=True)
            except BrokenPipeError:     # (`gmux-sim --json - | head -1`: the reader has what it wanted)
                status = reader_gone()
            else:
                written.append(target)
        elif args.json:
            target = args.json
            write_json(os.path.realpath(args.json), payload)     # (through a link: the file it names is replaced)
            written.append(target)
        if args.plots:
            from gmux.cluster.sim.plots import plot_jct_cdf, plot_utilisation
            for name, plot in zip(PLOTS, (plot_jct_cdf, plot_utilisation)):
                target = os.path.join(args.plots, name)
                plot(out, target)
                written.append(target)
    except OSError as e:
        shown = "" if args.quiet or status or lost else " (the table above has the results)"
        lost = f"cannot write {target} ({e.strerror or e}){shown}" + (f"; {lost}" if lost else "")
    if lost:
        print(f"gmux-sim: error: {printable(lost, limit=ERROR_LIMIT)}", file=sys.stderr)
        return 1
    return status


def _show(args, prep, costs, payload: dict, trace: str, out) -> None:
    """The notes, the costs and the results table on `out`, flushed here, so that a failed write is raised here."""
    from gmux.cluster.sim.metrics import render_table
    for note in prep.notes:     # (under --quiet too: rows left out are not left out without a word)
        print(f"note: {printable(note, limit=ERROR_LIMIT)}", file=sys.stderr if args.quiet else out)
    if not args.quiet:
        for line in costs.summary_lines():
            print(line, file=out)
        ratios = payload.get("jct_ratio_to_fifo", {})
        n = sum(len(j) for _, j in prep.clusters.values())
        print(render_table(payload["summary"], ratios, title=f"gmux-sim: {printable(os.path.basename(trace))}, "
                           f"{n} job{'s' if n != 1 else ''}"), end="", file=out)
        print(f"simulated in {payload['seconds']:.1f} s", file=out)
    out.flush()


if __name__ == "__main__":
    sys.exit(main())
