"""A job's move from one machine to another, as gmux-scheduler runs it (the daemons' side: gmux.node.cluster_link).

The new processes start first and the job computes on at its source meanwhile: a fresh interpreter, torch and the
model cost as much as the move itself, and are no downtime that way. Once they wait for their checkpoints (their
link says "ready"; or after WARM_WAIT_S) the source suspends every rank at one boundary, checkpoints each and
streams them to the target, which restores them as they arrive (a gang with a new rendezvous); only once the
target has started them is the source told to release the job.

A move's stage:
  warming        its new processes start on the target; the source computes on
  sending        the source suspends the job and streams its checkpoints
  sent           its checkpoints are on the target: losing the source no longer matters
  target_failed  the target failed while the source was sending: a resume could land before the source's suspend
                 and leave the job held there, so the send's outcome (migrate_sent / migrate_failed) settles it
A move that does not happen leaves the job on its source, on the GPUs it had there, running.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from gmux.cluster.scheduler.state import CJob
from gmux.wire.transfer import rank_xfers

if TYPE_CHECKING:
    from gmux.cluster.scheduler.service import Scheduler

MIGRATE_WAIT_S = 600.0     # how long a move's new processes wait for their checkpoints before giving up
WARM_WAIT_S = 120.0        # how long a move's source computes on while its new processes start (then it suspends)


@dataclass
class Move:
    stage: str                      # see the module's docstring
    since: float = 0.0              # when its new processes were asked to start (time.monotonic)
    out: Optional[dict] = None      # its migrate_out's args, sent to the source once they are ready


class Moves:
    EVENTS = ("ready", "migrate_sent", "migrate_failed")    # the link events only a move has

    def __init__(self, scheduler: "Scheduler"):
        self.s = scheduler
        # Not in SQLite: after a restart, a warming move's "ready" starts no send (its target gives up after
        # MIGRATE_WAIT_S and the job stays on its source).
        self.by_job: dict[str, Move] = {}

    def _stage(self, cjob: str) -> Optional[str]:
        move = self.by_job.get(cjob)
        return move.stage if move else None

    def start(self, job: CJob, machine: str, gpus: list, why: str = "") -> None:
        """Moves `job` to `machine`, rank r to gpus[r]: its new processes are started there first."""
        s = self.s
        target = s.machines[machine]
        job.source, job.source_gpus = job.machine, list(job.rank_gpus or [job.gpu])
        job.machine, job.gpu, job.rank_gpus = machine, gpus[0], list(gpus)
        job.attained += job.gpu_seconds
        job.gpu_seconds = 0.0
        job.set("migrating", f"{job.source} -> {machine}")
        xfer = f"{job.cjob}-m{job.migrations + 1}-{int(time.time() * 1000) % 10**9}"
        self.by_job[job.cjob] = Move("warming", time.monotonic(),
                                     {"target": machine, "endpoint": target.transfer, "xfer": xfer})
        s._action(machine, "start", job.cjob, **s._start_args(job, restore=rank_xfers(xfer, job.gpus)),
                  restore_wait=MIGRATE_WAIT_S)
        s._log("migrate", job.cjob, f"migrate {job.cjob} {job.source} -> {machine} GPU {','.join(map(str, gpus))} "
                                    f"({why})")

    def arrived(self, job: CJob, name: str, d: dict) -> None:
        """The target `name` has restored the job (its link's "started"): the source releases it."""
        self.s._action(job.source, "release", job.cjob)
        self.s._log("migrated", job.cjob, f"{job.cjob} restored on {name} at step {d.get('step')}; "
                                          f"{job.source} releases it", d)
        job.migrations += 1
        job.source = None
        self.by_job.pop(job.cjob, None)

    def event(self, job: CJob, name: str, ev: str, d: dict, detail: str) -> None:
        """One of EVENTS about `job` from the link of machine `name`."""
        s = self.s
        if ev == "ready" and job.machine == name and job.state == "migrating" and self._stage(job.cjob) == "warming":
            self._suspend_source(job, f"its new processes on {name} are ready")
        elif ev == "migrate_sent" and job.source == name and job.state == "migrating":
            s._log("migrate_sent", job.cjob, f"{job.cjob}: checkpoint ({d.get('bytes')} B) sent {name} -> "
                                             f"{job.machine} in {d.get('seconds', 0):.3f} s", d)
            if self._stage(job.cjob) == "target_failed":
                s._action(name, "resume", job.cjob)
                self.by_job.pop(job.cjob)
                _back_to_source(job)
                job.set("running")
            else:
                self.by_job[job.cjob] = Move("sent")
        elif ev == "migrate_failed" and job.source == name:
            move = self.by_job.pop(job.cjob, None)
            if move is None or move.stage != "target_failed":
                s._action(job.machine, "kill", job.cjob)     # the new processes waiting for the checkpoint
            _back_to_source(job)
            job.set("running", f"migration failed, kept on {name}: {detail}")
            s._log("migrate_failed", job.cjob, f"{job.cjob}: migration from {name} failed: {detail}")

    def target_failed(self, job: CJob, why: str) -> None:
        """The move's new processes are gone: the job stays on its source (see target_failed in the module's
        docstring)."""
        stage = self._stage(job.cjob)
        if stage == "sending":
            self.by_job[job.cjob].stage = "target_failed"
            job.detail = why
            return
        if stage != "warming":      # (warming: the source never stopped computing)
            self.s._action(job.source, "resume", job.cjob)
        self.by_job.pop(job.cjob, None)
        _back_to_source(job)
        job.set("running", why)

    def machine_lost(self, job: CJob, name: str) -> bool:
        """Machine `name` is lost: a move of `job` from it goes on if its checkpoint is on the target, else the job
        is lost with its source (it is on `name` again, for the caller to restart elsewhere); a move to it leaves
        the job on its source. True: the job is settled, nothing more to do about the loss."""
        if job.state != "migrating":
            return False
        if job.source == name:
            if self._stage(job.cjob) == "sent":
                job.source = None
            else:
                self.by_job.pop(job.cjob, None)
                self.s._action(job.machine, "kill", job.cjob)
                job.machine = name
        elif job.machine == name and job.source:
            self.target_failed(job, f"migration target {name} lost")
            return True
        return False

    def expire(self, now: float) -> None:
        """Moves whose new processes are not ready after WARM_WAIT_S (time.monotonic `now`) go on without waiting
        for them; a warming move whose job is no longer migrating is forgotten."""
        for cjob, move in list(self.by_job.items()):
            if move.stage != "warming":
                continue
            job = self.s.jobs[cjob]
            if job.final or job.state != "migrating":
                self.by_job.pop(cjob)
            elif now - move.since > WARM_WAIT_S:
                self._suspend_source(job, f"its new processes on {job.machine} not ready after {WARM_WAIT_S:g} s")

    def _suspend_source(self, job: CJob, why: str) -> None:
        """The second half of a move: the source suspends the job and streams its checkpoint to the target."""
        move = self.by_job[job.cjob]
        move.stage = "sending"
        self.s._action(job.source, "migrate_out", job.cjob, **move.out)
        self.s._log("migrate_out", job.cjob, f"{job.cjob}: {why}; {job.source} suspends it and sends its checkpoint")


def _back_to_source(job: CJob) -> None:
    """A move that did not happen: the job is where it was, on the GPUs it had there."""
    job.machine, job.source = job.source, None
    job.rank_gpus = list(job.source_gpus)
    job.gpu = job.rank_gpus[0] if job.rank_gpus else None
