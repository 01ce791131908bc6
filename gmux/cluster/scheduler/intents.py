"""What gmux-scheduler does with a policy's intents (gmux.cluster.scheduler.driver): starts, suspends, resumes,
moves on a machine and migrations between machines, each sent to the daemon it concerns and logged. An intent
for a job already starting or moving, or a migration of a job that cannot be checkpointed, is skipped, and said
once: a policy may propose the same thing on every tick until the world changes."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gmux.cluster.scheduler.driver import Intent

if TYPE_CHECKING:
    from gmux.cluster.scheduler.service import Scheduler


class Intents:
    def __init__(self, s: "Scheduler"):
        self.s = s
        self.skipped: dict[str, str] = {}   # cjob -> the last reason an intent for it was skipped (logged once)

    def carry_out(self, it: Intent) -> None:
        s = self.s
        job = s.jobs[it.cjob]
        # (a move of a job with no boundary would start it afresh elsewhere while its copy here computed on)
        unmovable = it.what == "migrate" and (job.boundless or job.unmovable)
        if job.state in ("starting", "migrating") or it.what == "none" or unmovable:
            why = it.why + ("" if not unmovable else
                            "; not moved: it has reached no boundary, so it cannot be checkpointed" if job.boundless
                            else f"; not moved: a new process would not continue it exactly ({job.unmovable})")
            if why and self.skipped.get(job.cjob) != why:
                self.skipped[job.cjob] = why
                s._log("skip", job.cjob, f"{job.cjob}: {why}")
            return
        self.skipped.pop(job.cjob, None)
        m = s.machines.get(it.machine) if it.machine else None
        if it.what == "start":
            job.machine, job.gpu, job.rank_gpus = it.machine, it.gpu, list(it.gpus)
            if job.ckpt_paths and all(os.path.exists(p) for p in job.ckpt_paths):
                job.set("starting", f"sending its checkpoint (step {job.ckpt_step}) to {it.machine}")
                s.pushes.start(job, m)
            else:
                job.set("starting", f"started on {it.machine} GPU {it.gpu}")
                s._action(it.machine, "start", job.cjob, **s._start_args(job))
            s._log("place", job.cjob, f"{job.cjob} -> {it.machine} GPU {','.join(map(str, it.gpus))} ({it.why})")
        elif it.what == "suspend":
            job.set("suspended")
            s._action(job.machine, "suspend", job.cjob)
            s._log("suspend", job.cjob, f"suspend {job.cjob} on {job.machine} ({it.why})")
        elif it.what == "resume":
            job.set("running", "")      # (what it said while suspended, "released by alice: runs in its turn", is over)
            job.gpu, job.rank_gpus = it.gpu, list(it.gpus)
            s._action(job.machine, "resume", job.cjob, gpu=it.gpu)
            s._log("resume", job.cjob, f"resume {job.cjob} on {job.machine} GPU {it.gpu}")
        elif it.what == "move":
            job.gpu, job.rank_gpus = it.gpu, list(it.gpus)
            s._action(job.machine, "move", job.cjob, gpu=it.gpu)
            s._log("move", job.cjob, f"move {job.cjob} to GPU {it.gpu} of {job.machine}")
        elif it.what == "migrate":
            s.moves.start(job, it.machine, list(it.gpus), it.why)

