"""Commands in flight to jobs, and the requests whose replies wait for them.

gmuxd tells a job what to do with a command (suspend, resume, checkpoint, migrate, spill); the job carries it
out at its next mini-batch boundary and answers with a `result`. Until then the command is in flight here,
under an id unique across daemon restarts, so a late answer to the previous daemon's command finds nothing and
is ignored. A request that waits for jobs to act (a gang's suspend waits for every rank) is a Waiter: answered
once every job has acknowledged, at once with an error when one fails or ends, and with an error when they
have not acknowledged within WAIT_S. A suspend is settled earlier, at the job's deadline (gmux.node.pacing),
when gmuxd stops the job instead or says why it cannot.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Optional, Union

from gmux import protocol
from gmux.node.jobs import Job
from gmux.wire.server import DEFERRED, Request, Server

WAIT_S = 120.0    # a request waiting this long for acknowledgements gets an error (a job stuck in a mini-batch)


@dataclass
class Waiter:
    """A request whose reply waits for jobs to acknowledge `kind`."""
    identity: bytes
    msg_id: int
    kind: str
    t0: float
    job: str                  # the job the request named
    jobs: tuple               # every job acknowledging
    left: set = field(default_factory=set)
    done: bool = False
    data: dict = field(default_factory=dict)   # what the reply says besides the latencies (e.g. a move's path)
    steps: dict = field(default_factory=dict)   # the step each job reported with its acknowledgement
    warnings: dict = field(default_factory=dict)   # what a job said its move will change


class Commands:
    def __init__(self, server: Server):
        self.server = server
        # Unique across restarts: milliseconds since the epoch, times 1000 commands of headroom per millisecond.
        self._ids = itertools.count(int(time.time() * 1000) % (1 << 40) * 1000)
        self.inflight: dict[int, tuple[str, str, float]] = {}   # cmd -> (job, kind, sent at)
        self.waiters: dict[str, list[Waiter]] = {}              # job -> requests waiting on its acknowledgement

    # --- commands ---
    def send(self, job: Job, kind: str, args: dict) -> int:
        cmd = next(self._ids)
        self.inflight[cmd] = (job.id, kind, time.monotonic())
        frame = protocol.encode("command", 0, cmd=cmd, kind=kind, args=args)
        if job.identity is None or not self.server.send(job.identity, frame):
            job.outbox.append(frame)   # sent when the job's agent is next heard from (e.g. after a restart)
        return cmd

    def heard_from(self, job: Job, identity: bytes) -> None:
        """The job's agent speaks from `identity` (a new connection, or the first): what waited for it goes now."""
        if job.identity != identity:
            job.identity = identity
            for frame in job.outbox:
                self.server.send(identity, frame)
            job.outbox.clear()

    def answered(self, cmd: int, job_id: str) -> Optional[tuple[str, float]]:
        """The job answered command `cmd`: (kind, sent at), or None when nothing of it is in flight (an answer
        to a previous daemon's command, a repeat, or another job's command)."""
        entry = self.inflight.pop(cmd, None)
        if entry is None or entry[0] != job_id:
            return None
        return entry[1], entry[2]

    def forget(self, job_id: str) -> list[str]:
        """Drops the job's commands in flight (its process is gone or replaced); returns their kinds."""
        mine = [c for c, e in self.inflight.items() if e[0] == job_id]
        return [self.inflight.pop(c)[1] for c in mine]

    # --- requests waiting for acknowledgements ---
    def defer(self, jobs: Union[str, tuple, list], kind: str, req: Request, named: Optional[str] = None,
              data: Optional[dict] = None):
        """The reply to `req` is sent once every job in `jobs` (one id, or a gang's) has acknowledged `kind`;
        `data` goes into it."""
        jobs = (jobs,) if isinstance(jobs, str) else tuple(jobs)
        w = Waiter(req.identity, req.msg.id, kind, req.received_at, named or jobs[0], jobs, set(jobs),
                   data=dict(data or {}))
        for j in jobs:
            self.waiters.setdefault(j, []).append(w)
        return DEFERRED

    def wake(self, job_id: str, kind: str, ok: bool, latency: float, error=None,
             boundary_wait: Optional[float] = None, step: Optional[int] = None,
             warning: Optional[str] = None, first_boundary: bool = False) -> None:
        """The job acknowledged `kind` (or failed it): the requests waiting for it hear, once all theirs have.
        `first_boundary`: it was taken at the job's first boundary (the wait was its start, not a mini-batch)."""
        waiting = self.waiters.get(job_id, [])
        for w in [w for w in waiting if w.kind == kind]:
            waiting.remove(w)
            if w.done:
                continue
            if not ok:
                w.done = True
                self.server.refuse(w.identity, w.msg_id, f"{kind} of {job_id} failed: {error}")
                continue
            w.left.discard(job_id)
            if step is not None:
                w.steps[job_id] = step
            if warning:
                w.warnings[job_id] = warning
            if not w.left:
                w.done = True
                data = {**w.data, "job": w.job, "kind": kind, "latency_s": time.monotonic() - w.t0,
                        "job_latency_s": latency}
                if boundary_wait is not None:   # of job_latency_s, the wait for the job's next boundary
                    data["boundary_wait_s"] = boundary_wait
                    if first_boundary:
                        data["first_boundary"] = True
                if len(w.steps) == len(w.jobs):   # (a checkpoint's: the step it holds)
                    data["step"] = min(w.steps.values())
                if len(w.jobs) > 1:
                    data["jobs"] = list(w.jobs)
                if w.warnings:
                    data["warnings"] = w.warnings
                self.server.reply(w.identity, w.msg_id, data)

    def settle(self, job_id: str, kind: str, stopped: bool, text: str, numbers: dict) -> None:
        """The job missed the deadline of `kind`: the requests waiting for it (a suspend's) hear now what gmuxd
        did, stopped (the job computes no more) or not (kind "late": it computes on). Either way the hold stays
        and the suspend is carried out at the job's next boundary, so neither is a refusal (which would say
        nothing was done); a client that needs it done treats "late" as not yet (daemon_client.Client.call)."""
        for w in self.waiters.pop(job_id, []):
            if w.done:
                continue
            if w.kind != kind:
                self.waiters.setdefault(job_id, []).append(w)
                continue
            w.done = True
            # (a gang's ranks are held together: the reply names them all, as the one for a suspend taken does;
            # it named the rank that missed the deadline alone, and `gmux suspend GANG` spoke of one rank)
            jobs = {"jobs": list(w.jobs)} if len(w.jobs) > 1 else {}
            if stopped:
                self.server.reply(w.identity, w.msg_id, {"job": w.job, "kind": "stop", "state": "stopped",
                                                         "detail": text, "latency_s": time.monotonic() - w.t0,
                                                         **jobs, **numbers})
            else:
                self.server.reply(w.identity, w.msg_id, {"job": w.job, "kind": "late", "detail": text,
                                                         "latency_s": time.monotonic() - w.t0, **jobs, **numbers})

    def ended(self, job: Job, why: str) -> None:
        """The job has ended: nothing more goes to it, and every request waiting on it hears why."""
        job.outbox.clear()
        self.forget(job.id)
        for w in self.waiters.pop(job.id, []):
            if not w.done:
                w.done = True
                self.server.refuse(w.identity, w.msg_id, f"{w.kind}: job {job.id} ended ({why})")

    def expire(self, now: float) -> None:
        for job_id, waiting in self.waiters.items():
            for w in [w for w in waiting if now - w.t0 > WAIT_S]:
                waiting.remove(w)
                if not w.done:
                    w.done = True
                    self.server.refuse(w.identity, w.msg_id, f"{w.kind} of {job_id}: no acknowledgement in "
                                                             f"{WAIT_S:.0f} s (is the job stuck inside a mini-batch?)")
