"""Shared machinery of the priority policies (sjf, srtf, tiresias): an ordered waiting list and a
"desired running set" walk.

Each decision walks jobs best-first, giving each the GPUs it needs while any are left in the budget (the
cluster's size for preemptive policies, its idle GPUs otherwise). Running jobs outside the desired set are
suspended; waiting jobs inside it are placed with a consolidated best fit; a victim whose GPUs nobody ended up
needing is left running; leftover idle GPUs are backfilled in priority order. The walk stops as soon as the
budget is spent, so a decision costs O(running jobs + waiting jobs walked), not O(all jobs).
"""
from __future__ import annotations

import bisect
import heapq
from collections import Counter

from .api import Event, Policy, Suspend
from .planning import Plan


class PriorityPolicy(Policy):
    """Subclasses define waiting_key(job) (fixed while the job waits) and running_key(job, now), comparable."""

    defragments = False    # whether _find can make room by migration (then scattered idle GPUs still count)

    def __init__(self):
        self._waiting: list = []          # sorted [(key, job_id)]
        self._keys: dict = {}             # job_id -> key it is filed under
        self._demand: Counter = Counter()

    # ---- the waiting index ---------------------------------------------------------------------------------
    def waiting_key(self, job):
        raise NotImplementedError

    def running_key(self, job, now):
        return self.waiting_key(job)

    def _file(self, job) -> None:
        k = (self.waiting_key(job), job.job_id)
        self._keys[job.job_id] = k
        bisect.insort(self._waiting, k)
        self._demand[job.num_gpus] += 1

    def _unfile(self, job) -> None:
        k = self._keys.pop(job.job_id)
        i = bisect.bisect_left(self._waiting, k)
        del self._waiting[i]
        self._demand[job.num_gpus] -= 1
        if not self._demand[job.num_gpus]:
            del self._demand[job.num_gpus]

    def _sync(self, snap) -> None:
        """Keep the index equal to the snapshot's waiting jobs; rebuild if someone else changed states."""
        waiting = len(snap.pending) + len(snap.suspended)
        if waiting == len(self._keys) and all(j in self._keys for j in snap.pending) and \
                all(j in self._keys for j in snap.suspended):
            return
        self._waiting, self._keys, self._demand = [], {}, Counter()
        for jid in list(snap.pending) + list(snap.suspended):
            self._file(snap.jobs[jid])

    def _sync_event(self, snap, event: Event) -> None:
        # The common cases in O(log n): a new arrival; otherwise fall back to a full check only when counts differ.
        if event.job_id is not None and event.job_id in snap.pending and event.job_id not in self._keys:
            self._file(snap.jobs[event.job_id])
        if len(self._keys) != len(snap.pending) + len(snap.suspended):
            self._sync(snap)

    # ---- decisions ------------------------------------------------------------------------------------------
    def decide(self, snap, event: Event) -> list:
        self._sync_event(snap, event)
        if not self._keys:
            return self._after(snap, [])
        plan = Plan(snap)
        if self.preemptive:
            self._preempt(snap, plan)
        self._backfill(snap, plan)
        for a in plan.actions:
            job = snap.jobs[a.job_id]
            if isinstance(a, Suspend):
                self._file_as_suspended(job, snap.now)
            elif job.job_id in self._keys:
                self._unfile(job)
        return self._after(snap, plan.actions)

    def _find(self, snap, plan: Plan, job):
        """GPUs for a waiting job in this plan, or None. Subclasses may defragment."""
        return plan.find_gpus(job.num_gpus)

    def _after(self, snap, actions: list) -> list:
        """Hook for subclasses that add timers to what was decided."""
        return actions

    def _file_as_suspended(self, job, now: float) -> None:
        # Filed with the key it has at the moment of suspension; it accrues nothing while it waits.
        k = (self.running_key(job, now), job.job_id)
        self._keys[job.job_id] = k
        bisect.insort(self._waiting, k)
        self._demand[job.num_gpus] += 1

    def _preempt(self, snap, plan: Plan) -> None:
        now = snap.now
        budget = snap.total_gpus
        keep = set()
        running = []
        for j in snap.running:
            if j in plan.moved:
                continue
            job = snap.jobs[j]
            if job.packed_with is not None:
                # Suspending either member of a pack frees no GPU, so packs are never victims; the pair
                # uses its GPUs once.
                if job.packed_with not in keep:
                    budget -= len(job.gpus)
                keep.add(j)
                continue
            running.append((self.running_key(job, now), j))
        running.sort()
        if not running:
            return
        chosen_waiting = []
        merged = heapq.merge(((k, 0, j) for k, j in running), ((k, 1, j) for k, j in self._waiting))
        for key, waiting, jid in merged:
            if budget <= 0:
                break
            if waiting and jid in plan.moved:
                continue
            job = snap.jobs[jid]
            n = len(job.gpus) if not waiting else job.num_gpus
            if n <= budget:
                budget -= n
                (chosen_waiting.append(job) if waiting else keep.add(jid))
        if not chosen_waiting:
            return
        victims = [snap.jobs[j] for _, j in running if j not in keep]
        if not victims:
            return
        for v in victims:
            plan.suspend(v)
        for job in chosen_waiting:
            gpus = self._find(snap, plan, job)
            if gpus is not None:
                plan.place(job, gpus)
        # A victim whose GPUs all stayed idle was suspended for nothing: keep it running instead.
        spared = {v.job_id for v in victims if all(plan.units(g) == 0 for g in v.gpus)}
        if spared:
            plan.actions = [a for a in plan.actions if not (isinstance(a, Suspend) and a.job_id in spared)]
            for v in victims:
                if v.job_id in spared:
                    plan._occupy(v.gpus)
                    plan.moved.discard(v.job_id)

    def _backfill(self, snap, plan: Plan) -> None:
        """Fill idle GPUs with waiting jobs, best first, skipping those that do not fit.

        Victims of this same decision are not resumed here (that would undo the preemption just chosen); the
        next event reconsiders them."""
        budget = plan.total_idle
        if budget == 0 or not self._demand:
            return
        min_need = min(self._demand)
        per = snap.max_gpus_per_machine
        fit = per if self.defragments else plan.max_idle_on_a_machine()
        for key, jid in self._waiting:
            if budget < min_need or (fit < min_need and min_need <= per):
                break
            if jid in plan.moved:
                continue
            job = snap.jobs[jid]
            n = job.num_gpus
            if n > budget or (n <= per and n > fit):
                continue
            gpus = self._find(snap, plan, job)
            if gpus is None:
                continue
            plan.place(job, gpus)
            budget -= n
            if not self.defragments:
                fit = plan.max_idle_on_a_machine()
