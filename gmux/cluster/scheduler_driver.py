"""Feeding a policy (gmux.cluster.policies, the same objects gmux-sim runs) the cluster as the daemons report it,
and turning its actions into what gmux-scheduler asks of the daemons.

The snapshot is rebuilt from the scheduler's tables at every decision: machines that are up, numbered 0..n-1 in
the order they joined, with global GPU ids; each live job as a JobView with its measured rate (now/solo from
its gmuxd), attained GPU-seconds (on machines it left plus on its current one) and peak memory. Rebuilding costs
O(jobs + GPUs), well under a millisecond for a few hundred jobs, and keeps one source of truth: what the
scheduler did is in its tables, not in a snapshot that could drift from them.

Actions map onto daemons like this:
  Place / Pack          start the job on the GPU (a Pack's GPU is its partner's: that gmuxd's packer then
                        measures the pair and keeps or undoes the pack by its own introspection)
  Suspend               hold the job at its next boundary (state stays in that machine's host RAM)
  Resume                let it run again; on another machine: migrate it there
  Migrate               another GPU of the same machine: gmuxd's own migration; another machine: cross-machine
  Unpack                left to the daemon's packer (it measures the pair; the cluster does not)
  Grow / Shrink         refused: gmuxd runs single-GPU jobs (said in the decision log)
  SetTimer              kept by the scheduler and fired as a TIMER event
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from gmux.cluster.policies import (Event, Grow, JobState, JobView, MachineView, Migrate, Pack, Place, Resume,
                                   SetTimer, Shrink, Snapshot, Suspend, Unpack)
from gmux.cluster.scheduler_state import CJob, Machine

_POLICY_STATE = {"pending": JobState.PENDING, "starting": JobState.RUNNING, "running": JobState.RUNNING,
                 "migrating": JobState.RUNNING, "suspended": JobState.SUSPENDED}


@dataclass
class Intent:
    """One thing to ask of the daemons: `what` in start/suspend/resume/move/migrate/none."""
    what: str
    cjob: str
    machine: Optional[str] = None     # where it goes (start, resume, move, migrate)
    gpu: Optional[int] = None         # local GPU index there
    why: str = ""


def job_type(job: CJob) -> str:
    """The key the policies use for pair measurements: the script and its arguments' shape (not values)."""
    script = next((a for a in job.argv if a.endswith(".py")), job.argv[0])
    return job.name or script.rsplit("/", 1)[-1]


class Driver:
    def __init__(self, policy):
        self.policy = policy
        self.gpu_of: dict[int, tuple[str, int]] = {}      # global GPU id -> (machine, local index)

    def snapshot(self, jobs: dict[str, CJob], machines: dict[str, Machine], now: float) -> Snapshot:
        up = sorted((m for m in machines.values() if m.state == "up"), key=lambda m: (m.joined, m.name))
        views, self.gpu_of, global_of = [], {}, {}
        g = 0
        for i, m in enumerate(up):
            ids = []
            for rec in sorted(m.gpus, key=lambda r: r["index"]):
                self.gpu_of[g] = (m.name, rec["index"])
                global_of[(m.name, rec["index"])] = g
                ids.append(g)
                g += 1
            mem = min((r["mem_total"] for r in m.gpus), default=0) / (1 << 30)
            views.append(MachineView(i, tuple(ids), gpu_mem_gib=mem))
        snap = Snapshot(views, now=now)
        for job in jobs.values():
            if job.final or job.state not in _POLICY_STATE:
                continue
            state = _POLICY_STATE[job.state]
            where = global_of.get((job.machine, job.gpu))
            if state is JobState.RUNNING and where is None:
                continue     # on a machine that is not up: the service turns it pending first
            rate = (job.rate_now / job.rate_solo) if job.rate_now and job.rate_solo else (1.0 if state is JobState.RUNNING else 0.0)
            v = JobView(job.cjob, job.gpus, job_type(job), job.submitted, state=JobState.PENDING,
                        rate=min(rate, 2.0), attained=job.attained + job.gpu_seconds,
                        service_rate=float(job.gpus) if state is JobState.RUNNING else 0.0, updated_at=now,
                        first_run=job.first_run, last_start=job.since if state is JobState.RUNNING else None,
                        mem_gib=(job.mem_peak or job.mem or 0) / (1 << 30) or None)
            snap.add_job(v)
            if state is not JobState.PENDING:
                snap.set_state(v, state)
            if state is JobState.RUNNING:
                snap.attach(v, (where,))
        return snap

    def decide(self, jobs: dict[str, CJob], machines: dict[str, Machine], event: Event,
               now: Optional[float] = None) -> tuple[list[Intent], list]:
        """(intents for the daemons, timers [(at, key)]) for one event."""
        now = time.time() if now is None else now
        snap = self.snapshot(jobs, machines, now)
        actions = self.policy.decide(snap, event)
        intents, timers = [], []
        for a in actions:
            if isinstance(a, SetTimer):
                timers.append((a.at, a.key))
                continue
            job = jobs.get(a.job_id)
            if job is None or job.final:
                continue
            if isinstance(a, (Place, Resume, Migrate, Pack)):
                if isinstance(a, Pack):
                    partner = jobs.get(a.partner)
                    if partner is None or partner.machine is None:
                        continue
                    machine, gpu = partner.machine, partner.gpu
                else:
                    if len(a.gpus) != 1:
                        intents.append(Intent("none", job.cjob, why=f"{type(a).__name__} on {len(a.gpus)} GPUs: "
                                                                      f"multi-GPU placement is not supported yet"))
                        continue
                    machine, gpu = self.gpu_of[a.gpus[0]]
                if isinstance(a, (Place, Pack)) and job.state == "pending":
                    intents.append(Intent("start", job.cjob, machine, gpu, f"policy {type(a).__name__}"))
                elif job.machine == machine:
                    kind = "resume" if job.state == "suspended" else ("move" if gpu != job.gpu else "none")
                    intents.append(Intent(kind, job.cjob, machine, gpu, f"policy {type(a).__name__}"))
                else:
                    intents.append(Intent("migrate", job.cjob, machine, gpu, f"policy {type(a).__name__}"))
            elif isinstance(a, Suspend):
                intents.append(Intent("suspend", job.cjob, job.machine, job.gpu, "policy Suspend"))
            elif isinstance(a, Unpack):
                intents.append(Intent("none", job.cjob, why="Unpack: left to the daemon's packer"))
            elif isinstance(a, (Grow, Shrink)):
                intents.append(Intent("none", job.cjob, why=f"{type(a).__name__}: elastic jobs not supported"))
        return intents, timers
