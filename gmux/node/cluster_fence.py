"""A machine cut off from its scheduler stops training its cluster jobs before the scheduler starts them elsewhere.

The scheduler counts a machine lost once it has heard nothing from it for --lost-after, and starts its jobs on
other machines from their last checkpoints. When the machine itself lives on (a network partition, a switch that
drops one rack), its jobs would train on: two copies of one job, both writing the same files. The job's own
lease (gmux.job.launch) only covers a gmuxd that stopped answering its jobs; here gmuxd answers them, and only
the link's way to the scheduler is gone.

So the scheduler answers every report with the jobs' lease (0.8 of --lost-after), and a link that has had no
answer for that long suspends every cluster job it runs, through gmuxd like any suspend (a job that never
reaches a boundary is stopped at gmuxd's deadline), and reports them "fenced". Suspended, not killed: when the
scheduler answers again it either resumes them at once (it was only away: restarted, or its own loop held) or,
having counted the machine lost and started them elsewhere, has this copy killed. Nothing trains twice, and a
scheduler's restart costs its jobs a pause, not their work since the last checkpoint.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from gmux import protocol

log = logging.getLogger("gmux.cluster_link")


class Fence:
    def __init__(self, now: float):
        self.lease_s: Optional[float] = None   # from the scheduler's latest answer; None: never answered
        self.heard_at = now
        self.fenced: set[str] = set()          # cjobs suspended by this fence, until the scheduler acts on them
        self._fencing: set[str] = set()        # cjobs whose suspend is under way
        self._cut_since: Optional[float] = None

    def heard(self, data: Any, now: float) -> None:
        """The scheduler answered a report; `data`: its answer's data (one without a valid lease vouches for
        nothing)."""
        lease = protocol.report_lease(data)
        if lease is None:
            return
        self.lease_s, self.heard_at = lease, now
        if self._cut_since is not None:
            log.warning("the scheduler answers again after %.1f s: it resumes the jobs suspended meanwhile (%s), or "
                        "has them killed here if it started them elsewhere", now - self._cut_since,
                        ", ".join(sorted(self.fenced)) or "none")
            self._cut_since = None

    def cut_off(self, now: float) -> bool:
        """Unanswered for the lease: the scheduler counts this machine lost, or soon will."""
        if self.lease_s is None or now - self.heard_at <= self.lease_s:
            return False
        if self._cut_since is None:
            self._cut_since = self.heard_at
        return True

    def due(self, now: float, jobs: dict) -> list:
        """Cut off: the cjobs of `jobs` (cjob -> the link's record) to suspend now; done(cjob, ok) once tried.
        Those that train or that gmuxd's slicer may resume: neither ended nor held (a resume that was on its way
        when the link was cut off is undone at the next look), nor leaving in a move (it is the move's: if the
        move fails, the job runs on here and is suspended at the next look)."""
        if not self.cut_off(now):
            return []
        cjobs = [cjob for cjob, rec in jobs.items()
                 if rec["state"] not in protocol.FINAL_STATES and rec["state"] != "migrating" and not rec.get("held")
                 and cjob not in self._fencing]
        if cjobs:
            log.warning("no answer from the scheduler for %.1f s (the lease of this machine's jobs): suspending %s, "
                        "which it will start elsewhere once it counts this machine lost", now - self.heard_at,
                        ", ".join(cjobs))
        self._fencing.update(cjobs)
        return cjobs

    def done(self, cjob: str, ok: bool) -> None:
        """Its suspend succeeded (it is reported fenced), or failed (tried again at the next look)."""
        self._fencing.discard(cjob)
        if ok:
            self.fenced.add(cjob)

    def acted_on(self, cjob: str) -> None:
        """The scheduler sent an action for the job: what happens to it is the scheduler's again."""
        self.fenced.discard(cjob)
