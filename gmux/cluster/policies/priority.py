"""Shared machinery of the priority policies (sjf, srtf, tiresias, gmux): ordered indexes of waiting and running
jobs, preemption of the worst running jobs by the best waiting ones, and backfilling.

A decision must stay cheap with 10,000 active jobs, so nothing here walks every job:
- waiting jobs sit in a sorted list keyed by `waiting_key` (fixed while a job waits);
- running jobs (preemptive policies) sit in a sorted list keyed by `running_key` when they started, re-keyed
  when the policy's own timers say a job's key changed (Tiresias' demotions); the current key is recomputed
  for every job actually examined, so a slightly stale position only costs ordering precision, never safety;
- preemption pairs the best waiting job with the worst running ones, and stops at the first waiting job that
  no worse-keyed running job can make room for; backfill stops once no waiting job can fit the idle GPUs.
Both indexes are checked against the snapshot's counts on every call and rebuilt if someone else changed
states (a real scheduler's view can move under a policy), so they are accelerators, not a second truth.
"""
from __future__ import annotations

import bisect
from collections import Counter

from .api import Event, EventKind, Pack, Place, Policy, Resume, SetTimer, Suspend
from .planning import Plan


def is_wakeup(event: Event) -> bool:
    """A timer this policy asked for to look again once a protection or a delay ends (_take_wakeups)."""
    return event.kind is EventKind.TIMER and isinstance(event.key, tuple) and event.key[:1] == ("wake",)


class PriorityPolicy(Policy):
    """Subclasses define waiting_key(job) (fixed while the job waits) and running_key(job, now), comparable;
    smaller is better. `rekey_at(job, now)` may return when a running job's key will next change."""

    defragments = False    # whether _find can make room by migration (then scattered idle GPUs still count)
    max_examined = 32      # waiting jobs that may try preemption in one decision
    min_run_s = 0.0        # a job that (re)started less than this ago is not preempted (anti-thrashing)

    def __init__(self):
        self._waiting: list = []          # sorted [(key, job_id)]
        self._keys: dict = {}             # job_id -> (key, job_id) it is filed under
        self._demand: Counter = Counter()
        self._running: list = []          # sorted [(key, job_id)], preemptive policies only
        self._rkeys: dict = {}
        self._wakeup = None               # earliest end of a protection or a waiting job's delay, this decision
        self._armed: set = set()          # wake-up times already requested
        self._rearm: list = []            # re-key timers for running jobs re-keyed in this decision
        self._rgen: dict = {}             # job_id -> its latest start's number (re-key timers carry it)

    # ---- ordering ------------------------------------------------------------------------------------------
    def waiting_key(self, job):
        raise NotImplementedError

    def running_key(self, job, now):
        return self.waiting_key(job)

    def suspended_key(self, job, now):
        """Where a job suspended now is filed among the waiting ones (by default: its running key)."""
        return self.running_key(job, now)

    def rekey_at(self, job, now, gpus: int):
        """When a job running on `gpus` GPUs changes key next (None: never, or only in ways that keep the order of
        running jobs, as SRTF's remaining times all shrinking at one rate do). Called when it starts and again
        at each re-key."""
        return None

    def may_idle(self, job, victim, spare: int, now) -> bool:
        """Whether `job` may suspend `victim`, a gang wider than it needs, when that frees `spare` GPUs beyond
        its need (the idle GPUs counted). By default always, as SRTF and Tiresias do."""
        return True

    @staticmethod
    def service_until(job, now, gpus: int, target: float) -> float:
        """The instant a job running on `gpus` GPUs reaches `target` GPU-seconds of service (its measured
        service rate when it has one: a packed job gains less than one GPU-second per GPU)."""
        rate = job.service_rate if job.service_rate > 0 else max(1, gpus)
        return now + max(0.0, target - job.attained_at(now)) / rate + 1e-6

    # ---- the waiting index ---------------------------------------------------------------------------------
    def _file(self, job, key=None) -> None:
        k = (self.waiting_key(job) if key is None else key, job.job_id)
        self._keys[job.job_id] = k
        bisect.insort(self._waiting, k)
        self._demand[job.num_gpus] += 1

    def _unfile(self, job) -> None:
        k = self._keys.pop(job.job_id)
        del self._waiting[bisect.bisect_left(self._waiting, k)]
        self._demand[job.num_gpus] -= 1
        if not self._demand[job.num_gpus]:
            del self._demand[job.num_gpus]

    # ---- the running index ---------------------------------------------------------------------------------
    def _run_add(self, job, now) -> None:
        k = (self.running_key(job, now), job.job_id)
        self._rkeys[job.job_id] = k
        bisect.insort(self._running, k)

    def _run_remove(self, jid) -> None:
        k = self._rkeys.pop(jid, None)
        if k is not None:
            del self._running[bisect.bisect_left(self._running, k)]

    def _sync(self, snap, event: Event) -> None:
        if is_wakeup(event):
            self._armed.discard(event.key[1])
        if event.kind is EventKind.ARRIVAL and event.job_id in snap.pending and event.job_id not in self._keys:
            self._file(snap.jobs[event.job_id])
        if event.kind is EventKind.COMPLETION:
            self._run_remove(event.job_id)
            self._rgen.pop(event.job_id, None)
        # Membership, not just counts: gmux-scheduler builds a fresh snapshot per decision, and a job may have
        # started or finished elsewhere between two calls (O(jobs) set comparisons, ~0.3 ms at 10,000 jobs).
        if len(self._keys) != len(snap.pending) + len(snap.suspended) or \
                not (self._keys.keys() - snap.pending.keys()) <= snap.suspended.keys():
            self._waiting, self._keys, self._demand = [], {}, Counter()
            for jid in list(snap.pending) + list(snap.suspended):
                self._file(snap.jobs[jid])
        if self.preemptive:
            if event.kind is EventKind.TIMER and isinstance(event.key, tuple) and event.key[0] == "rekey":
                jid = event.key[1]
                # A timer from an earlier run of the job (suspended and started again since) is stale: the
                # later start armed its own.
                if jid in self._rkeys and jid in snap.running and self._rgen.get(jid) == event.key[2]:
                    job = snap.jobs[jid]
                    self._run_remove(jid)
                    self._run_add(job, snap.now)
                    # And the change after it: without this a job kept the key of its first crossing for as
                    # long as it ran (Tiresias' second threshold was never seen by a job that ran past both).
                    at = self.rekey_at(job, snap.now, max(1, len(job.gpus)))
                    if at is not None and at > snap.now:      # never "now" again: that would never end
                        self._rearm.append(SetTimer(at, event.key))
            if len(self._rkeys) != len(snap.running) or self._rkeys.keys() != snap.running.keys():
                self._running, self._rkeys = [], {}
                for jid in snap.running:
                    self._run_add(snap.jobs[jid], snap.now)

    def _reindex(self) -> None:
        """Empties both indexes, which _sync then builds again from the snapshot (keys read anew). Whole: keys
        emptied beside their lists, a job of a batch filed again at its arrival stayed listed after it ran."""
        self._waiting, self._keys, self._demand = [], {}, Counter()
        self._running, self._rkeys = [], {}

    # ---- decisions ------------------------------------------------------------------------------------------
    def decide(self, snap, event: Event) -> list:
        self._sync(snap, event)
        plan = Plan(snap)
        self._plan(snap, plan, event)
        self._look_again_if_a_victim_fits(snap, plan)
        return self._record(snap, plan.actions) + self._take_wakeups()

    def _look_again_if_a_victim_fits(self, snap, plan: Plan) -> None:
        """Where a preemption gave a narrower job part of a gang, a job suspended in the same decision may fit the
        GPUs left idle: a wake-up at once resumes it there (without one they idled until the next event, hours on
        a quiet cluster). Not in this decision: a real scheduler resumes a job once its suspend is on record."""
        if not plan.total_idle:
            return
        victims = (snap.jobs[a.job_id] for a in plan.actions if isinstance(a, Suspend))
        if any(plan.find_gpus(v.num_gpus, mem_gib=v.mem_gib) for v in victims):
            self._wakeup = snap.now          # (any other wake-up asked for is later: this one looks again first)

    def _take_wakeups(self) -> list:
        """A timer for the earliest moment a job protected by min_run_s becomes preemptible, or a waiting job's
        delay ends, if one was skipped and no timer for that moment is already pending (busy clusters would
        otherwise pile up thousands)."""
        out, self._rearm = self._rearm, []
        w, self._wakeup = self._wakeup, None
        if w is None or w in self._armed:
            return out
        self._armed.add(w)
        return out + [SetTimer(w, ("wake", w))]

    def _plan(self, snap, plan: Plan, event: Event) -> None:
        if not self._keys:
            return
        if self.preemptive:
            self._preempt(snap, plan)
        self._backfill(snap, plan)

    def _record(self, snap, actions: list) -> list:
        """Bring the indexes up to date with what was decided; add re-key timers for jobs just started."""
        now = snap.now
        out = list(actions)
        for a in actions:
            if isinstance(a, SetTimer):
                continue
            job = snap.jobs[a.job_id]
            if isinstance(a, Suspend):
                self._run_remove(job.job_id)
                self._file(job, self.suspended_key(job, now))   # it accrues nothing while it waits
            elif isinstance(a, (Place, Resume, Pack)):
                if job.job_id in self._keys:
                    self._unfile(job)
                if self.preemptive:
                    self._run_add(job, now)
                    at = self.rekey_at(job, now, job.num_gpus if isinstance(a, Pack) else len(a.gpus))
                    if at is not None:
                        gen = self._rgen[job.job_id] = self._rgen.get(job.job_id, 0) + 1
                        out.append(SetTimer(at, ("rekey", job.job_id, gen)))
        return out

    def _find(self, snap, plan: Plan, job):
        """GPUs for a waiting job in this plan, or None. Subclasses may defragment."""
        return plan.find_gpus(job.num_gpus, mem_gib=job.mem_gib)

    def _preempt(self, snap, plan: Plan) -> None:
        """Best waiting jobs displace worst running ones (strictly worse key), while that makes room.

        Eligible victims are drawn once per decision from the worst end of the running index into `pool`, so
        each running job is looked at no more than once however many waiting jobs try."""
        now = snap.now
        pool: list = []
        used = 0                      # pool[:used] are already suspended in this plan
        scan = len(self._running) - 1

        def draw():
            nonlocal scan
            while scan >= 0:
                rid = self._running[scan][1]
                scan -= 1
                r = snap.jobs.get(rid)
                if r is None or rid in plan.moved or r.packed_with is not None or not r.gpus:
                    continue          # suspending a packed job frees no GPU
                if self.min_run_s and r.last_start is not None and now - r.last_start < self.min_run_s - 1e-6:
                    at = r.last_start + self.min_run_s + 1e-3     # strictly after, or the timer re-arms itself
                    self._wakeup = at if self._wakeup is None else min(self._wakeup, at)
                    continue
                return r
            return None

        examined = 0
        for key, jid in list(self._waiting[: self.max_examined * 4]):
            if examined >= self.max_examined:
                break
            if jid in plan.moved:
                continue
            job = snap.jobs[jid]
            n = job.num_gpus
            if n <= plan.total_idle:
                gpus = self._find(snap, plan, job)
                if gpus is not None:
                    plan.place(job, gpus)
                    examined += 1
                    continue
            if self._still_waiting(job, now):
                continue
            examined += 1
            victims, freed, q, no_more = [], plan.total_idle, used, False
            while freed < n:
                if q == len(pool):
                    r = draw()
                    if r is None:
                        no_more = True
                        break
                    pool.append(r)
                r = pool[q]
                if not self.running_key(r, now) > key:
                    no_more = True    # the rest are better than this job, so better than anyone behind it too
                    break
                q += 1
                if len(r.gpus) > n and not self.may_idle(job, r, freed + len(r.gpus) - n, now):
                    continue
                victims.append(r)
                freed += len(r.gpus)
            if freed < n:
                if no_more and q == used:
                    break
                continue
            trial = plan.copy()
            for v in victims:
                trial.suspend(v)
            gpus = self._find(snap, trial, job)
            if gpus is None:
                continue            # room by count, not by place (fragmentation): leave everyone running
            # Suspend only the victims whose GPUs the job really takes (a defragmenting _find may also have
            # planned migrations in the trial: keep the trial then).
            taken = set(gpus)
            if any(not isinstance(a, Suspend) for a in trial.actions[len(plan.actions):]):
                plan.adopt(trial)
            else:
                for v in victims:
                    if taken & set(v.gpus):
                        plan.suspend(v)
            if any(plan.units(g) for g in gpus):
                raise AssertionError("preemption planned onto busy GPUs")
            plan.place(job, gpus)
            # Victims not needed stay running but leave the pool's head: they were worse than this job.
            used = q

    def may_preempt_at(self, job, now) -> float:
        """From when a waiting job that finds no idle GPUs may displace running ones (here: at once)."""
        return now

    def _still_waiting(self, job, now) -> bool:
        """Whether the job waits by choice for now (see may_preempt_at); if so, a wake-up is asked for its end."""
        ready = self.may_preempt_at(job, now)
        if ready <= now:
            return False
        self._wakeup = ready if self._wakeup is None else min(self._wakeup, ready)
        return True

    def _backfill(self, snap, plan: Plan) -> None:
        """Fill idle GPUs with waiting jobs, best first, skipping those that do not fit."""
        budget = plan.total_idle
        if budget == 0 or not self._demand:
            return
        min_need = min(self._demand)
        per = snap.max_gpus_per_machine
        fit = per if self.defragments else plan.max_idle_on_a_machine()
        no_room: set = set()     # (size, machines too small for it) found not to fit since the plan last changed
        for key, jid in self._waiting:
            if budget < min_need or (fit < min_need and min_need <= per):
                break
            if jid in plan.moved:
                continue
            job = snap.jobs[jid]
            n, short = job.num_gpus, snap.machines_short_of(job.mem_gib)
            if n > budget or (n <= per and n > fit) or (n, short) in no_room:
                continue
            gpus = self._find(snap, plan, job)
            if gpus is None:
                # _find depends on the plan, n and the machines too small for the job only, and a failed search
                # leaves the plan as it was: until something is placed, no other such job fits either. Where every
                # size that waits is known not to fit on any machine, the rest of a deep backlog need not be looked
                # at (it was, per job: minutes a decision where thousands wait).
                no_room.add((n, short))
                if all((k, frozenset()) in no_room or k > budget for k in self._demand):
                    break
                continue
            no_room = set()
            plan.place(job, gpus)
            budget -= n
            if not self.defragments:
                fit = plan.max_idle_on_a_machine()
