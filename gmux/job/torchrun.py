"""`gmux-launch -- torchrun [OPTIONS] train.py ARGS` (or `python -m torch.distributed.run ...`): one gang.

gmux-launch does not start the ranks itself: torchrun does what it always does (rendezvous, the c10d store its
workers connect to, RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT in each worker's environment,
watching the workers and ending them all when one fails), with one change: with `--no-python`, each worker it
spawns is `python -m gmux.cli.launch --gang ID --torchrun-worker -- python train.py ARGS`, a gmux-launch of
the user's script that takes its rank and world size from torchrun's environment. Each worker registers with
gmuxd as a rank of gang ID (gmuxd places the ranks together, each on a GPU of its own, and suspends, resumes
and kills them as one), runs the script under the transparent hook, and agrees with its peers on the boundary
to act at (gmux.job.gang.GangController, over a gloo group of its own made once the script has made its
process group). This process only runs torchrun and passes its exit status (and SIGINT/SIGTERM) through.

Single node only (`--nnodes 1`, the default, or `--standalone`). Several nodes would need, on every node, a
gmuxd and this launcher with the same gang id (the rendezvous id), gmuxd's gang admission counting ranks
across machines (today a gang is placed by one gmuxd), and suspend/resume/kill of a gang sent to every node's
gmuxd (by gmux-scheduler); torchrun's own rendezvous across nodes would stay as it is.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Optional

from gmux.util.text import digits

_FLAGS_REPLACED = {"-m", "--module", "--no-python", "--no_python"}   # the worker command says how the script runs


def torchrun_options(argv: list) -> Optional[list]:
    """torchrun's own arguments (options, script, script arguments) when `argv` starts torchrun, else None."""
    if not argv:
        return None
    if os.path.basename(argv[0]) == "torchrun":
        return list(argv[1:])
    if os.path.basename(argv[0]).startswith("python") and argv[1:3] == ["-m", "torch.distributed.run"]:
        return list(argv[3:])
    return None


def worker_command(args: list, launch_opts: list) -> tuple[list, int]:
    """(the torchrun command that starts each worker as a gmux-launch gang rank, ranks on this node). Refuses
    what it cannot run as one gang, naming why."""
    from torch.distributed.run import get_args_parser   # torch's own parser: every option torchrun knows
    ns = get_args_parser().parse_args(args)
    if str(ns.nnodes) not in ("1", "1:1"):
        raise SystemExit(f"gmux-launch: torchrun --nnodes {ns.nnodes}: gmux runs a torchrun job on one node only "
                         f"(see gmux/job/torchrun.py for what several nodes need)")
    tail = 1 + len(ns.training_script_args)
    options = [o for o in args[:len(args) - tail] if o not in _FLAGS_REPLACED]
    script = [ns.training_script, *ns.training_script_args]
    if ns.module:
        script = ["python", "-m", *script]
    elif not ns.no_python:
        script = ["python", *script]
    elif not os.path.basename(ns.training_script).startswith("python"):
        raise SystemExit(f"gmux-launch: torchrun --no-python {ns.training_script}: gmux runs Python training "
                         f"scripts; give the script (torchrun runs it with python)")
    nproc = ns.nproc_per_node
    ranks = int(nproc) if digits(str(nproc)) else 0     # auto / gpu / cpu: torchrun decides
    worker = [sys.executable, "-m", "gmux.cli.launch", *launch_opts, "--torchrun-worker", "--", *script]
    return [sys.executable, "-m", "torch.distributed.run", *options, "--no-python", *worker], ranks


def run(args: list, launch_opts: list) -> int:
    """Runs torchrun with gmux-launch workers; returns its exit status."""
    command, _ = worker_command(args, launch_opts)
    proc = subprocess.Popen(command)

    def forward(signum, frame):
        proc.send_signal(signum)          # torchrun ends its workers itself
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    return proc.wait()
