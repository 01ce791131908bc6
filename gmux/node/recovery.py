"""A restarted gmuxd re-attaches to the jobs of the one before it (gmux.node.daemon): alive ones go back on their
GPU (or to the queue, or stay parked), those that ended since are closed, and the newest that ended before are in
the table again (gmux ps, gmux logs)."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gmux.node.daemon import Daemon

log = logging.getLogger("gmux.daemon")


def recover(node: "Daemon") -> None:
    now = time.monotonic()
    node.store.prune(time.time() - node.opt.retain_ended)
    logged = node.rundir.logged_job_numbers()
    node.store.ids_from(max(logged, default=0) + 1)     # a new job never appends to another's log
    jobs = node.store.load()
    if logged and not jobs:
        log.warning("the job table is empty but %s holds the logs of jobs up to j%d: the table of the gmuxd "
                    "before this one was lost; jobs it started that still run are adopted at their next message "
                    "(gmux/node/adoption.py)", node.rundir.logs(), max(logged))
    for job in jobs:
        node.jobs[job.id] = job
        if job.final:
            continue
        ended = node.sup.ended(job) if job.pid else ("lost", None, "never started")
        if ended is not None:
            node.finish(job, *ended)
            continue
        job.registered = True   # alive: registered, or about to (re-registering is the same)
        node.resume_retries.restored(job, time.monotonic())
        node.moves.recover(job)
        if job.stopped_by_gmux:
            # The previous daemon stopped it and cannot continue it: continued, it takes its suspend at
            # its next boundary (or runs on, boundless, until this daemon stops it again in its turn).
            node.sup.cont(job)
            job.stopped_by_gmux = False
        if job.state == "migrating":
            continue   # its process re-registers after re-executing
        if job.parked_gpus and job.held:
            job.gpu = None
            continue   # suspended, its GPUs given back: it waits for `gmux resume`
        if job.gpu is None or (job.exclusive and not job.exclusive_gpus):
            job.gpu = None
            node.admission.requeue(job)
            continue
        gpu = job.gpu if job.gpu in node.slicers else 0
        job.gpu = gpu
        resident = job.state in ("running", "suspending", "resuming", "stopped")
        node.slicers[gpu].add(job.id, job.weight, job.working_set(), now, resident=resident,
                              used=job.gpu_seconds, confirm=True, stoppable=not job.exclusive)
        if job.held:
            node.slicers[gpu].hold(job.id)
        node.decide(gpu, "reattach", [job.id], {"state": job.state, "pid": job.pid},
                    f"re-attached {job.id} (pid {job.pid}, {job.state}) after a daemon restart")
    node.forget_ended()
