"""What a job holds on a real GPU, measured from outside: NVML's memory per process, for a job whose own runtime
never says (its size comes from its reports at mini-batch boundaries, and a job that never reaches one sends none).

Such a job, overdue with a command and declared no `--mem`, could not be stopped: the jobs waiting for its GPU
would not be known to fit beside what it keeps, and it held the GPU for as long as it ran. Measured, it is stopped
and continued in turns like any job without boundaries (slicer.py). Only a job that has passed no boundary and is
overdue is measured: one still starting up would be measured before its peak, and the jobs let in beside it could
then run out of memory. What a job holds can still grow in its turns, so the figure only ever rises.

Virtual GPUs have no memory to read from outside: there, such a job still needs `--mem` (README, "a job with no
boundary").
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from gmux.node.inventory import refresh_nvml
from gmux.node.supervisor import descendants
from gmux.util.sizes import format_size

if TYPE_CHECKING:
    from gmux.node.daemon import Daemon


def measure_unsized(node: "Daemon") -> None:
    """Gives each overdue job of undeclared size on a real GPU what NVML shows its processes holding there."""
    unsized = [(gpu, job_id) for gpu, slicer in node.slicers.items() if not node.gpus[gpu].virtual
               for job_id, e in slicer.entries.items()
               if e.overdue and node.jobs[job_id].boundaries == 0 and node.jobs[job_id].mem is None
               and node.jobs[job_id].pid]
    if not unsized:
        return
    refresh_nvml([node.gpus[gpu] for gpu in {gpu for gpu, _ in unsized}])
    for gpu, job_id in unsized:
        job, slicer = node.jobs[job_id], node.slicers[gpu]
        pids = {job.pid, *descendants(job.pid)}
        held = sum(p["mem"] or 0 for p in node.gpus[gpu].processes if p["pid"] in pids)
        if held <= (job.mem_peak or 0):
            continue
        first = slicer.entries[job_id].mem is None
        job.mem_peak = held
        slicer.set_mem(job_id, job.working_set())
        if first:
            node.decide(gpu, "measured", [job_id], {"mem": held},
                        f"GPU {gpu}: {job_id} has reached no boundary and declared no --mem; NVML shows its "
                        f"processes holding {format_size(held)} here, so it is stopped in turns while others run "
                        f"beside it")
