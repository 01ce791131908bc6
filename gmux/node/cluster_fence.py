"""A machine cut off from its scheduler stops training its cluster jobs before the scheduler starts them elsewhere.

The scheduler counts a machine lost once it has heard nothing from it for --lost-after, and starts its jobs on
other machines from their last checkpoints. When the machine itself lives on (a network partition, a switch that
drops one rack), its jobs would train on: two copies of one job, both writing the same files. The job's own
lease (gmux.job.launch) only covers a gmuxd that stopped answering its jobs; here gmuxd answers them, and only
the link's way to the scheduler is gone.

So the scheduler answers every report with the machine's fence time (0.6 of --lost-after), and a link that has
had no answer for that long suspends every cluster job it runs, through gmuxd like any suspend (a job that does
not reach a boundary by gmuxd's deadline, a second or three of its steps, is stopped there), reports them
"fenced", and carries out no action that would set one training (start, resume, move, migrate_out: one sent
before the cut and delivered after it is stale; the scheduler sends again what it still wants). Suspended, not
killed: when the scheduler answers again it either resumes them at once (it was only away: restarted, or its
own loop held) or, having counted the machine lost and started them elsewhere, has this copy killed. Nothing
trains twice, and a scheduler's restart costs its jobs a pause, not their work since the last checkpoint.

The fence time is kept in the runtime directory: a gmuxd restarted while cut off fences the jobs it finds.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any, Optional

from gmux import protocol

log = logging.getLogger("gmux.cluster_link")
STARTING = ("start", "resume", "move", "migrate_out")    # actions that would set a job training
# Of the fence time: a fenced job not suspended by then is stopped (SIGSTOP), however long its mini-batches (its
# own deadline, three of them, let a job of 8-s steps train on beside its copy elsewhere). With the fence at 0.6 of
# --lost-after that is 0.2: half of what is left before the scheduler counts the machine lost.
STOP_SHARE = 1 / 3
RELEASING = ("start", "resume", "kill", "release")       # after these the job is the scheduler's again


class Fence:
    def __init__(self, now: float, path: Optional[str] = None):
        """path: where the fence time is kept across restarts (None: not kept)."""
        self.path = path
        self.fence_s: Optional[float] = _read(path)   # the scheduler's; None: never answered (nothing to vouch for)
        self.heard_at = now
        self.fenced: set[str] = set()          # cjobs suspended by this fence, until the scheduler acts on them
        self._fencing: set[str] = set()        # cjobs whose suspend is under way
        self._refused: set[str] = set()        # cjobs whose suspend gmuxd refused (said once)
        self._cut_since: Optional[float] = None
        self._lock = threading.Lock()          # (the loop and the suspending threads share the sets)

    def heard(self, data: Any, now: float) -> None:
        """The scheduler answered a report; `data`: its answer's data (one without a valid fence time vouches
        for nothing)."""
        fence_s = protocol.report_fence(data)
        if fence_s is None:
            return
        if fence_s != self.fence_s:
            _write(self.path, fence_s)
        self.fence_s, self.heard_at = fence_s, now
        if self._cut_since is not None:
            log.warning("the scheduler answers again after %.1f s: it resumes the jobs suspended meanwhile (%s), or "
                        "has them killed here if it started them elsewhere", now - self._cut_since,
                        ", ".join(sorted(self.fenced)) or "none")
            self._cut_since = None

    def cut_off(self, now: float) -> bool:
        """Unanswered for the fence time: the scheduler counts this machine lost, or soon will."""
        if self.fence_s is None or now - self.heard_at <= self.fence_s:
            return False
        if self._cut_since is None:
            self._cut_since = self.heard_at
        return True

    def stop_within(self) -> dict:
        """What a fence's suspend says of its deadline (gmuxd's suspend deadline_s)."""
        return {"deadline_s": self.fence_s * STOP_SHARE} if self.fence_s else {}

    def refuses(self, action: str, now: float) -> bool:
        """Whether an action that arrives now must not be carried out: cut off, it would set a copy training."""
        return action in STARTING and self.cut_off(now)

    def due(self, now: float, jobs: dict) -> list:
        """Cut off: the cjobs of `jobs` (cjob -> the link's record) to suspend now; done(cjob, ok) once tried.
        Those that train or that gmuxd's slicer may resume: neither ended nor held (a resume that was on its way
        when the link was cut off is undone at the next look), nor leaving in a move (it is the move's: if the
        move fails, the job runs on here and is suspended at the next look)."""
        if not self.cut_off(now):
            return []
        with self._lock:
            cjobs = [cjob for cjob, rec in jobs.items()
                     if rec["state"] not in protocol.FINAL_STATES and rec["state"] != "migrating"
                     and not rec.get("held") and cjob not in self._fencing]
            self._fencing.update(cjobs)
        if cjobs:
            log.warning("no answer from the scheduler for %.1f s: suspending %s, which it will start elsewhere once "
                        "it counts this machine lost", now - self.heard_at, ", ".join(cjobs))
        return cjobs

    def done(self, cjob: str, error: Optional[Exception]) -> None:
        """Its suspend succeeded (it is reported fenced), or gmuxd refused it (tried again at the next look)."""
        with self._lock:
            if cjob not in self._fencing:
                return              # the scheduler acted on it meanwhile
            self._fencing.discard(cjob)
            if error is None:
                self.fenced.add(cjob)
                self._refused.discard(cjob)
                return
            said = cjob in self._refused
            self._refused.add(cjob)
        if not said:
            log.warning("could not suspend %s while cut off from the scheduler (tried again every half second): %s",
                        cjob, error)

    def acted_on(self, cjob: str, action: str) -> None:
        """The scheduler sent an action for the job: after a resume, kill, release or start it is the scheduler's
        again (a move or a suspend leaves it fenced: the resume it waits for is still the scheduler's to send)."""
        if action in RELEASING:
            self.forget(cjob)

    def forget(self, cjob: str) -> None:
        """The job ended here, or is the scheduler's again."""
        with self._lock:
            self.fenced.discard(cjob)
            self._fencing.discard(cjob)
            self._refused.discard(cjob)


def _read(path: Optional[str]) -> Optional[float]:
    try:
        with open(path) as f:          # type: ignore[arg-type]
            return protocol.report_fence({"fence_s": float(f.read(64))})
    except (TypeError, OSError, ValueError):
        return None


def _write(path: Optional[str], fence_s: float) -> None:
    if path is None:
        return
    with contextlib.suppress(OSError):         # (not kept: a restart while cut off fences nothing until heard)
        with open(path + ".tmp", "w") as f:
            f.write(repr(fence_s))
        os.replace(path + ".tmp", path)
