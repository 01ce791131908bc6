"""gmux-launch [--mem SIZE] [--weight W] [--gpus N] -- python train.py ARGS: run a script as a gmux job."""
from __future__ import annotations

import argparse
import os
import sys

from gmux.node.inventory import parse_size
from gmux.node.launcher import LaunchOptions, run
from gmux.node.paths import default_runtime_dir


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: gmux-launch [--mem SIZE] [--weight W] [--gpus N] -- python train.py ARGS", file=sys.stderr)
        return 2
    split = argv.index("--")
    p = argparse.ArgumentParser(prog="gmux-launch", description="Run an unmodified training script as a gmux job.")
    p.add_argument("--mem", type=parse_size, help="GPU memory the job needs (e.g. 6GiB); default: measured")
    p.add_argument("--weight", type=float, default=1.0, help="share of GPU time relative to other jobs")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--gpu", type=int, help="run on this GPU (default: gmuxd places the job)")
    p.add_argument("--name")
    p.add_argument("--no-hook", dest="hook", action="store_false",
                   help="the script calls gmux.job.attach() itself; do not install the optimizer hook")
    p.add_argument("--runtime-dir", default=default_runtime_dir())
    p.add_argument("--job", help=argparse.SUPPRESS)       # set by gmuxd / by a migration's re-exec
    p.add_argument("--restore", help=argparse.SUPPRESS)
    a = p.parse_args(argv[:split])
    if not argv[split + 1:]:
        p.error("give the command after --, e.g. gmux-launch -- python train.py")
    token = os.environ.pop("GMUX_JOB_TOKEN", None) if a.job else None
    return run(LaunchOptions(argv=argv[split + 1:], runtime_dir=a.runtime_dir, mem=a.mem, weight=a.weight,
                             gpus=a.gpus, gpu=a.gpu, name=a.name, hook=a.hook, job=a.job, token=token, restore=a.restore))


if __name__ == "__main__":
    sys.exit(main())
