"""gmux: look at and steer the jobs of a gmuxd. Thin: every command is one request (gmux.wire.daemon_client)."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from typing import Optional

from gmux.protocol import LOGS_REPLY_BYTES, ProtocolError
from gmux.wire.daemon_client import Client, GmuxError, GmuxUnanswered
from gmux.rundir import default_runtime_dir
from gmux.cli.argtypes import interval, nonneg_int, positive_int, runtime_dir
from gmux.cli.job_options import add_job_options
from gmux.cli.output import Parser, UsageError, failed, json_asked, reader_gone
from gmux.cli.submit_env import check_text, submit_cwd, submit_env
from gmux.util.sizes import format_size
from gmux.util.text import printable

JOB_HELP = "the job: its id (j3, as gmux ps lists it), or the name of one live job or gang (gmux submit --name)"


def _print(data, as_json: bool, text=None, keep: str = "\n") -> None:
    """Text for people goes through `printable`: it quotes jobs' names and reasons, which a job chose."""
    if as_json:
        print(json.dumps(data, indent=1, default=str))
    elif text is not None:
        print(printable(text, keep))


def _outcome(cmd: str, data: dict) -> str:
    jobs = ", ".join(data.get("jobs") or [data["job"]])
    if cmd == "suspend" and data.get("kind") == "suspend":
        text = f"suspended {jobs} in {data['latency_s'] * 1e3:.1f} ms"
        if data.get("boundary_wait_s") is not None:
            # (the job's wait, from the command's sending: a second suspend sent meanwhile waited less of it)
            waited = min(data["boundary_wait_s"], data["latency_s"])
            text += f" ({waited * 1e3:.1f} ms of it waiting for " + (
                "its first boundary: it was still starting)" if data.get("first_boundary") else
                "the mini-batch to end)")
        return text
    if cmd == "suspend" and data.get("kind") == "stop":    # no boundary by its deadline: SIGSTOPped instead
        return f"{jobs}: {data.get('detail') or 'stopped'}"
    if cmd == "suspend" and data.get("kind") == "late":     # no boundary by its deadline, and not stopped
        return f"{jobs}: held, suspended at its next boundary, not yet: {data.get('detail')}"
    if cmd == "suspend" and data.get("detail"):
        return f"{jobs}: {data['detail']}"
    if cmd == "suspend":
        return f"{jobs}: {data['state']} (it was not running: it stays suspended until `gmux resume`)"
    if cmd == "resume":
        return f"{jobs}: {data['state']}"
    return f"{cmd}: {jobs} " + ", ".join(f"{k}={v}" for k, v in data.items() if k not in ("job", "jobs"))


# The narrowest layout of the tables that keeps their ids and states whole (tests/test_table_widths.py): below
# it every cell is folded into single characters and nothing can be read.
NARROWEST = 40


def _width() -> Optional[int]:
    """The width the tables are laid out for: COLUMNS where it is set (piped too, rather than 160), else the
    terminal's (None: rich asks it), else 160. A COLUMNS below NARROWEST is taken for NARROWEST: rich took
    COLUMNS=0 for a width of 0 and printed nothing at all, and COLUMNS=5 for five columns of box lines."""
    said = os.environ.get("COLUMNS", "")
    if said.isdigit() and int(said) > 0:
        return max(int(said), NARROWEST)
    if not sys.stdout.isatty():
        return 160
    if not said.isdigit():
        return None
    try:    # (rich reads COLUMNS=0 itself: the terminal's own width is asked here)
        return max(os.get_terminal_size(sys.stdout.fileno()).columns, NARROWEST)
    except OSError:
        return 80


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from gmux.cli import cluster_commands   # `gmux keys`, and submit/ps/kill --cluster ADDR
    if cluster_commands.wants(argv):
        return cluster_commands.main(argv)
    p = Parser(prog="gmux", description="Look at and steer the jobs of gmuxd.",
                                epilog="cluster mode: gmux keys --help; gmux submit|ps|suspend|resume|kill|migrate "
                                       "--cluster tcp://HOST:PORT --help (README.md, Cluster mode)")
    p.add_argument("--runtime-dir", type=runtime_dir, default=default_runtime_dir())
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("ps", help="jobs and GPUs")
    s.add_argument("--live", action="store_true", help="hide ended jobs")
    s.add_argument("--limit", type=positive_int, help="list at most N jobs: the live ones first, then the newest "
                                                      "ended (default 100)")
    s = sub.add_parser("top", help="the jobs table, live")
    s.add_argument("--interval", type=interval, default=1.0, help="seconds between refreshes (default 1)")
    s.add_argument("--count", type=nonneg_int, default=0, help="stop after this many refreshes (0: never)")
    for name, helptext in (("suspend", "suspend a job at its next boundary and keep it suspended"),
                           ("resume", "let a suspended job run again in its turn"),
                           ("kill", "kill a job (SIGKILL); its share of the GPU is freed")):
        helptext += " (a gang rank: every rank of its gang)"
        s = sub.add_parser(name, help=helptext)
        s.add_argument("job", help=JOB_HELP)
    s = sub.add_parser("migrate", help="move a job to another GPU at its next boundary (between virtual GPUs in "
                                       "its own process; between real GPUs by checkpoint and a new process)")
    s.add_argument("job", help=JOB_HELP)
    s.add_argument("--gpu", type=nonneg_int, required=True, help="the GPU it goes to (gmux ps lists them)")
    s.add_argument("--new-process", action="store_true",
                   help="checkpoint and restore in a new process even between virtual GPUs (as on real GPUs)")
    s = sub.add_parser("logs", help="output of a submitted job")
    s.add_argument("job", help=JOB_HELP + "; a name whose runs have ended: its newest submitted run")
    s.add_argument("--tail", type=nonneg_int, default=0,
                   help="only the last N lines (0: all a reply holds, the log's last 512 KiB; what it leaves out is "
                        "said, with the log's path)")
    s.add_argument("--raw", action="store_true", help="the output's bytes as the job wrote them, escape sequences "
                                                      "included (default: control characters are shown escaped)")
    s = sub.add_parser("submit", help="have gmuxd start and supervise a job: gmux submit [opts] -- python train.py",
                       epilog="to a cluster: gmux submit --cluster tcp://HOST:PORT --keys DIR --help")
    add_job_options(s)
    s.add_argument("--gpu", type=nonneg_int, help="run on this GPU (default: gmuxd places the job)")
    s.add_argument("--gpus", type=positive_int, default=1,
                   help="GPUs the process uses, given to it exclusively (default 1)")
    s.add_argument("--ranks", type=positive_int,
                   help="start N ranks of a torch.distributed job, each on a GPU of its own, with RANK, WORLD_SIZE, "
                        "LOCAL_RANK, MASTER_ADDR, MASTER_PORT set")
    s.add_argument("--no-hook", dest="hook", action="store_false",
                   help="the script calls gmux.job.attach() itself (explicit mode: it can be moved between GPUs)")
    s.add_argument("argv", nargs=argparse.REMAINDER)
    s = sub.add_parser("decisions", help="packing, spill, stop, migration and end decisions, with their numbers "
                                         "(time-slice switches are counted in gmux ps, SWITCHES)")
    s.add_argument("--limit", type=positive_int, default=50, help="the last N decisions (default 50)")
    s = sub.add_parser("shutdown", help="stop gmuxd (jobs keep running unless --kill-jobs)")
    s.add_argument("--kill-jobs", action="store_true", help="kill every job too")
    sub.add_parser("ping", help="is gmuxd there?")
    sub.add_parser("keys", help="create CurveZMQ key pairs for cluster mode (gmux keys --help)")   # (its own module's)
    for s in sub.choices.values():      # (after the command too: gmux decisions --json)
        s.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    as_json = json_asked(argv, p)
    try:
        a = p.parse_args(argv)
        if a.cmd == "logs" and a.raw and a.json:
            sub.choices["logs"].error("--raw writes the log's bytes as the job wrote them, --json a JSON object: "
                                      "give one of them")
        if a.cmd == "submit":
            a.argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
            if not a.argv:      # (a usage error, status 2, as every other slip on the command line)
                sub.choices["submit"].error("give the command after --, e.g. gmux submit -- python train.py")
    except UsageError as e:
        return e.report(as_json)
    try:
        return run(a)
    except BrokenPipeError:     # (gmux logs JOB | head)
        return reader_gone()
    except (GmuxError, ProtocolError) as e:    # ProtocolError: a value the wire format refuses, before sending
        return failed(in_user_words(str(e)), a.json)
    except KeyboardInterrupt:
        return failed("interrupted (a command already sent to gmuxd is carried out; `gmux ps` shows where it "
                      "stands)", a.json, 130)


# The wire's fields as the command line spells them: a value the wire format refuses names what the user typed.
_OPTIONS = {"name": "--name", "mem": "--mem", "weight": "--weight", "gpus": "--gpus", "gpu": "--gpu",
            "ranks": "--ranks", "tail": "--tail", "limit": "--limit", "job": "JOB", "argv": "the command",
            "cwd": "this directory", "env": "the environment"}


def in_user_words(error: str) -> str:
    """'submit.gpus: 99 is outside [1, 64]' (a ProtocolError's words) as 'submit: --gpus: 99 is ...'."""
    m = re.fullmatch(r"(\w+)\.(\w+): (.*)", error, re.S)
    return f"{m[1]}: {_OPTIONS[m[2]]}: {m[3]}" if m and m[2] in _OPTIONS else error


def _beyond_machine(c: Client, e: ProtocolError, given: dict) -> Exception:
    """A number of GPUs (or a GPU) past what the wire format carries: refused in this machine's numbers."""
    m = re.fullmatch(r"(\w+)\.(gpus|ranks|gpu): .*", str(e), re.S)
    if not m or given.get(m[2]) is None:
        return e
    gpus = [g["index"] for g in c.call("ps", all=False, limit=1)["gpus"]]
    has = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}" + (f" ({', '.join(map(str, gpus))})" if gpus else "")
    return GmuxError(f"{m[1]}: --{m[2]} {given[m[2]]}: this machine has {has}"
                     + (", and each rank needs one of its own" if m[2] == "ranks" else ""))


def run(a) -> int:
    c = Client(a.runtime_dir)
    if a.cmd == "ps":
        data = c.call("ps", all=not a.live, **({"limit": a.limit} if a.limit else {}))
        if a.json:
            _print(data, True)
        else:
            from rich.console import Console
            from gmux.cli.tables import gpus_table, jobs_table
            con = Console(width=_width())
            con.print(jobs_table(data))
            if data.get("jobs_shown", 0) < data.get("jobs_total", 0):
                con.print(f"({data['jobs_shown']} of {data['jobs_total']} jobs shown: gmux ps --limit N for more)",
                          markup=False)
            con.print(gpus_table(data))
            if data["daemon"].get("store"):
                con.print(f"gmuxd is serving from memory: {printable(data['daemon']['store'])}", markup=False)
        return 0
    if a.cmd == "top":
        return top(c, a)
    if a.cmd in ("suspend", "resume", "kill", "migrate"):
        c.call("ping")    # a gmuxd that is gone is found in seconds, not after the wait a job's boundary may take
    if a.cmd in ("suspend", "resume", "kill"):
        data = c.call(a.cmd, timeout=130, late_ok=True, job=a.job)
        _print(data, a.json, _outcome(a.cmd, data))
        return 0
    if a.cmd == "migrate":
        fields = {"new_process": True} if a.new_process else {}
        try:
            data = c.call("migrate", timeout=130, job=a.job, gpu=a.gpu, **fields)
        except ProtocolError as e:
            raise _beyond_machine(c, e, {"gpu": a.gpu}) from None
        # (a new process's move is answered once the checkpoint is written: the job is on its way, not there)
        _print(data, a.json, f"moving {a.job} to GPU {a.gpu}: checkpointed; a new process restores it there (gmux "
                             f"ps shows it running there once it has)" if data.get("path") == "new process" else
               f"migrated {a.job} to GPU {a.gpu}" + (f" ({data['path']})" if data.get("path") else ""))
        if not a.json:
            for job, warning in (data.get("warnings") or {}).items():
                print(printable(f"gmux: warning: {job}: {warning}"), file=sys.stderr)
        return 0
    if a.cmd == "logs":
        return logs(c, a)
    if a.cmd == "submit":
        argv = a.argv
        env = submit_env()
        try:
            cwd = submit_cwd(argv)
            check_text(argv, env, cwd)
        except ValueError as e:
            raise GmuxError(f"submit: {e}") from None
        fields = {"ranks": a.ranks} if a.ranks is not None else {}
        if not a.hook:
            fields["hook"] = False
        try:
            # (a busy gmuxd starting many jobs at once takes seconds for each)
            data = c.call("submit", timeout=60, argv=argv, cwd=cwd, env=env, name=a.name, weight=a.weight,
                          mem=a.mem, gpu=a.gpu, gpus=a.gpus, **fields)
        except ProtocolError as e:
            raise _beyond_machine(c, e, {"gpus": a.gpus, "ranks": a.ranks, "gpu": a.gpu}) from None
        except GmuxUnanswered as e:
            if not c.ran:       # (no gmuxd ran: nothing was started)
                raise
            raise GmuxError(f"{e}. It may have started the job all the same: look for it in gmux ps before "
                            f"submitting again") from None
        where = "waiting for a GPU" if data["gpu"] is None else f"on GPU {data['gpu']}"
        if "gang" in data:
            many = len(data["jobs"]) > 1        # (a gang of one rank: "rank j1 (pid 10)")
            _print(data, a.json, f"submitted gang {data['gang']}: rank{'s' * many} {', '.join(data['jobs'])} "
                                 f"(pid{'s' * many} {', '.join(map(str, data['pids']))}); logs: gmux logs "
                                 f"{'JOB' if many else data['jobs'][0]}")
        else:
            _print(data, a.json, f"submitted {data['job']} {where} (pid {data['pid']}); logs: gmux logs {data['job']}")
        return 0
    if a.cmd == "decisions":
        data = c.call("decisions", limit=a.limit)
        # one line each: a decision quotes a job's exit reason, whose newlines would forge lines of their own
        _print(data, a.json, "\n".join(f"{time.strftime('%H:%M:%S', time.localtime(d['t']))} {d['kind']:8} "
                                       f"{printable(d['text'])}" for d in data["decisions"]))
        return 0
    if a.cmd == "shutdown":
        _print(c.call("shutdown", kill_jobs=a.kill_jobs), a.json, "gmuxd is stopping")
        return 0
    if a.cmd == "ping":
        data = c.call("ping")
        errors = data.get("internal_errors") or 0
        _print(data, a.json, "gmuxd is running" + (f"; it met {errors} internal error(s) and went on (its log "
                                                   f"names each)" if errors else ""))
        return 0
    return 2


def logs(c: Client, a) -> int:
    """The job's log, or its end. What a reply left out is said on standard error (standard output stays the
    log's), with the file that holds all of it."""
    data = c.call("logs", job=a.job, tail=a.tail, **({"raw": True} if a.raw else {}))
    body = data["bytes"] if a.raw else data["text"].encode(errors="surrogatepass")
    cut = _left_out(c, data, body, a.tail)
    if a.raw:
        sys.stdout.buffer.write(body)
        if data.get("note"):    # (a log deleted: said as the text form says it, but apart from the log's bytes)
            sys.stdout.flush()
            print(printable(f"gmux: {data['note'].strip().strip('[]')}"), file=sys.stderr)
    else:
        _print({**data, **cut}, a.json, data["text"].rstrip("\n"), keep="\n\t")
    if cut and not a.json:
        sys.stdout.flush()
        print(printable(f"gmux: {cut['cut']}"), file=sys.stderr)
    return 0


def _left_out(c: Client, data: dict, body: bytes, tail: int) -> dict:
    """{'cut': words, 'left_out': bytes or None, 'log': path} where a reply held less than was asked (all the log,
    or --tail N lines reaching past what a reply holds); {} where it held all. gmuxd counts what it left out; one
    started before it did is asked by the file's size, where this user may read it."""
    job, path = data["job"], c.rundir.log_file(data["job"])
    if tail and body.count(b"\n") >= tail:
        return {}
    before = data.get("left_out")
    if before is None and len(body) >= LOGS_REPLY_BYTES - 3:    # (- 3: a character cut in two is dropped whole)
        try:
            before = max(0, os.stat(path).st_size - LOGS_REPLY_BYTES)
        except OSError:
            return {"cut": f"only the end of {job}'s log is shown, what one reply holds ({LOGS_REPLY_BYTES >> 10} "
                           f"KiB): what came before it may have been left out", "left_out": None, "log": path}
    if not before:
        return {}
    return {"cut": f"only the last {LOGS_REPLY_BYTES >> 10} KiB of {job}'s log are shown, what one reply holds: the "
                   f"{format_size(before)} before them were left out. All of it: {path}", "left_out": before,
            "log": path}


def top(c: Client, a) -> int:
    from rich.console import Console, Group
    from rich.live import Live
    from gmux.cli.tables import gpus_table, jobs_table
    n = 0
    # Into a file or a pipe, a snapshot after another: a live display redraws only on a terminal.
    live = Live(console=Console(width=_width()), refresh_per_second=4, screen=False) \
        if sys.stdout.isatty() and not a.json else None
    with live or contextlib.nullcontext():
        while True:
            data = c.call("ps", all=True)
            # What runs now first: a monitor's reader looks for live jobs, and ended ones pile up above them.
            data["jobs"] = sorted(data["jobs"], key=lambda j: j.get("ended") is not None)
            view = None if a.json else Group(jobs_table(data, f"gmux top — {time.strftime('%H:%M:%S')}"),
                                             gpus_table(data))
            if a.json:
                print(json.dumps(data, default=str), flush=True)
            elif live is not None:
                live.update(view)
            else:
                Console(width=_width()).print(view)
                sys.stdout.flush()
            n += 1
            if a.count and n >= a.count:
                return 0
            time.sleep(a.interval)


if __name__ == "__main__":
    sys.exit(main())
