"""gmux-launch [--mem SIZE] [--weight W] [--gpus N | --gang NAME --rank R --world N] -- python train.py ARGS:
run a script as a gmux job (a multi-GPU job, or one rank of a torch.distributed gang)."""
from __future__ import annotations

import argparse
import os
import sys

from gmux.util.sizes import parse_size
from gmux.job.launch import LaunchOptions, run
from gmux.rundir import default_runtime_dir


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: gmux-launch [--mem SIZE] [--weight W] [--gpus N | --gang NAME --rank R --world N] "
              "-- python train.py ARGS", file=sys.stderr)
        return 2
    split = argv.index("--")
    p = argparse.ArgumentParser(prog="gmux-launch", description="Run an unmodified training script as a gmux job.")
    p.add_argument("--mem", type=parse_size, help="GPU memory the job needs (e.g. 6GiB); default: measured")
    p.add_argument("--weight", type=float, default=1.0, help="share of GPU time relative to other jobs")
    p.add_argument("--gpus", type=int, default=1, help="GPUs this one process uses; more than one are given to it "
                                                       "exclusively, when that many are free (default 1)")
    p.add_argument("--gpu", type=int, help="run on this GPU (default: gmuxd places the job)")
    p.add_argument("--gang", help="this process is one rank of the torch.distributed job NAME: gmuxd gives each "
                                  "rank a GPU of its own and suspends, resumes and kills the ranks together")
    p.add_argument("--rank", type=int, help="with --gang: this process's rank, 0..WORLD-1")
    p.add_argument("--world", type=int, help="with --gang: the number of ranks")
    p.add_argument("--name")
    p.add_argument("--no-hook", dest="hook", action="store_false",
                   help="the script calls gmux.job.attach() itself; do not install the optimizer hook")
    p.add_argument("--runtime-dir", default=default_runtime_dir())
    p.add_argument("--job", help=argparse.SUPPRESS)       # set by gmuxd / by a migration's re-exec
    p.add_argument("--restore", help=argparse.SUPPRESS)
    a = p.parse_args(argv[:split])
    if not argv[split + 1:]:
        p.error("give the command after --, e.g. gmux-launch -- python train.py")
    if a.gpus < 1:
        p.error(f"--gpus {a.gpus}: a job uses at least one GPU")
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
    return run(LaunchOptions(argv=argv[split + 1:], runtime_dir=a.runtime_dir, mem=a.mem, weight=a.weight,
                             gpus=a.gpus, gpu=a.gpu, name=a.name, hook=a.hook, job=a.job, token=token, restore=a.restore,
                             gang=gang))


if __name__ == "__main__":
    sys.exit(main())
