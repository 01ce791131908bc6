"""Run an unmodified training script as a gmux job, through the transparent optimizer hook.

    python -m gmux.job.run [--cycle-every N] [--hold S] script.py [args...]

With --cycle-every N the job is suspended and resumed at every Nth boundary (held suspended for --hold
seconds): a way to check that a script survives suspension bit-identically before trusting it to a
multiplexer. Without it, the hook only measures (see the summary printed at exit). The script runs through
the runner gmux-launch uses (runner.py); what is this module's own is the local controller that cycles.

On a GPU, the script's allocations are routed through gmux's native allocator before it runs (the
allocator tier: suspend keeps every pointer valid); --no-native keeps torch's own allocator and the state
tier. On the CPU, --pool SIZE gives the job a virtual GPU of that much memory (gmux's native pool and the allocator
tier; with --no-native, the Python pool and the state tier). --mem SIZE sets the job's memory limit as
gmux-launch --mem does: an allocation past it fails with torch.OutOfMemoryError.
"""
from __future__ import annotations

import argparse
import atexit
import math
import os
import sys
import time
from typing import Optional

from gmux.util.sizes import parse_size

from . import control, runner
from .control import Command


class CycleController:
    """Suspends at every Nth boundary and resumes after `hold` seconds; answers are kept as figures."""

    def __init__(self, every: int, hold: float = 0.0):
        if every < 1:
            raise ValueError(f"--cycle-every must be at least 1, got {every}")
        self.every, self.hold = every, hold
        self.boundaries = 0
        self.replies: list[tuple[str, dict]] = []
        self.reports: list[dict] = []

    def poll(self) -> Optional[Command]:
        self.boundaries += 1
        return Command("suspend") if self.boundaries % self.every == 0 else None

    def wait(self, timeout: Optional[float] = None) -> Optional[Command]:
        time.sleep(self.hold)
        return Command("resume")

    def report(self, report: dict) -> None:
        self.reports.append(report)

    def reply(self, command: Command, result: dict) -> None:
        self.replies.append((command.kind, result))
        if not result.get("ok"):
            print(f"gmux: {command.kind} failed: {result.get('error')}", file=sys.stderr)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gmux.job.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycle-every", type=int, default=0, metavar="N", help="suspend+resume every N boundaries")
    p.add_argument("--hold", type=float, default=0.0, metavar="S", help="seconds to stay suspended (default 0)")
    p.add_argument("--pool", default=None, metavar="SIZE", help="virtual GPU memory on the CPU, e.g. 2GiB")
    p.add_argument("--no-native", action="store_true", help="use the state tier only")
    p.add_argument("--mem", default=None, metavar="SIZE", help="the job's memory limit (as gmux-launch --mem): an "
                                                               "allocation past it fails with an out-of-memory error")
    p.add_argument("script", help="the training script, run as __main__")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    if not os.path.isfile(a.script):
        p.error(f"no such script: {a.script}")
    try:
        pool_bytes = parse_size(a.pool) if a.pool else 0
        mem_limit = parse_size(a.mem) if a.mem else None
    except ValueError as e:
        p.error(f"--pool/--mem: {e}")
    # (each was a traceback, or worse: --hold nan/-1/inf from inside the job after its first suspend, --cycle-every
    # -1 a ValueError, and a --pool past the machine's memory faulted in until the kernel's OOM killer came)
    if a.cycle_every < 0:
        p.error(f"--cycle-every: {a.cycle_every} is not an integer >= 0 (0: never)")
    if not 0 <= a.hold < math.inf:
        p.error(f"--hold: {a.hold:g} is not a finite number >= 0")
    if a.mem is not None and not mem_limit:
        p.error(f"--mem: {a.mem} is not a size > 0")
    if a.pool is not None and not pool_bytes:
        p.error(f"--pool: {a.pool} is not a size > 0 (leave it out for no virtual GPU)")
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if pool_bytes > ram:
        p.error(f"--pool: {a.pool} is more than this machine's memory ({ram / 2**30:.1f} GiB)")
    controller = CycleController(a.cycle_every, a.hold) if a.cycle_every else None
    # a script that attaches itself (gmux.job.attach) is cycled too, as gmux-launch drives it
    control.set_default(controller)
    hooked = runner.prepare(controller, pool_bytes=pool_bytes, native=not a.no_native, mem_limit=mem_limit)

    def summary():
        from .api import current
        job = current() or hooked          # (the script's own job, where it attached one)
        s, r = job.profile.last_suspend, job.profile.last_resume
        print(f"gmux: {job.profile.steps} boundaries ({job.control}), {job.profile.suspends} suspends, "
              f"{job.tier.name} tier ({job.profile.bytes_moved / 2**20:.1f} MiB moved; last suspend "
              f"{s.get('total_s', 0) * 1e3:.2f} ms, resume {r.get('total_s', 0) * 1e3:.2f} ms)", file=sys.stderr)
    atexit.register(summary)
    status, _ = runner.run_script("path", a.script, [a.script, *a.args])
    return status


if __name__ == "__main__":
    sys.exit(main())
