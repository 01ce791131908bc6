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
                 and leave the job held there, so the send's outcome (migrate_sent / migrate_failed) settles it;
                 the source is told to abandon its send, which would otherwise wait out every silence of the
                 target's dead endpoint (6 x 10 s) before it failed
  abandoned      the source's gmuxd restarted while it was sending, and the send's outcome was lost with it: the
                 target gives up its start unless it has restored, and says which (started / start_failed)
A move that does not happen leaves the job on its source, on the GPUs it had there, running.

The move lives in its job's record (`CJob.move`: stage, target, endpoint, transfer name, since), written to SQLite
at each change of stage, so a scheduler restarted mid-move carries it on: a warming move whose "ready" may have
been lost with the old process sends at once (its target restores the checkpoint whenever it is ready).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gmux.cluster.scheduler.state import CJob
from gmux.wire.transfer import rank_xfers

if TYPE_CHECKING:
    from gmux.cluster.scheduler.service import Scheduler

MIGRATE_WAIT_S = 600.0     # how long a move's new processes wait for their checkpoints before giving up
WARM_WAIT_S = 120.0        # how long a move's source computes on while its new processes start (then it suspends)
GIVEN_UP = ("abandoned", "target_failed")    # the stages that wait for one machine's answer to an "abandon"


class Moves:
    EVENTS = ("ready", "migrate_sent", "migrate_failed")    # the link events only a move has

    def __init__(self, scheduler: "Scheduler"):
        self.s = scheduler
        # cjob -> the source of its move, restored on its target before the source's "migrate_sent" came (two
        # links, two paths): that late event still has the transfer's figures to log.
        self.sent_after_arrival: dict = {}
        for job in scheduler.jobs.values():
            if job.move.get("stage") == "warming" and job.state == "migrating":
                job.move["since"] = -WARM_WAIT_S     # (its "ready" may have been lost: expire() sends it)
                job.move.pop("why", None)
            elif job.move.get("stage") in GIVEN_UP and job.state == "migrating":
                job.move["told"] = False             # (its answer may have gone with the old process: asked again)

    def _set(self, job: CJob, **move) -> None:
        """The move's new stage (or none: move={}), written at once: a restarted scheduler goes on from it."""
        job.move = move
        self.s.state.save(job)

    def start(self, job: CJob, machine: str, gpus: list, why: str = "") -> None:
        """Moves `job` to `machine`, rank r to gpus[r]: its new processes are started there first."""
        s = self.s
        target = s.machines[machine]
        self.sent_after_arrival.pop(job.cjob, None)
        job.source, job.source_gpus = job.machine, list(job.rank_gpus or [job.gpu])
        job.machine, job.gpu, job.rank_gpus = machine, gpus[0], list(gpus)
        job.attained += job.gpu_seconds
        job.gpu_seconds, job.parked = 0.0, False
        was = job.state            # (a suspended job whose move fails stays suspended where it was)
        job.set("migrating", f"{job.source} -> {machine}")
        xfer = f"{job.cjob}-m{job.migrations + 1}-{int(time.time() * 1000) % 10**9}"
        self._set(job, stage="warming", since=time.monotonic(), target=machine, endpoint=target.transfer, xfer=xfer,
                  was=was)
        sent = s._action(machine, "start", job.cjob, **s._start_args(job, restore=rank_xfers(xfer, job.gpus)),
                         restore_wait=MIGRATE_WAIT_S)
        s._log("migrate", job.cjob, f"migrate {job.cjob} {job.source} -> {machine} GPU {','.join(map(str, gpus))} "
                                    f"({why})")
        if not sent:
            # (its link not connected, as just after a scheduler restarts: the start is never sent again, and the
            # source would send its checkpoint to a machine with nothing to restore it, the job held for good)
            self.target_failed(job, f"its move to {machine} was given up: {machine} could not be reached")

    def arrived(self, job: CJob, name: str, d: dict) -> None:
        """The target `name` has restored the job (its link's "started"): the source releases it."""
        self.s._action(job.source, "release", job.cjob)
        if job.move.get("stage") != "sent":
            self.sent_after_arrival[job.cjob] = job.source
        # (no step here: the target's first boundaries are counted before its report says where it restored to)
        self.s._log("migrated", job.cjob, f"{job.cjob} restored on {name}, training there; {job.source} releases it",
                    d)
        job.migrations += 1
        job.source = None
        self._set(job)

    def event(self, job: CJob, name: str, ev: str, d: dict, detail: str) -> None:
        """One of EVENTS about `job` from the link of machine `name`."""
        s = self.s
        if ev == "ready" and job.machine == name and job.state == "migrating" and job.move.get("stage") == "warming":
            self._suspend_source(job, f"its new processes on {name} are ready")
        elif ev == "migrate_sent" and self.sent_after_arrival.get(job.cjob) == name:
            del self.sent_after_arrival[job.cjob]
            self._log_sent(job, name, d)
        elif ev == "migrate_sent" and job.source == name and job.state == "migrating":
            self._log_sent(job, name, d)
            if job.move.get("stage") == "target_failed":
                self._back(job, job.detail, resume=True)
            else:
                self._set(job, **{**job.move, "stage": "sent"})
        elif ev == "migrate_failed" and job.source == name:
            target, target_failed = job.machine, job.move.get("stage") == "target_failed"
            if not target_failed:
                s._action(target, "kill", job.cjob)     # the new processes waiting for the checkpoint
            # (after a target's failure, the send only gave up: that failure says why, as target_failed keeps it)
            self._back(job, job.detail if target_failed else f"migration to {target} failed, kept on {name}: {detail}",
                       resume=False)        # (the source's link resumed it, unless it was suspended before)
            s._log("migrate_failed", job.cjob, f"{job.cjob}: migration from {name} to {target} failed: {detail}")

    def _log_sent(self, job: CJob, source: str, d: dict) -> None:
        self.s._log("migrate_sent", job.cjob, f"{job.cjob}: checkpoint ({d.get('bytes')} B) sent {source} -> "
                                              f"{job.machine} in {d.get('seconds', 0):.3f} s", d)

    def target_failed(self, job: CJob, why: str) -> None:
        """The move's new processes are gone: the job stays on its source (see target_failed in the module's
        docstring)."""
        stage = job.move.get("stage")
        why = job.move.get("why", why) if stage == "abandoned" else why
        if stage == "sending":
            job.detail = why
            self._set(job, **{**job.move, "stage": "target_failed", "told": False})
            self._tell(job)
            return
        self._back(job, why, resume=stage != "warming")     # (warming: the source never stopped computing)

    def _back(self, job: CJob, why: str, resume: bool) -> None:
        """The move did not happen: the job is on its source again, running (`resume`: resumed there), or
        suspended if it was before, and not resumed (a policy's resume elsewhere that failed: its GPUs there may
        be another's now)."""
        suspended = not _runs_on(job)
        if job.kill_requested:      # (killed during the move: it ends where it is back, never resumed there)
            self.s._action(job.source, "kill", job.cjob)
            resume, why = False, f"killing it: {why}"
        if resume and not suspended:
            self.s._action(job.source, "resume", job.cjob)
        _back_to_source(job)
        job.set("suspended" if suspended else "running", why)
        self._set(job)

    def target_restarted(self, name: str) -> None:
        """A new gmuxd speaks for machine `name` (its old one was killed and started again, sooner than the machine
        is counted lost): the moves to it are given up, as for a lost target. What carried a move on there lived in
        the old gmuxd's cluster link, in memory: the start it was sent, the processes it spawned, the transfer it
        expected. The new link re-attaches those processes but never says "ready" or "started" of them, and listens
        for transfers at a new endpoint: the move waited WARM_WAIT_S for a "ready", then had its source suspend the
        job and send to the old endpoint until the sender gave up (185 s in all, the last 65 with the job stopped);
        once sent, it waited for a "started" for good. The new processes there are killed as copies of a job that
        has left the machine (by the report being read, the new link's first)."""
        for job in self.s.jobs.values():
            if job.state == "migrating" and job.machine == name and job.source:
                self.s._log("migrate_failed", job.cjob, f"{job.cjob}: its move to {name} is given up: {name}'s gmuxd "
                                                        f"restarted, and the new one knows nothing of it")
                self.target_failed(job, f"migration target {name} restarted its gmuxd")

    def source_restarted(self, name: str) -> None:
        """A new gmuxd speaks for machine `name`: of the moves from it, those that were sending lost the send
        with the old gmuxd's link (it ran on a thread of it), and no outcome would ever come: the job stayed
        "migrating" for good, held suspended at its source (the new gmuxd re-attaches it held), its new
        process on the target waiting MIGRATE_WAIT_S for the rest of a checkpoint nobody sends. The target is
        told to abandon its start: one that restored already (the whole checkpoint had arrived) goes on there,
        and the source releases its copy; any other is killed, and the job runs on at its source. Where the
        target had failed already, the job runs on at its source now. A warming move loses nothing (the new
        link is asked to send), nor does a sent one (the new link releases the job once it is restored)."""
        for job in self.s.jobs.values():
            if job.state != "migrating" or job.source != name:
                continue
            stage = job.move.get("stage")
            if stage == "target_failed":
                self._back(job, f"{job.detail}; {name} restarted its gmuxd while it sent the checkpoint", resume=True)
            elif stage == "sending":
                self.s._log("migrate_failed", job.cjob, f"{job.cjob}: {name}'s gmuxd restarted while it sent the "
                                                        f"checkpoint to {job.machine}: the move is given up unless "
                                                        f"{job.machine} has restored it")
                self._set(job, **{**job.move, "stage": "abandoned", "told": False,
                                  "why": f"its move to {job.machine} was given up: {name} restarted its gmuxd "
                                         f"while it sent the checkpoint"})
                self._tell(job)

    def _tell(self, job: CJob) -> None:
        """Tells the machine whose answer settles a given-up move (GIVEN_UP) to give its part up: an abandoned
        move's target its start, a failed target's source its send. One not connected is told at the next tick;
        so is one whose answer a restarted scheduler may not have heard (the link answers again)."""
        machine, of = (job.machine, "start") if job.move["stage"] == "abandoned" else (job.source, "send")
        if self.s._action(machine, "abandon", job.cjob, of=of, **({"resume": _runs_on(job)} if of == "send" else {})):
            self._set(job, **{**job.move, "told": True})

    def give_up_for_kill(self, job: CJob) -> None:
        """A kill during a move ends the job where it runs: until its checkpoints are on the target ("sent") that is
        the source, so the target's new processes are killed and the job is back on its source, which the kill
        then reaches (sent only to the target, it ended nothing there and the move never completed); once they
        are, both copies are killed."""
        if job.state != "migrating" or not job.source:
            return
        if job.move.get("stage") == "sent":
            # Its copy at the source waits suspended for the target's restore: killed too (left, it was resumed
            # there once the target's copy had been killed, and trained until the kill was sent again, 10 s on).
            self.s._action(job.source, "kill", job.cjob)
            return
        self.s._action(job.machine, "kill", job.cjob)
        _back_to_source(job)
        job.set("running", "killing it: its move was given up")
        self._set(job)

    def machine_lost(self, job: CJob, name: str) -> bool:
        """Machine `name` is lost: a move of `job` from it goes on if its checkpoint is on the target, else the job
        is lost with its source (it is on `name` again, for the caller to restart elsewhere); a move to it leaves
        the job on its source. True: the job is settled, nothing more to do about the loss."""
        if job.state != "migrating":
            return False
        if job.source == name:
            if job.move.get("stage") == "sent":
                job.source = None
            else:
                # (released, not killed: the job restarts from its checkpoint, perhaps on that machine, and the
                # end of this copy there was taken for the new one's, which the machine had ignored for it)
                self.s._action(job.machine, "release", job.cjob)
                job.machine = name
                self._set(job)
        elif job.machine == name and job.source:
            self.target_failed(job, f"migration target {name} lost")
            return True
        return False

    def expire(self, now: float) -> None:
        """Moves whose new processes are not ready after WARM_WAIT_S (time.monotonic `now`) go on without waiting
        for them; a warming move whose job is no longer migrating is forgotten; a given-up move whose machine could
        not be told is told again."""
        for job in self.s.jobs.values():
            if job.move.get("stage") in GIVEN_UP and job.state == "migrating" and not job.move.get("told"):
                self._tell(job)
            if job.move.get("stage") != "warming":
                continue
            if job.final or job.state != "migrating":
                self._set(job)
            elif now - job.move["since"] > WARM_WAIT_S:
                why = job.move.get("why") or ("the scheduler restarted while they started" if job.move["since"] < 0
                                              else f"its new processes on {job.machine} not ready after "
                                                   f"{WARM_WAIT_S:g} s")
                self._suspend_source(job, why)

    def _suspend_source(self, job: CJob, why: str) -> None:
        """The second half of a move: the source suspends the job and streams its checkpoint to the target. A
        source not connected (its link not yet back after a restart of this scheduler) is asked again at the next
        tick: the move stays warming, never "sending" with nothing sent."""
        move = job.move
        if not self.s._action(job.source, "migrate_out", job.cjob, resume=_runs_on(job),
                              **{k: move[k] for k in ("target", "endpoint", "xfer")}):
            if move["since"] >= 0:
                self._set(job, **{**move, "since": -WARM_WAIT_S, "why": why})
            return
        self._set(job, **{**{k: v for k, v in move.items() if k != "why"}, "stage": "sending"})
        self.s._log("migrate_out", job.cjob, f"{job.cjob}: {why}; {job.source} suspends it and sends its checkpoint")


def _runs_on(job: CJob) -> bool:
    """Whether the job runs on at its source if its move fails: not where it was suspended before the move (its
    GPUs there may be another's now)."""
    return job.move.get("was") != "suspended"


def _back_to_source(job: CJob) -> None:
    """A move that did not happen: the job is where it was, on the GPUs it had there."""
    job.machine, job.source = job.source, None
    job.rank_gpus = list(job.source_gpus)
    job.gpu = job.rank_gpus[0] if job.rank_gpus else None
