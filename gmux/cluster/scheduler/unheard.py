"""What a machine did not hear is said again.

The scheduler sends a suspend, resume or kill to a machine's link once and sets the job's state as if it had
been heard. A message to a link that is reconnecting, or away, is dropped by the ROUTER socket: before this, the
job then ran on while the scheduler counted it suspended (its GPU given to another), or stayed held for good. A
machine's report is the truth of what it did. When it still shows running a job that the scheduler suspended,
held one that it resumed, alive one whose owner killed it, or a single-GPU job on another of its GPUs than the
one it was moved to, the action is sent again, once the grace that an action on its way needs has passed (at
once after a send that failed). A move is sent again once at most: one the machine heard and refused (the GPU
could not take the job), or one still not made a grace after it was sent again (the machine moved the job
itself, say, to make room for a gang), is given up, the GPU the machine reports taken as the job's, and the
policy decides anew; fighting the machine would move the job back and forth. A job its machine suspended while
cut off from the scheduler (reported "fenced") is resumed at once, starting or running: it waits for nobody but
the scheduler. A copy that a machine back from being counted lost still shows, of a job that has left it, is
killed, and killed again each GRACE_S for as long as the machine's reports show it alive.
"""
from __future__ import annotations

from typing import Callable, Optional

from gmux import protocol

GRACE_S = 10.0          # a suspend waits for its job's next boundary; a kill for the process to end
FENCED_S = 2.0          # a fenced job's resume (gmux.node.cluster_fence), on its way, is not sent again sooner
RESENT = ("suspend", "resume", "kill", "move")


class Unheard:
    def __init__(self, send: Callable[..., bool]):
        """send(machine, action, cjob, **args) -> delivered: the scheduler's, which reports back to sent()."""
        self._send = send
        self._sent: dict[str, float] = {}     # cjob -> when its last suspend/resume/kill was sent
        self._failed: set = set()             # cjobs whose last one could not be sent (the link was away)
        self._seen: dict[str, tuple] = {}     # cjob -> (the action its machine's reports lack, since when)
        self._given_up: set = set()           # cjobs whose last move their machine refused, or not made again
        self._moved_again: set = set()        # cjobs whose last move was sent again
        self._stale: dict[tuple, float] = {}  # (machine, cjob) -> when a copy the job left there was last killed

    def sent(self, cjob: str, ok: bool, now: float) -> None:
        self._sent[cjob] = now
        self._given_up.discard(cjob)
        self._moved_again.discard(cjob)
        (self._failed.discard if ok else self._failed.add)(cjob)

    def refused(self, cjob: str) -> None:
        """Its machine heard its last move and could not make it."""
        self._given_up.add(cjob)

    def forget(self, cjob: str) -> None:
        self._sent.pop(cjob, None)
        self._seen.pop(cjob, None)
        self._failed.discard(cjob)
        self._given_up.discard(cjob)
        self._moved_again.discard(cjob)

    def stale(self, machine: str, cjob: str, now: float) -> bool:
        """A copy of `cjob` that `machine` still shows alive, though the job has left it (back after it was
        counted lost): whether to send its kill now. Once, then again only after GRACE_S: a machine's reports
        (some 50 a second while it starts a job) showed it until it had ended, and each had sent a kill."""
        if now - self._stale.get((machine, cjob), -GRACE_S) < GRACE_S:
            return False
        if len(self._stale) > 1024:
            self._stale = {k: t for k, t in self._stale.items() if now - t < GRACE_S}
        self._stale[(machine, cjob)] = now
        return True

    def check(self, job, report: dict, now: float) -> Optional[str]:
        """Sends again what `report` (the job's record from its machine) shows it did not hear: at once if the
        last send failed, else once the reports have lacked it for GRACE_S (a local hold or an action on its
        way is not a loss) and nothing was sent for as long. Returns the action sent, or None."""
        lacking = None if job.final or report["state"] in protocol.FINAL_STATES else _lacking(job, report)
        if lacking == "move" and job.cjob in self._given_up:
            _believe(job, report)
            lacking = None
        if lacking is None:
            self._seen.pop(job.cjob, None)
            return None
        if self._seen.get(job.cjob, (None,))[0] != lacking:
            self._seen[job.cjob] = (lacking, now)
        lasting = now - self._seen[job.cjob][1] >= GRACE_S and now - self._sent.get(job.cjob, 0.0) >= GRACE_S
        # Suspended by its link, cut off from the scheduler: no action of anyone's is on its way. Sent at the
        # second report that shows it, which the link hears after the answer to the first: until it hears one, a
        # resume may be a stale one and is not carried out (gmux.node.cluster_fence).
        fenced = (report.get("fenced") and lacking == "resume" and self._seen[job.cjob][1] < now
                  and now - self._sent.get(job.cjob, 0.0) >= FENCED_S)
        if job.cjob not in self._failed and not lasting and not fenced:
            return None
        if lacking == "move" and job.cjob in self._moved_again:
            self._given_up.add(job.cjob)
            _believe(job, report)
            self._seen.pop(job.cjob, None)
            return None
        self._seen[job.cjob] = (lacking, now)
        self._send(job.machine, lacking, job.cjob, **({"gpu": job.gpu} if lacking in ("resume", "move") else {}))
        if lacking == "move":
            self._moved_again.add(job.cjob)
        return lacking


def _believe(job, report: dict) -> None:
    """The job is where its machine says: its move is given up."""
    job.gpu, job.rank_gpus = report["gpu"], [report["gpu"]]


def _lacking(job, report: dict) -> Optional[str]:
    held = bool(report.get("held"))
    if job.kill_requested:
        return "kill"
    if held and report.get("fenced") and job.state in ("running", "starting", "migrating"):
        return "resume"         # (a start or a move's target fenced before its first step: it would never take one)
    if job.state in ("suspended", "held") and job.machine is not None and not held:
        return "suspend"
    if job.state == "running" and held:
        return "resume"
    gpu = report.get("gpu")
    if job.state == "running" and job.gpus == 1 and isinstance(gpu, int) and job.gpu is not None and gpu != job.gpu:
        return "move"
    return None
