"""The cluster half of the `gmux` CLI: `gmux keys`, and `submit`/`ps`/`kill`/`suspend`/`resume`/`migrate` with
--cluster ADDR.

gmux/cli/gmux.py hands these command lines here (so the per-machine CLI stays as it is)."""
from __future__ import annotations

import argparse
import getpass
import json
import os
import re

from gmux.wire import keys
from gmux.wire.scheduler_client import ClusterClient, ClusterError
from gmux.cli.argtypes import ckpt_every, gpu_index, key_name, path, ranks, tcp_endpoint
from gmux.cli.job_options import add_job_options
from gmux.cli.output import Parser, UsageError, failed, json_asked, reader_gone
from gmux.cli.submit_env import check_text, submit_cwd, submit_env
from gmux.util.text import printable


def wants(argv: list) -> bool:
    """Whether a `gmux` command line is for this module (only options before `--` count)."""
    head = argv[:argv.index("--")] if "--" in argv else argv
    command = next((a for i, a in enumerate(head) if not a.startswith("-") and head[i - 1:i] != ["--runtime-dir"]),
                   None)    # the first word that is not an option or --runtime-dir's value
    return command == "keys" or "--cluster" in head or any(a.startswith("--cluster=") for a in head)


def main(argv: list) -> int:
    p = Parser(prog="gmux")
    p.add_argument("--json", action="store_true")
    p.add_argument("--runtime-dir", help=argparse.SUPPRESS)    # (a local gmuxd's: no cluster command uses it)
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keys", help="create CurveZMQ key pairs for cluster mode")
    k.add_argument("--dir", type=path, default=os.environ.get("GMUX_KEYS"), required=not os.environ.get("GMUX_KEYS"),
                   help="the cluster's key directory, made mode 0700 (default: GMUX_KEYS)")
    k.add_argument("--scheduler", action="store_true", help="the scheduler's pair")
    k.add_argument("--daemon", action="append", type=key_name, default=[], metavar="NAME",
                   help="a machine's pair (repeatable)")
    k.add_argument("--client", action="append", type=key_name, default=[], metavar="NAME",
                   help="a user's pair (repeatable)")
    k.add_argument("--force", action="store_true", help="replace existing pairs (revokes the old keys)")
    helps = {"submit": "submit a job to the cluster: gmux submit --cluster ADDR [opts] -- python train.py",
             "ps": "the cluster's jobs and machines", "kill": "kill a cluster job",
             "suspend": "hold a cluster job: suspended where it runs, and kept so until `gmux resume --cluster`",
             "resume": "release a held cluster job: it runs again in its turn",
             "migrate": "move a running cluster job to a GPU of a machine (e.g. to drain one): by checkpoint "
                        "between machines, at its next boundary within one"}
    for name in ("submit", "ps", "kill", "suspend", "resume", "migrate"):
        s = sub.add_parser(name, help=helps[name])
        # (on the command line, never from the environment: its presence is what sends the command to the cluster)
        s.add_argument("--cluster", type=tcp_endpoint, required=True, help="gmux-scheduler's tcp://HOST:PORT")
        s.add_argument("--keys", type=path, default=os.environ.get("GMUX_KEYS"),
                       required=not os.environ.get("GMUX_KEYS"),
                       help="the directory holding your client key (gmux keys --help; or GMUX_KEYS)")
        s.add_argument("--as", dest="who", default=os.environ.get("GMUX_KEY_NAME") or getpass.getuser(),
                       help="your client key's name (client.NAME in --keys)")
        if name == "submit":
            add_job_options(s, cluster=True)
            s.add_argument("--ckpt-every", type=ckpt_every,
                           help="periodic checkpoint interval, seconds (0: never; default: gmux-scheduler's "
                                "--ckpt-every)")
            s.add_argument("--ranks", type=ranks, default=1,
                           help="a gang of N processes, one per GPU of one machine (torch.distributed: RANK, "
                                "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are set for each)")
            s.add_argument("argv", nargs=argparse.REMAINDER)
        elif name in ("kill", "suspend", "resume", "migrate"):
            s.add_argument("job", help="the cluster job (cN, as gmux ps --cluster lists it)")
            if name == "migrate":
                s.add_argument("--machine", required=True, help="where it goes (a machine gmux ps --cluster lists)")
                s.add_argument("--gpu", type=gpu_index, required=True,
                               help="its GPU there (a gang's rank r goes to GPU + r)")
        else:
            s.add_argument("--live", action="store_true", help="hide ended jobs")
    for s in sub.choices.values():      # (after the command too: gmux ps --cluster ADDR --json)
        s.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    as_json = json_asked(argv, p)
    try:
        a = p.parse_args(argv)
        _check(a, sub.choices[a.cmd])
    except UsageError as e:
        return e.report(as_json)
    try:
        return run(a)
    except BrokenPipeError:
        return reader_gone()
    except (ClusterError, keys.KeyError_, FileExistsError, ValueError) as e:   # ValueError: ProtocolError too
        return failed(in_user_words(str(e)), a.json)


# The wire's fields as the command line spells them: a value the wire format refuses names what the user typed.
_OPTIONS = {"cjob": "JOB", "machine": "--machine", "gpu": "--gpu", "name": "--name", "mem": "--mem",
            "weight": "--weight", "ranks": "--ranks", "ckpt_every": "--ckpt-every", "argv": "the command",
            "cwd": "this directory", "env": "the environment"}


def in_user_words(error: str) -> str:
    """"c_kill.cjob: 'x' is not a valid name ..." (a ProtocolError's words: the message type and its field) as
    "kill: JOB: 'x' is not ...", the command and the argument the user typed."""
    m = re.fullmatch(r"c_(\w+)\.(\w+): (.*)", error, re.S)
    return f"{m[1]}: {_OPTIONS[m[2]]}: {m[3]}" if m and m[2] in _OPTIONS else error


def _check(a, command: Parser) -> None:
    """What argparse cannot see, refused as a usage error of `command` (status 2, its usage), before any key is
    made or the scheduler is asked: a command line missing its point is the user's slip, not a failure."""
    if a.cmd == "keys":
        a.pairs = ([("scheduler", None)] if a.scheduler else []) + [("daemon", n) for n in a.daemon] + \
            [("client", n) for n in a.client]
        if not a.pairs:
            command.error("say which pairs to create: --scheduler, --daemon NAME, --client NAME")
        twice = sorted({f"--{role} {name}" for role, name in a.pairs if a.pairs.count((role, name)) > 1})
        if twice:
            command.error(f"{', '.join(twice)} given twice")
    elif a.cmd == "submit":
        a.argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
        if not a.argv:
            command.error("give the command after --, e.g. gmux submit --cluster ADDR -- python train.py")


def run(a) -> int:
    if a.cmd == "keys":
        made = keys.create_all(a.dir, a.pairs, a.force)
        if a.json:      # (--json was taken, and the paths printed as text all the same)
            print(json.dumps({"created": [{"public": pub, "secret": sec} for pub, sec in made]}))
            return 0
        for pub, sec in made:
            print(f"{pub}\n{sec}  (secret: give it only to its owner)")
        return 0
    c = ClusterClient(a.cluster, a.keys, a.who)
    try:
        if a.cmd == "submit":
            argv = a.argv
            try:
                cwd = submit_cwd(argv, here=False)     # (the job starts on another machine)
                check_text(argv, submit_env(), cwd)
            except ValueError as e:
                raise ClusterError(f"submit: {e}") from None
            # Left out, the scheduler's own default applies; 0 is never (None on the wire).
            ckpt = {} if a.ckpt_every is None else {"ckpt_every": a.ckpt_every or None}
            data = c.call("c_submit", argv=argv, cwd=cwd, env=submit_env(), name=a.name, mem=a.mem,
                          weight=a.weight, ranks=a.ranks, **ckpt)
            print(json.dumps(data) if a.json else f"submitted {data['cjob']} to {a.cluster}")
        elif a.cmd == "kill":
            data = c.call("c_kill", cjob=a.job)
            print(json.dumps(data) if a.json else f"killing {data['cjob']}")
        elif a.cmd == "migrate":
            data = c.call("c_migrate", cjob=a.job, machine=a.machine, gpu=a.gpu)
            print(json.dumps(data) if a.json else moving_said(data, a.gpu))
        elif a.cmd in ("suspend", "resume"):
            data = c.call("c_" + a.cmd, cjob=a.job)
            said = {"suspend": f"{a.job} held until `gmux resume --cluster {a.cluster} {a.job}` (if it runs, it "
                               f"suspends at its next boundary)",
                    "resume": f"{a.job} released: it runs again in its turn"}
            print(json.dumps(data) if a.json else said[a.cmd])
        else:
            data = c.call("c_ps", all=not a.live)
            if a.json:
                print(json.dumps(data, indent=1, default=str))
            else:
                from gmux.cli.tables import CLUSTER_HEADER, cluster_job_line, cluster_rank_line
                print(f"policy {data['policy']}; machines: " + (", ".join(
                    f"{m['name']}({m['state']}, {m['gpus']} GPU)" for m in data["machines"]) or "none has joined"))
                if data.get("store"):
                    print(f"the scheduler is serving from memory: {printable(data['store'])}")
                print(CLUSTER_HEADER)
                for j in data["jobs"]:
                    print(cluster_job_line(j))
                    for r in j.get("ranks") or []:
                        print(cluster_rank_line(j, r))
    finally:
        c.close()
    return 0


def moving_said(data: dict, gpu: int) -> str:
    """What `gmux migrate --cluster` says of a move it asked for: one within a machine is no migration (its
    process moves at its next boundary; gmux ps --cluster shows it running on the new GPU at once)."""
    if data["from"] == data["to"]:
        return (f"moving {data['cjob']} to GPU {gpu} of {data['to']} at its next boundary (within its machine: gmux ps "
                f"--cluster lists it there at once)")
    return (f"moving {data['cjob']} from {data['from']} to {data['to']} GPU {gpu} (gmux ps --cluster shows it "
            f"migrating, then running there)")
