"""A restart from a checkpoint, as gmux-scheduler runs it: the job's newest periodic checkpoint set is sent to the
machine the policy chose (on a worker thread: streaming must not hold the scheduler's loop), and only once it has
arrived complete is the start sent, restoring from it. A failed send puts the job back in the queue, saying why."""
from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING

from gmux.cluster.scheduler.state import CJob, Machine
from gmux.wire import keys
from gmux.wire.transfer import rank_xfers, send_file

if TYPE_CHECKING:
    from gmux.cluster.scheduler.service import Scheduler


class Pushes:
    def __init__(self, scheduler: "Scheduler"):
        self.s = scheduler
        self.done: "queue.SimpleQueue" = queue.SimpleQueue()     # outcomes of the worker threads
        self.pushing: set = set()       # jobs whose checkpoint is on its way to a daemon

    def start(self, job: CJob, m: Machine) -> None:
        base = f"{job.cjob}-r{job.restarts}-{int(time.time() * 1000) % 10**9}"
        paths, endpoint, name, keydir, ctx = list(job.ckpt_paths), m.transfer, m.name, self.s.keydir, self.s.ctx
        xfers = rank_xfers(base, len(paths))

        def work():
            try:
                server_key = keys.load_public(keydir, "daemon", name)
                total = {"bytes": 0, "seconds": 0.0}
                for path, xfer in zip(paths, xfers):
                    r = send_file(path, endpoint, server_key, keydir, "scheduler", None, xfer, context=ctx)
                    total["bytes"] += r["bytes"]
                    total["seconds"] += r["seconds"]
                self.done.put((job.cjob, name, xfers, total, None))
            except Exception as e:
                self.done.put((job.cjob, name, xfers, None, str(e)))
        self.pushing.add(job.cjob)
        threading.Thread(target=work, daemon=True, name=f"push-{job.cjob}").start()

    def drain(self) -> None:
        """From the scheduler's loop: the starts (or the failures) of the checkpoints that have been sent."""
        s = self.s
        while True:
            try:
                cjob, name, xfers, figures, error = self.done.get_nowait()
            except queue.Empty:
                return
            self.pushing.discard(cjob)
            job = s.jobs[cjob]
            if job.machine != name or job.state != "starting":
                continue
            if error:
                job.machine, job.gpu, job.rank_gpus = None, None, []
                job.set("pending", f"checkpoint push to {name} failed: {error}")
                s._log("push_failed", cjob, job.detail)
                continue
            s._action(name, "start", cjob, **s._start_args(job, restore=xfers))
            # (said until its first boundary there: starting a process and restoring take seconds)
            job.set("starting", f"restoring its checkpoint (step {job.ckpt_step}) on {name}")
            s._log("restart", cjob, f"{cjob}: checkpoint at step {job.ckpt_step} sent to {name} "
                                    f"({figures['bytes']} B in {figures['seconds']:.3f} s); restoring there")
