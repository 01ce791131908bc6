"""The simulated cluster: what each job's speed is, what each action costs, and the refusal of impossible actions.

Costs come from costs.py (per job type, from gmux's measurements; the summary of every run prints them). Who pays:
- A suspend keeps the job's GPUs busy for its copy-out: a job placed on them within that time stalls until the
  copy is done (`gpu_free_at`), so the preempting job, not the victim, waits for it, as on real hardware.
- A resume, or a pack of a suspended job, stalls the job for its copy-in on its new GPUs.
- A migration stalls the job on its new GPUs (between GPUs of one machine: a suspend + a resume, and its old GPUs
  are busy for the copy-out). A move to another machine first holds its new GPUs idle for the warm-up (the
  target's new process starting) while the job computes on at its source speed (`warm_until`, `warm_rate`:
  its progress is credited, not counted as a stall), then stalls it for the stream and restore; its old GPUs
  are busy until the target has restored (the source streams from its live memory). Who else pays: a job
  placed on the old GPUs within that time waits for them, as for a copy-out.
- Time-slicing (k units on a GPU) is a fluid share: each unit progresses at 1/k of its speed, less one suspend
  and one resume of its own type per quantum, and is counted as suspended once per round of k quanta.
- `measure_s` = 120 s: how long a new pack runs before its rates are known (introspection window).
A stall is time on the GPUs with no progress: it counts as busy GPU time and as "slowed by sharing", never as
queueing. First placement has no stall: every policy pays the same process start.

Speeds. Alone on its requested GPUs a job runs at rate 1. Packed, it runs at the measured packed/solo ratio of
its pair (throughputs.Throughputs). A multi-GPU job spread over more machines than it needs runs at the measured
unconsolidated/consolidated ratio of its type. An elastic job on m != n GPUs runs at m/n below its request and
1 + (m-n)/n x `elastic_efficiency` above it. A gang job runs at the pace of its most time-sliced GPU.
"""
from __future__ import annotations

from gmux.cluster.policies.api import (Grow, JobState, JobView, Migrate, Pack, Place, PolicyError, Resume, SetTimer,
                                       Shrink, Suspend, Unpack)
from gmux.cluster.policies.snapshot import Snapshot
from gmux.cluster.sim.costs import Costs
from gmux.cluster.sim.throughputs import Throughputs

__all__ = ["Costs", "SimCluster", "SimJob"]


class SimJob:
    """The simulator's private truth about one job (the policy sees only its JobView)."""
    __slots__ = ("view", "work", "progress", "stall_until", "settled_at", "version", "held", "sliced_suspends",
                 "suspends", "migrations", "packs", "finish", "consolidated_machines", "uncons_rate", "waited",
                 "stalled", "warm_until", "warm_rate")

    def __init__(self, view: JobView, work: float, per_machine: int, uncons_rate: float):
        self.view = view
        self.work = work
        self.progress = 0.0
        self.stall_until = 0.0
        self.settled_at = view.submit_time
        self.version = 0
        self.held = 0.0               # GPU-seconds of busy GPU time attributed to this job
        self.sliced_suspends = 0.0    # fluid count of time-slice switches
        self.suspends = 0
        self.migrations = 0
        self.packs = 0
        self.finish = None
        self.consolidated_machines = -(-view.num_gpus // per_machine)
        self.uncons_rate = uncons_rate
        self.waited = 0.0             # seconds with no GPU at all (pending or suspended): queueing
        self.stalled = 0.0            # seconds on GPUs with no progress (resume, migration, waiting for a copy-out)
        self.warm_until = 0.0         # a cross-machine move's warm-up: until then it progresses at its source ...
        self.warm_rate = 0.0          # ... at this speed, while it holds its new GPUs (stall_until >= warm_until)


class SimCluster:
    def __init__(self, snap: Snapshot, tput: Throughputs, costs: Costs):
        self.snap = snap
        self.tput = tput
        self.costs = costs
        self.sim: dict = {}
        self.gpu_free_at: dict = {}    # GPU -> when the copy-out of the job suspended or moved off it ends
        self.counters = {"suspends": 0, "resumes": 0, "packs": 0, "unpacks": 0, "migrations": 0, "grows": 0,
                         "shrinks": 0, "places": 0}

    # ---- speeds ---------------------------------------------------------------------------------------------
    def settle(self, sj: SimJob, t: float) -> None:
        """Bring a job's progress and accounts up to time t at its current speed."""
        v = sj.view
        dt = t - sj.settled_at
        if dt > 0:
            warm_end = sj.settled_at
            if sj.warm_until > sj.settled_at:       # still computing at its source while its target warms up
                warm_end = min(t, sj.warm_until)
                sj.progress = min(sj.work, sj.progress + sj.warm_rate * (warm_end - sj.settled_at))
            if v.rate > 0:
                run = t - max(sj.settled_at, sj.stall_until)
                if run > 0:
                    sj.progress = min(sj.work, sj.progress + v.rate * run)
            if not v.gpus:
                sj.waited += dt
            else:
                if sj.stall_until > warm_end:
                    sj.stalled += min(t, sj.stall_until) - warm_end
                v.attained += v.service_rate * dt
                sj.held += self._held_rate(v) * dt
                depth = self.snap.units_on(v.gpus)
                if depth > 1:
                    sj.sliced_suspends += dt / (depth * self.costs.quantum_s)
        sj.settled_at = t
        v.updated_at = t
        if v.remaining_hint is not None:
            v.remaining_hint = sj.work - sj.progress

    def _held_rate(self, v: JobView) -> float:
        units = self.snap.gpu_units
        size = 2 if v.packed_with is not None else 1
        return sum(1.0 / (len(units[g]) * size) for g in v.gpus)

    def update_rate(self, sj: SimJob) -> None:
        v = sj.view
        if not v.gpus:
            v.rate = 0.0
            v.service_rate = 0.0
            return
        depth = self.snap.units_on(v.gpus)
        rate = 1.0 / depth
        if depth > 1:
            rate *= self.costs.switch_factor(v.job_type)
        if v.packed_with is not None:
            other = self.snap.jobs[v.packed_with]
            pr = self.tput.pair(v.job_type, other.job_type)
            rate *= pr.rate_a if pr is not None else 0.0
        n = len(v.gpus)
        if n > 1 and len(self.snap.machines_of(v.gpus)) > sj.consolidated_machines:
            rate *= sj.uncons_rate
        if n != v.num_gpus:
            rate *= (n / v.num_gpus if n < v.num_gpus else
                     1.0 + (n - v.num_gpus) / v.num_gpus * self.costs.elastic_efficiency)
        v.rate = rate
        v.service_rate = n / depth

    def completion_time(self, sj: SimJob, now: float) -> float | None:
        r = sj.view.rate
        left = sj.work - sj.progress
        if sj.warm_until > now:                     # a move's warm-up: the job still runs at its source
            at_source = sj.warm_rate * (sj.warm_until - now)
            if at_source >= left and sj.warm_rate > 0:
                return now + left / sj.warm_rate    # it ends before the move would stop it
            left -= at_source
        if r <= 0:
            return None
        return max(now, sj.stall_until) + left / r

    # ---- actions --------------------------------------------------------------------------------------------
    def residents(self, gpus) -> set:
        units = self.snap.gpu_units
        return {jid for g in gpus for u in units[g] for jid in u}

    def _check_gpus(self, jid, gpus, want: int | None) -> None:
        if not gpus or len(set(gpus)) != len(gpus):
            raise PolicyError(f"job {jid!r}: GPU list {gpus!r} is empty or repeats a GPU")
        for g in gpus:
            if g not in self.snap.gpu_units:
                raise PolicyError(f"job {jid!r}: no GPU {g!r} in this cluster")
            if len(self.snap.gpu_units[g]) >= self.costs.max_units_per_gpu:
                raise PolicyError(f"job {jid!r}: GPU {g} already time-slices {self.costs.max_units_per_gpu} units")
        if want is not None and len(gpus) != want:
            raise PolicyError(f"job {jid!r} needs {want} GPUs, was given {len(gpus)}")

    def _job(self, jid, *states) -> SimJob:
        sj = self.sim.get(jid)
        if sj is None or jid not in self.snap.jobs:
            raise PolicyError(f"job {jid!r} is not an active job")
        if states and sj.view.state not in states:
            raise PolicyError(f"job {jid!r} is {sj.view.state.value}, expected {' or '.join(s.value for s in states)}")
        return sj

    def touched_by(self, action) -> tuple[set, list]:
        """Jobs whose speed the action may change (to settle before and re-rate after), and GPUs it affects."""
        if isinstance(action, SetTimer):
            return set(), []
        jid = action.job_id
        sj = self.sim.get(jid)
        gpus = list(sj.view.gpus) if sj is not None else []
        if isinstance(action, (Place, Resume, Migrate, Grow, Shrink)):
            gpus += list(action.gpus)
        elif isinstance(action, Pack):
            p = self.sim.get(action.partner)
            if p is not None:
                gpus += list(p.view.gpus)
        gpus = [g for g in gpus if g in self.snap.gpu_units]
        jobs = self.residents(gpus)
        jobs.add(jid)
        return jobs, gpus

    def apply(self, action, now: float) -> None:
        """Carry out one action on the snapshot (the caller settles and re-rates the touched jobs)."""
        snap = self.snap
        c = self.counters
        if isinstance(action, Place):
            sj = self._job(action.job_id, JobState.PENDING)
            self._check_gpus(action.job_id, action.gpus, sj.view.num_gpus if not sj.view.elastic else None)
            self._check_elastic(sj.view, len(action.gpus))
            snap.attach(sj.view, action.gpus)
            snap.set_state(sj.view, JobState.RUNNING)
            sj.stall_until = self._free_at(action.gpus, now)
            sj.view.first_run = now if sj.view.first_run is None else sj.view.first_run
            sj.view.last_start = now
            c["places"] += 1
        elif isinstance(action, Resume):
            sj = self._job(action.job_id, JobState.SUSPENDED)
            self._check_gpus(action.job_id, action.gpus, sj.view.num_gpus if not sj.view.elastic else None)
            self._check_elastic(sj.view, len(action.gpus))
            snap.attach(sj.view, action.gpus)
            snap.set_state(sj.view, JobState.RUNNING)
            sj.stall_until = self._free_at(action.gpus, now) + self.costs.resume(sj.view.job_type)
            sj.view.last_start = now
            c["resumes"] += 1
        elif isinstance(action, Suspend):
            sj = self._job(action.job_id, JobState.RUNNING)
            self._copy_out(sj.view, now)
            snap.detach(sj.view)
            snap.set_state(sj.view, JobState.SUSPENDED)
            sj.view.last_stop = now
            sj.warm_until = 0.0                     # a move in its warm-up is called off
            sj.suspends += 1
            c["suspends"] += 1
        elif isinstance(action, Pack):
            sj = self._job(action.job_id, JobState.PENDING, JobState.SUSPENDED)
            p = self._job(action.partner, JobState.RUNNING)
            pv, v = p.view, sj.view
            if pv.packed_with is not None:
                raise PolicyError(f"pack {action.job_id!r} with {action.partner!r}: partner is already packed")
            if len(pv.gpus) != v.num_gpus:
                raise PolicyError(f"pack {action.job_id!r} with {action.partner!r}: GPU counts differ")
            if not self.tput.fits(v.job_type, pv.job_type):
                raise PolicyError(f"pack {action.job_id!r} with {action.partner!r}: the pair does not fit in GPU "
                                  f"memory")
            if self.tput.pair(v.job_type, pv.job_type) is None:
                raise PolicyError(f"pack {action.job_id!r} with {action.partner!r}: pair never measured, refused")
            was_suspended = v.state is JobState.SUSPENDED
            snap.attach(v, pv.gpus, partner=pv)
            snap.set_state(v, JobState.RUNNING)
            if was_suspended:
                sj.stall_until = now + self.costs.resume(v.job_type)
                c["resumes"] += 1
            v.first_run = now if v.first_run is None else v.first_run
            v.last_start = now
            sj.packs += 1
            c["packs"] += 1
        elif isinstance(action, Unpack):
            sj = self._job(action.job_id, JobState.RUNNING)
            if sj.view.packed_with is None:
                raise PolicyError(f"unpack {action.job_id!r}: it is not packed")
            if any(len(snap.gpu_units[g]) >= self.costs.max_units_per_gpu for g in sj.view.gpus):
                raise PolicyError(f"unpack {action.job_id!r}: its GPUs cannot time-slice another unit")
            snap.split_pack(sj.view)
            c["unpacks"] += 1
        elif isinstance(action, Migrate):
            sj = self._job(action.job_id, JobState.RUNNING)
            if set(action.gpus) == set(sj.view.gpus) and sj.view.packed_with is None:
                raise PolicyError(f"migrate {action.job_id!r}: target is where it already runs")
            n = len(sj.view.gpus)
            # Any change of machines means new processes somewhere (a gang moves by checkpoint and restart).
            cross = snap.machines_of(action.gpus) != snap.machines_of(sj.view.gpus)
            start = self._free_at(action.gpus, now)     # other jobs' copy-outs on the target GPUs
            warm = self.costs.warmup(sj.view.job_type, cross)
            if warm > 0:                                # the job computes on at its source meanwhile
                if sj.warm_until <= now:                # (moved again during a warm-up: still at the first source)
                    sj.warm_rate = sj.view.rate
                sj.warm_until = max(sj.warm_until, now + warm)
            start = max(start, sj.warm_until)
            stall_until = start + self.costs.migrate(sj.view.job_type, cross)
            if sj.view.packed_with is None:             # (a packed job's GPUs stay busy with its partner anyway)
                self._copy_out(sj.view, now, keep=action.gpus, until=stall_until if cross else None)
            snap.detach(sj.view)
            self._check_gpus(action.job_id, action.gpus, n)
            snap.attach(sj.view, action.gpus)
            sj.stall_until = stall_until
            sj.migrations += 1
            c["migrations"] += 1
        elif isinstance(action, (Grow, Shrink)):
            sj = self._job(action.job_id, JobState.RUNNING)
            v = sj.view
            if not v.elastic:
                raise PolicyError(f"{type(action).__name__.lower()} {action.job_id!r}: job is not elastic")
            if v.packed_with is not None:
                raise PolicyError(f"{type(action).__name__.lower()} {action.job_id!r}: job is packed")
            old, new = set(v.gpus), set(action.gpus)
            if isinstance(action, Grow) and not (new > old):
                raise PolicyError(f"grow {action.job_id!r}: {action.gpus} is not a superset of {v.gpus}")
            if isinstance(action, Shrink) and not (new < old):
                raise PolicyError(f"shrink {action.job_id!r}: {action.gpus} is not a subset of {v.gpus}")
            self._check_elastic(v, len(new))
            snap.detach(v)
            self._check_gpus(action.job_id, action.gpus, None)
            snap.attach(v, action.gpus)
            sj.stall_until = max(now, sj.warm_until) + self.costs.suspend(v.job_type) + self.costs.resume(v.job_type)
            c["grows" if isinstance(action, Grow) else "shrinks"] += 1
        else:
            raise PolicyError(f"unknown action {action!r}")

    def _copy_out(self, v: JobView, now: float, keep=(), until: float | None = None) -> None:
        """The GPUs a job leaves (all but `keep`) stay busy while its state is copied off them (or `until`)."""
        t = now + self.costs.suspend(v.job_type) if until is None else until
        for g in v.gpus:
            if g not in keep and self.gpu_free_at.get(g, 0.0) < t:
                self.gpu_free_at[g] = t

    def _free_at(self, gpus, now: float) -> float:
        """When all of `gpus` are free of earlier copy-outs (now, if they are)."""
        fa = self.gpu_free_at
        return max([now] + [fa[g] for g in gpus if g in fa])

    @staticmethod
    def _check_elastic(v: JobView, n: int) -> None:
        if v.elastic and not (v.min_gpus <= n <= v.max_gpus):
            raise PolicyError(f"job {v.job_id!r}: elastic range is {v.min_gpus}..{v.max_gpus} GPUs, was given {n}")
