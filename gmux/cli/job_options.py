"""The options every way of starting a job shares (gmux-launch, gmux submit, gmux submit --cluster), said once."""
from __future__ import annotations

import argparse

from gmux.cli.argtypes import cluster_job_name, job_memory, job_name, weight
from gmux.protocol import WEIGHTS


def add_job_options(p: argparse.ArgumentParser, cluster: bool = False) -> None:
    p.add_argument("--name", type=cluster_job_name if cluster else job_name,
                   help="a name for the job, shown by gmux ps (not one that reads as a job id, "
                        f"{'c7' if cluster else 'j45'}, or is written in lookalike characters)")
    p.add_argument("--mem", type=job_memory, help="GPU memory the job needs (e.g. 6GiB), and its limit: an "
                                                     "allocation past it fails with an out-of-memory error; default: "
                                                     "measured, no limit")
    p.add_argument("--weight", type=weight, default=1.0,
                   help=f"share of GPU time relative to other jobs, {WEIGHTS[0]:g} to {WEIGHTS[1]:g} (default 1)")
