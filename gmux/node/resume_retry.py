"""A resume that failed is tried again, after a growing wait, a few times; only then does the job wait for
`gmux resume`.

A resume can fail for a moment (the GPU's memory taken by a program outside gmux, an interrupted read of a
spill file) or for good (a spill file damaged on disk). Asked again at every tick, a failing resume was sent
hundreds of times a second, each reading the whole spill file; held at its first failure, a job whose failure
had passed a second later waited, suspended, for someone to notice it and type `gmux resume`. So the job (with
a gang's other ranks) is held, and released again after each of RETRY_S; the next failure after them leaves it
held. A user's `gmux suspend` or `gmux resume` meanwhile takes over (the count starts again at their resume).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gmux.node.jobs import Job, unit_of

if TYPE_CHECKING:
    from gmux.node.daemon import Daemon

RETRY_S = (2.0, 10.0, 60.0)     # the waits before the second, third and fourth tries


class ResumeRetries:
    """The count of a job's failed resumes and when its hold is released are the job's (Job.resume_failures,
    Job.retry_at, in wall-clock time), saved with it: a gmuxd restarted meanwhile releases it when it was due, not
    never while its detail says it will."""

    def __init__(self, node: "Daemon"):
        self.node = node
        self._due: dict[str, float] = {}        # job -> when its hold is released for another try (monotonic)
        self._user_held: set[str] = set()       # jobs their user suspended since their last resume

    def failed(self, job: Job, error: str, now: float) -> None:
        """Holds the job's unit; says in the job's detail when it is tried again, or that it waits for `gmux
        resume`. A job its user suspended while the resume was on its way stays theirs: no try releases it."""
        n = job.resume_failures
        job.resume_failures = n + 1
        for m in unit_of(self.node.jobs, job):
            m.held = True
            if m.gpu is not None:
                self.node.slicers[m.gpu].hold(m.id)
        if n < len(RETRY_S) and job.id not in self._user_held:
            self._due[job.id] = now + RETRY_S[n]
            job.retry_at = time.time() + RETRY_S[n]
            job.detail = f"resume failed: {error}; tried again in {RETRY_S[n]:g} s (try {n + 2} of {len(RETRY_S) + 1})"
        else:
            self._due.pop(job.id, None)
            job.retry_at = None
            why = "suspended by its user" if job.id in self._user_held else "held"
            job.detail = f"resume failed: {error}" + (f" ({n + 1} tries)" if n else "") + \
                f"; {why}: gmux resume tries again"
        self.node.store.save(job)

    def succeeded(self, job: Job) -> None:
        self._due.pop(job.id, None)
        self._user_held.discard(job.id)
        job.resume_failures, job.retry_at = 0, None

    def taken_over(self, unit: list, resumed: bool) -> None:
        """A user's suspend (the unit stays held: no try of ours releases it, not even that of a resume on its way
        now) or resume (a fresh count)."""
        for m in unit:
            self._due.pop(m.id, None)
            m.retry_at = None
            if resumed:
                m.resume_failures = 0
                self._user_held.discard(m.id)
            else:
                self._user_held.add(m.id)

    def restored(self, job: Job, now: float) -> None:
        """A job a gmuxd before this one held for another try: released when that was due (at once if past)."""
        if job.held and job.retry_at is not None:
            self._due[job.id] = now + min(max(0.0, job.retry_at - time.time()), RETRY_S[-1])

    def run(self, now: float) -> None:
        """Releases the holds whose wait is over: the slicer resumes the jobs in their turn."""
        for jid in [j for j, at in self._due.items() if at <= now]:
            del self._due[jid]
            job = self.node.jobs.get(jid)
            if job is not None:
                job.retry_at = None
            if job is not None and not job.final and job.held:
                release(self.node, unit_of(self.node.jobs, job), now)
        if len(self._user_held) > len(self.node.jobs) // 2 + 64:     # (ended jobs' ids, now and then)
            self._user_held = {j for j in self._user_held if j in self.node.jobs and not self.node.jobs[j].final}


def release(node: "Daemon", unit: list, now: float) -> None:
    """Ends the hold of a job and of the rest of its unit (a gang's ranks): each runs in its turn again."""
    for m in unit:
        m.held = False
        if m.gpu is not None:
            node.slicers[m.gpu].release(m.id)
        elif m.parked_gpus:
            node.admission.unpark(m)
        elif node.admission.queued(m.id):
            m.state = "waiting"
    for gpu in {m.gpu for m in unit if m.gpu is not None}:
        node.switch(node.slicers[gpu], now)
