"""Why a pending job waits, in facts the scheduler holds (`gmux ps --cluster` shows it for a job with nothing
more particular to say): no machine up, none wide enough, or how many GPUs are free on the emptiest machine
beside how many it needs. Which job the policy serves first is the policy's; this says what there is."""
from __future__ import annotations

from gmux.cluster.scheduler.state import CJob, Machine

HOLDING = ("starting", "running", "held", "migrating")    # states whose job keeps its GPUs (suspended: gives them)


def waiting_reasons(jobs: dict[str, CJob], machines: dict[str, Machine]) -> dict[str, str]:
    """cjob -> why, for every pending job."""
    pending = [j for j in jobs.values() if j.state == "pending"]
    if not pending:
        return {}
    up = [m for m in machines.values() if m.state == "up"]
    if not up:
        lost = sum(m.state == "lost" for m in machines.values())
        return {j.cjob: "no machine is up" + (f" ({lost} lost)" if lost else " (none has joined)") for j in pending}
    held: dict[str, set] = {}
    for j in jobs.values():
        if j.state in HOLDING and j.machine:
            held.setdefault(j.machine, set()).update(j.rank_gpus or [j.gpu])
        if j.state == "migrating" and j.source:
            held.setdefault(j.source, set()).update(j.source_gpus)
    free = max(len(m.gpus) - len(held.get(m.name, ())) for m in up)
    widest = max(len(m.gpus) for m in up)
    out = {}
    for j in pending:
        if j.gpus > widest:
            out[j.cjob] = f"needs {j.gpus} GPUs on one machine; the widest machine up has {widest}"
        elif j.gpus > free:
            out[j.cjob] = f"waiting for {j.gpus} GPU(s) on one machine: at most {free} free now"
        else:
            out[j.cjob] = f"queued: {free} GPU(s) free on one machine; placed at the policy's next decision " \
                          f"unless it serves another job first"
    return out
