"""What a machine did not hear is said again.

The scheduler sends a suspend, resume or kill to a machine's link once and sets the job's state as if it had
been heard. A message to a link that is reconnecting, or away, is dropped by the ROUTER socket: before this, the
job then ran on while the scheduler counted it suspended (its GPU given to another), or stayed held for good. A
machine's report is the truth of what it did. When it still shows running a job that the scheduler suspended,
held one that it resumed, or alive one whose owner killed it, the action is sent again, once the grace that an
action on its way needs has passed (at once after a send that failed).
"""
from __future__ import annotations

from typing import Callable, Optional

from gmux import protocol

GRACE_S = 10.0          # a suspend waits for its job's next boundary; a kill for the process to end
RESENT = ("suspend", "resume", "kill")


class Unheard:
    def __init__(self, send: Callable[..., bool]):
        """send(machine, action, cjob, **args) -> delivered: the scheduler's, which reports back to sent()."""
        self._send = send
        self._sent: dict[str, float] = {}     # cjob -> when its last suspend/resume/kill was sent
        self._failed: set = set()             # cjobs whose last one could not be sent (the link was away)
        self._seen: dict[str, tuple] = {}     # cjob -> (the action its machine's reports lack, since when)

    def sent(self, cjob: str, ok: bool, now: float) -> None:
        self._sent[cjob] = now
        (self._failed.discard if ok else self._failed.add)(cjob)

    def forget(self, cjob: str) -> None:
        self._sent.pop(cjob, None)
        self._seen.pop(cjob, None)
        self._failed.discard(cjob)

    def check(self, job, report: dict, now: float) -> Optional[str]:
        """Sends again what `report` (the job's record from its machine) shows it did not hear: at once if the
        last send failed, else once the reports have lacked it for GRACE_S (a local hold or an action on its
        way is not a loss) and nothing was sent for as long. Returns the action sent, or None."""
        lacking = None if job.final or report["state"] in protocol.FINAL_STATES else _lacking(job, report)
        if lacking is None:
            self._seen.pop(job.cjob, None)
            return None
        if self._seen.get(job.cjob, (None,))[0] != lacking:
            self._seen[job.cjob] = (lacking, now)
        lasting = now - self._seen[job.cjob][1] >= GRACE_S and now - self._sent.get(job.cjob, 0.0) >= GRACE_S
        if job.cjob not in self._failed and not lasting:
            return None
        self._seen[job.cjob] = (lacking, now)
        self._send(job.machine, lacking, job.cjob, **({"gpu": job.gpu} if lacking == "resume" else {}))
        return lacking


def _lacking(job, report: dict) -> Optional[str]:
    held = bool(report.get("held"))
    if job.kill_requested:
        return "kill"
    if job.state == "suspended" and not held:
        return "suspend"
    if job.state == "running" and held:
        return "resume"
    return None
