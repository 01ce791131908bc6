"""gmux-launch [--mem SIZE] [--weight W] [--gpus N | --gang NAME --rank R --world N] -- python train.py ARGS:
run a script as a gmux job (a multi-GPU job, or one rank of a torch.distributed gang);
gmux-launch [--mem SIZE] [--weight W] [--name NAME] -- torchrun ... train.py ARGS: a torchrun job as one gang
(gmux/job/torchrun.py)."""
from __future__ import annotations

import argparse
import os
import sys

from gmux.cli.argtypes import job_name, nonneg_int, positive_int, runtime_dir
from gmux.cli.job_options import add_job_options
from gmux.job import torchrun
from gmux.job.launch import LaunchOptions, run
from gmux.rundir import default_runtime_dir


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)    # gmux-launch's options, then the command
    p = argparse.ArgumentParser(prog="gmux-launch", description="Run an unmodified training script as a gmux job.",
                                usage="gmux-launch [options] -- python train.py ARGS")
    add_job_options(p)
    p.add_argument("--mem-soft", action="store_true", help="--mem declares the job's size for admission only: "
                                                           "no limit (also GMUX_MEM_SOFT=1)")
    p.add_argument("--gpus", type=positive_int, default=1,
                   help="GPUs this one process uses; more than one are given to it exclusively, when that many are "
                        "free (default 1)")
    p.add_argument("--gpu", type=nonneg_int, help="run on this GPU (default: gmuxd places the job)")
    p.add_argument("--gang", type=job_name, help="this process is one rank of the torch.distributed job NAME: gmuxd "
                                                 "gives each rank a GPU of its own and suspends, resumes and kills the "
                                                 "ranks together")
    p.add_argument("--rank", type=nonneg_int, help="with --gang: this process's rank, 0..WORLD-1")
    p.add_argument("--world", type=positive_int, help="with --gang: the number of ranks")
    p.add_argument("--no-hook", dest="hook", action="store_false",
                   help="the script calls gmux.job.attach() itself; do not install the optimizer hook")
    p.add_argument("--runtime-dir", type=runtime_dir, default=default_runtime_dir())
    # a worker torchrun started (gmux/job/torchrun.py): its rank and world size are torchrun's RANK and WORLD_SIZE
    p.add_argument("--torchrun-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)       # set by gmuxd / by a migration's re-exec
    p.add_argument("--restore", help=argparse.SUPPRESS)
    # set by a system gmuxd, which starts this process as the job's user: the directory is entered as that user,
    # never as root (whose chdir would have let them into a directory they may not enter)
    p.add_argument("--cwd", help=argparse.SUPPRESS)
    a = p.parse_args(argv[:split])
    if a.cwd is not None:
        try:
            os.chdir(a.cwd)
        except OSError as e:
            print(f"gmux-launch: cannot enter {a.cwd}: {e.strerror}", file=sys.stderr)
            return 2
    if not argv[split + 1:]:
        p.error("give the command after --, e.g. gmux-launch -- python train.py")
    torchrun_args = torchrun.torchrun_options(argv[split + 1:])
    if torchrun_args is not None:
        return _torchrun(p, a, torchrun_args)
    if a.torchrun_worker:
        if a.gang is None or "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            p.error("--torchrun-worker is for the workers gmux-launch starts through torchrun")
        a.rank, a.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gang = None
    if (a.gang, a.rank, a.world) != (None, None, None):
        if None in (a.gang, a.rank, a.world):
            p.error("a gang rank needs all of --gang NAME, --rank R and --world N")
        if a.world < 1 or not 0 <= a.rank < a.world:
            p.error(f"--rank {a.rank} --world {a.world}: the rank must be in 0..WORLD-1 (WORLD >= 1)")
        if a.gpus != 1:
            p.error(f"--gang with --gpus {a.gpus}: each rank of a gang uses one GPU")
        gang = {"id": a.gang, "rank": a.rank, "size": a.world}
    token = os.environ.pop("GMUX_JOB_TOKEN", None) if a.job else None
    return run(LaunchOptions(argv=argv[split + 1:], runtime_dir=a.runtime_dir, mem=a.mem, mem_soft=a.mem_soft,
                             weight=a.weight, gpus=a.gpus, gpu=a.gpu, name=a.name, hook=a.hook, job=a.job, token=token,
                             restore=a.restore, gang=gang, torchrun=a.torchrun_worker))


def _torchrun(p: argparse.ArgumentParser, a: argparse.Namespace, args: list) -> int:
    """Runs torchrun with each worker a gmux-launch rank of one gang, named after --name or this process."""
    if a.gang is not None or a.rank is not None or a.world is not None or a.gpu is not None:
        p.error("with torchrun, gmux-launch makes the gang itself: no --gang, --rank, --world or --gpu")
    if a.restore is not None or a.job is not None:      # (ignored, its ranks would start from scratch)
        p.error("--restore and --job are for a job's new process that gmuxd starts, never through torchrun")
    gang = a.name or f"torchrun-{os.getpid()}"
    opts = ["--runtime-dir", a.runtime_dir, "--gang", gang, "--weight", repr(a.weight)]
    opts += (["--mem", f"{a.mem}B"] if a.mem is not None else []) + (["--name", a.name] if a.name else [])
    opts += ["--mem-soft"] if a.mem_soft else []
    opts += [] if a.hook else ["--no-hook"]
    _, ranks = torchrun.worker_command(args, opts)    # refuses what cannot run as one gang before anything starts
    if a.gpus != 1 and ranks and a.gpus != ranks:
        p.error(f"--gpus {a.gpus} with torchrun --nproc-per-node {ranks}: each rank uses one GPU")
    return torchrun.run(args, opts)


if __name__ == "__main__":
    sys.exit(main())
