"""Feeding a policy (gmux.cluster.policies, the same objects gmux-sim runs) the cluster as the daemons report it,
and turning its actions into what gmux-scheduler asks of the daemons.

The snapshot is rebuilt from the scheduler's tables at every decision: machines that are up, numbered 0..n-1 in
the order they joined, with global GPU ids; each live job as a JobView with its measured rate (now/solo from
its gmuxd), attained GPU-seconds (on machines it left plus on its current one) and peak memory. Rebuilding costs
O(jobs + GPUs), well under a millisecond for a few hundred jobs, and keeps one source of truth: what the
scheduler did is in its tables, not in a snapshot that could drift from them.

Actions map onto daemons like this:
  Place / Pack          start the job on the GPU (a Pack's GPU is its partner's: that gmuxd's packer then
                        measures the pair and keeps or undoes the pack by its own introspection); a gang (a job
                        of n ranks) on n GPUs of one machine, one rank per GPU
  Suspend               hold the job at its next boundary (state stays in that machine's host RAM)
  Resume                let it run again; on another machine: migrate it there
  Migrate               another GPU of the same machine: gmuxd's own migration; another machine: cross-machine
  Unpack                left to the daemon's packer (it measures the pair; the cluster does not)
  Grow / Shrink         refused: a gang's size is fixed at submission (said in the decision log)

Gangs get their GPUs to themselves: gmuxd time-slices and packs each GPU on its own, so a rank sharing a GPU
would be suspended alone and its peers would wait for it in their next collective. Until gmuxd slices a
gang's GPUs together, an action that would put a gang beside another job (or a job beside a gang) is not
carried out, nor one that spreads a gang over machines (its ranks meet on loopback) or moves it between GPUs
of its machine (a gang moves only as a whole, by checkpoint and new processes: cross-machine migration).
A suspended gang gives its GPUs back (gmuxd parks it): others may start there, and the gang resumes on them
once they are free again. A suspended single-GPU job in the way of a gang going to its GPU gives it to the gang
too (gmuxd parks it, as its process waits there, pinned). A parked job (its machine's reports say so) holds no
GPU: it resumes on its own GPUs once they are free, or on another machine by migration, never on another GPU of
its machine (its process waits on its own).
  SetTimer              kept by the scheduler and fired as a TIMER event
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from gmux.cluster.policies import (Event, Grow, JobState, JobView, MachineView, Migrate, Pack, Place, Resume,
                                   SetTimer, Shrink, Snapshot, Suspend, Unpack)
from gmux.cluster.scheduler.state import CJob, Machine

_POLICY_STATE = {"pending": JobState.PENDING, "starting": JobState.RUNNING, "running": JobState.RUNNING,
                 "migrating": JobState.RUNNING, "suspended": JobState.SUSPENDED}


@dataclass
class Intent:
    """One thing to ask of the daemons: `what` in start/suspend/resume/move/migrate/none."""
    what: str
    cjob: str
    machine: Optional[str] = None     # where it goes (start, resume, move, migrate)
    gpu: Optional[int] = None         # local GPU index there (rank 0's, for a gang)
    why: str = ""
    gpus: tuple = ()                  # every rank's local GPU index there


def job_type(job: CJob) -> str:
    """The key the policies use for pair measurements: the script and its arguments' shape (not values)."""
    script = next((a for a in job.argv if a.endswith(".py")), job.argv[0])
    return job.name or script.rsplit("/", 1)[-1]


class Driver:
    def __init__(self, policy):
        if getattr(policy, "uses_oracle", False):
            # sjf, srtf and gmux-law read every job's duration, which a real cluster does not know: each arrival
            # would fail and nothing would ever be placed.
            raise ValueError(f"policy {policy.name!r} needs every job's duration in advance: it is a yardstick for "
                             f"gmux-sim, not a scheduler for a real cluster")
        self.policy = policy
        self.gpu_of: dict[int, tuple[str, int]] = {}      # global GPU id -> (machine, local index)

    def snapshot(self, jobs: dict[str, CJob], machines: dict[str, Machine], now: float) -> Snapshot:
        up = sorted((m for m in machines.values() if m.state == "up"), key=lambda m: (m.joined, m.name))
        views, self.gpu_of, global_of = [], {}, {}
        reserved = _held_gpus(jobs)
        g = 0
        for i, m in enumerate(up):
            ids = []
            for rec in sorted(m.gpus, key=lambda r: r["index"]):
                self.gpu_of[g] = (m.name, rec["index"])
                global_of[(m.name, rec["index"])] = g
                if (m.name, rec["index"]) not in reserved:
                    ids.append(g)
                g += 1
            mem = min((r["mem_total"] for r in m.gpus), default=0) / (1 << 30)
            views.append(MachineView(i, tuple(ids), gpu_mem_gib=mem))
        snap = Snapshot(views, now=now)
        for job in jobs.values():
            if job.final or job.state not in _POLICY_STATE:
                continue
            state = _POLICY_STATE[job.state]
            where = tuple(global_of.get((job.machine, g)) for g in (job.rank_gpus or [job.gpu]))
            if state is JobState.RUNNING and None in where:
                continue     # on a machine that is not up: the service turns it pending first
            rate = ((job.rate_now / job.rate_solo) if job.rate_now and job.rate_solo
                    else (1.0 if state is JobState.RUNNING else 0.0))
            v = JobView(job.cjob, job.gpus, job_type(job), job.submitted, state=JobState.PENDING,
                        rate=min(rate, 2.0), attained=job.attained + job.gpu_seconds,
                        service_rate=float(job.gpus) if state is JobState.RUNNING else 0.0, updated_at=now,
                        first_run=job.first_run, last_start=job.since if state is JobState.RUNNING else None,
                        last_stop=job.since if state is JobState.SUSPENDED else None,
                        mem_gib=(job.mem_peak or job.mem or 0) / (1 << 30) or None, owner=job.owner)
            snap.add_job(v)
            if state is not JobState.PENDING:
                snap.set_state(v, state)
            if state is JobState.RUNNING:
                snap.attach(v, where)
        return snap

    def decide(self, jobs: dict[str, CJob], machines: dict[str, Machine], event: Event,
               now: Optional[float] = None) -> tuple[list[Intent], list]:
        """(intents for the daemons, timers [(at, key)]) for one event."""
        now = time.time() if now is None else now
        snap = self.snapshot(jobs, machines, now)
        actions = self.policy.decide(snap, event)
        intents, timers, acted = [], [], set()      # acted: jobs this decision starts, resumes or moves
        occupants = occupants_of(jobs)
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
                    machine, gpus = partner.machine, tuple(partner.rank_gpus or [partner.gpu])
                else:
                    where = [self.gpu_of[g] for g in a.gpus]
                    machine, gpus = where[0][0], tuple(g for _, g in where)
                    if len({m for m, _ in where}) != 1:
                        intents.append(Intent("none", job.cjob, why=f"{type(a).__name__} of a {len(a.gpus)}-rank "
                                                                      f"gang across machines: its ranks share one"))
                        continue
                why = f"policy {type(a).__name__}"
                problem = (f"on {len(gpus)} GPUs, but {job.cjob} has {job.gpus} rank(s), one per GPU"
                           if len(gpus) != job.gpus else _gang_problem(job, machine, gpus, occupants, acted))
                own = tuple(job.rank_gpus or [job.gpu])
                if problem is None and job.parked and job.machine == machine and gpus != own:
                    # Its process waits on its own GPU: there it resumes (the next snapshot shows it there), else
                    # it waits for that GPU or goes to another machine.
                    problem = _gang_problem(job, machine, own, occupants, acted) and (
                        f"{job.cjob} gave GPU {job.gpu} of {machine} to another job while suspended: it resumes "
                        f"there once it is free, or on another machine")
                    gpus, why = own, why + f" (on GPU {job.gpu}, which it gave back while suspended)"
                if problem:
                    intents.append(Intent("none", job.cjob, why=f"{type(a).__name__}: {problem}"))
                elif isinstance(a, (Place, Pack)) and job.state == "pending":
                    intents.append(Intent("start", job.cjob, machine, gpus[0], why, gpus))
                elif job.machine == machine:
                    moved = gpus != tuple(job.rank_gpus or [job.gpu])
                    kind = "resume" if job.state == "suspended" else ("move" if moved else "none")
                    if moved and job.gpus > 1:
                        intents.append(Intent("none", job.cjob, why=f"{type(a).__name__}: a gang moves between "
                                                                      f"machines only"))
                        continue
                    intents.append(Intent(kind, job.cjob, machine, gpus[0], why, gpus))
                else:
                    intents.append(Intent("migrate", job.cjob, machine, gpus[0], why, gpus))
                if intents[-1].what != "none":       # what else this decision puts there sees it
                    acted.add(job.cjob)
                    for g in gpus:
                        if job not in occupants.setdefault((machine, g), []):
                            occupants[(machine, g)].append(job)
            elif isinstance(a, Suspend):
                intents.append(Intent("suspend", job.cjob, job.machine, job.gpu, "policy Suspend"))
            elif isinstance(a, Unpack):
                intents.append(Intent("none", job.cjob, why="Unpack: left to the daemon's packer"))
            elif isinstance(a, (Grow, Shrink)):
                intents.append(Intent("none", job.cjob, why=f"{type(a).__name__}: elastic jobs not supported"))
        return intents, timers


def _held_gpus(jobs: dict[str, CJob]) -> set:
    """(machine, GPU) pairs kept for jobs their users hold: the policy is not shown them, so it places nothing
    there until the hold ends (as a suspended job keeps its nodes in Slurm). A GPU where another job is stays
    shown: a pack's partner, or a job started there while the held job was parked (suspended by the policy
    before its user held it), or parked there itself, which must be able to resume there."""
    held = {(j.machine, g) for j in jobs.values() if j.state == "held" and j.machine is not None
            for g in j.rank_gpus or [j.gpu]}
    if not held:
        return held          # (every decision builds a snapshot: no second walk over the jobs without a hold)
    busy = {(j.machine, g) for j in jobs.values() if j.state in ("starting", "running", "migrating", "suspended")
            for g in j.rank_gpus or [j.gpu]}
    return held - busy


def occupants_of(jobs: dict[str, CJob]) -> dict[tuple, list]:
    """(machine, gpu) -> the jobs there, save those parked or parking."""
    occupants: dict[tuple, list] = {}
    for j in jobs.values():
        if not j.final and j.machine is not None and not _off_its_gpus(j):
            for g in j.rank_gpus or [j.gpu]:
                occupants.setdefault((j.machine, g), []).append(j)
    return occupants


def gang_problem(job: CJob, machine: str, gpus: tuple, jobs: dict[str, CJob]) -> Optional[str]:
    """Why a move the user asked for may not put `job` on `gpus` of `machine`, as a policy's may not."""
    return _gang_problem(job, machine, gpus, occupants_of(jobs), set())


def _gang_problem(job: CJob, machine: str, gpus: tuple, occupants: dict, acted: set) -> Optional[str]:
    """Why `job` may not go on `gpus` of `machine` beside what runs there (see the module's note on gangs).
    A suspended single-GPU job in a gang's way is not a problem: gmuxd parks it."""
    for g in gpus:
        others = [o for o in occupants.get((machine, g), []) if o.cjob != job.cjob
                  and not (job.gpus > 1 and _waits(o, acted))]
        if others and (job.gpus > 1 or any(o.gpus > 1 for o in others)):
            return (f"GPU {g} of {machine} holds {others[0].cjob}; a gang shares no GPU (gmuxd slices each GPU "
                    f"on its own)")
    return None


def _waits(job: CJob, acted: set) -> bool:
    """A suspended single-GPU job that stays suspended through this decision and reaches boundaries (one with
    none never suspends, so gmuxd would never park it for a gang)."""
    return job.gpus == 1 and job.state == "suspended" and not job.boundless and job.cjob not in acted


def _off_its_gpus(job: CJob) -> bool:
    """Suspended and given back its GPUs, or about to be: parked (a parked job resumed holds none until gmuxd
    seats it again, but is counted where it goes: nothing else may go there meanwhile), or a suspended gang
    (gmuxd parks it once it has suspended)."""
    return job.parked and job.state in ("suspended", "held") or job.state == "suspended" and job.gpus > 1

