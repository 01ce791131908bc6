"""gmux's default policy: least-attained-service with cheap suspends, packing only where measurement says it
beats preemption, migration against fragmentation, and a starvation guard.

What the Philly measurements (benchmarks/simulate.py) showed, and what each rule answers:
- The per-VC clusters run at ~10% average utilisation, but contention comes in bursts inside a few VCs, where
  JCT is lost to (a) short jobs queued behind long ones, (b) 8- and 32-GPU jobs waiting for a whole machine
  while enough GPUs are idle in scattered holes, and (c) sharing that slows jobs when idle GPUs exist.
  FIFO loses (a) and (b); Gandiva's time-slicing fixes (a) only partly (a newcomer gets 1/k of a GPU) and pays
  (c); Tiresias fixes (a) but not (b).
- So: priority by attained GPU-service (LAS), discretized geometrically (x4 per level from 15 GPU-minutes) so
  jobs of similar service do not thrash; within a level, oldest submission first. A newcomer suspends the
  highest-level running job when nothing is idle (suspend+resume costs ~0.6 s against a 60 s quantum).
- Placement is consolidated best fit; when it fails but enough GPUs are idle, a machine is defragmented by
  migrating up to `defrag_moves` small jobs (Gandiva's migration, used where it pays).
- Packing: sharing a GPU beats suspending the partner for the sum of JCTs only when 2 r_new + r_partner > 2
  (the newcomer finishes 1/r_new later, the partner keeps r_partner of its speed). gmux packs a waiting job that
  would otherwise wait only if that holds for the measured pair rates, or if the pair was never measured and
  fits (exploration: the engine or the daemons measure it during a window); a measured loser is undone by
  suspending the member with more attained service, and the type pair is not tried again.
- Anti-thrashing: a job that (re)started less than `min_run_s` (300 s, five Gandiva quanta) ago is not
  preempted; the newcomer waits for that moment (a timer), which bounds suspends per job per level.
- Idle GPUs are never left idle while a packed job could run alone: packs are split by migration.
- Starvation guard (Tiresias' promotion): a job that has waited `starve_factor` times the time it has run (at
  least `starve_min_s`, 6 h) has its service forgiven: it re-enters the top level and is demoted again as it
  runs. This bounds how much worse a long job fares than under FIFO (the benchmark reports the p99 of
  JCT/JCT_fifo).
"""
from __future__ import annotations

import bisect

from .api import Event, EventKind, Place, Resume, SetTimer, Suspend
from .planning import Plan
from .priority import PriorityPolicy
from .sharing import consolidate, defragment_for, deshare


class GmuxPolicy(PriorityPolicy):
    name = "gmux"
    preemptive = True

    def __init__(self, base_gpu_s: float = 900.0, factor: float = 4.0, levels: int = 6, defrag_moves: int = 4,
                 pack: bool = True, explore: bool = True, pack_margin: float = 0.0, starve_factor: float = 1.0,
                 starve_min_s: float = 21600.0, max_pack_tries: int = 8, min_run_s: float = 300.0):
        super().__init__()
        if base_gpu_s <= 0 or factor <= 1 or levels < 1 or defrag_moves < 0 or starve_factor <= 0:
            raise ValueError("need base_gpu_s > 0, factor > 1, levels >= 1, defrag_moves >= 0, starve_factor > 0")
        self.thresholds = tuple(base_gpu_s * factor ** i for i in range(levels - 1))
        self.defrag_moves = defrag_moves
        self.defragments = defrag_moves > 0
        if min_run_s < 0:
            raise ValueError("min_run_s must be >= 0")
        self.min_run_s = min_run_s
        self.pack = pack
        self.explore = explore
        self.pack_margin = pack_margin
        self.starve_factor = starve_factor
        self.starve_min_s = starve_min_s
        self.max_pack_tries = max_pack_tries
        self.losing_pairs: set = set()
        self._host_idx: dict = {}       # GPU count -> job type -> {running job: None}, oldest first
        self._host_age = 0
        self.promoted: dict = {}        # job -> attained service forgiven when it was promoted

    def describe(self) -> dict:
        return {"name": self.name, "thresholds_gpu_s": list(self.thresholds), "defrag_moves": self.defrag_moves,
                "pack": self.pack, "explore": self.explore, "starve_factor": self.starve_factor,
                "starve_min_s": self.starve_min_s, "min_run_s": self.min_run_s}

    # ---- priority ------------------------------------------------------------------------------------------
    def level(self, attained: float) -> int:
        return bisect.bisect_right(self.thresholds, attained)

    def waiting_key(self, job):
        return (self.level(job.attained - self.promoted.get(job.job_id, 0.0)), job.submit_time)

    def running_key(self, job, now):
        return (self.level(job.attained_at(now) - self.promoted.get(job.job_id, 0.0)), job.submit_time)

    def _find(self, snap, plan: Plan, job):
        gpus = plan.find_gpus(job.num_gpus)
        if gpus is None and job.num_gpus <= snap.max_gpus_per_machine and self.defrag_moves:
            gpus = defragment_for(snap, plan, job.num_gpus, self.defrag_moves)
        return gpus

    def rekey_at(self, job, now, gpus: int):
        served = job.attained - self.promoted.get(job.job_id, 0.0)
        lvl = self.level(served)
        if lvl >= len(self.thresholds):
            return None
        return now + (self.thresholds[lvl] - served) / max(1, gpus) + 1e-6

    # ---- decisions -----------------------------------------------------------------------------------------
    def decide(self, snap, event: Event) -> list:
        self._sync(snap, event)
        if event.kind is EventKind.TIMER and isinstance(event.key, tuple) and event.key[0] == "promote":
            self._promote(snap, event.key[1])
        plan = Plan(snap)
        if event.kind is EventKind.MEASUREMENT:
            self._introspect(snap, plan, event)
        if self._keys:
            self._preempt(snap, plan)
            self._backfill(snap, plan)
            if self.pack:
                self._pack_waiting(snap, plan)
        if plan.total_idle and event.kind is not EventKind.ARRIVAL:
            # Only when GPUs were freed: an arrival just used the idle ones.
            deshare(snap, plan, packed_only=True)
            consolidate(snap, plan)
        out = self._record(snap, plan.actions)
        if self.pack:
            self._note_hosts(snap, plan.actions)
        now = snap.now
        timers = []
        for a in plan.actions:
            if isinstance(a, Suspend):
                timers.append(self._starvation_timer(snap.jobs[a.job_id], now))
        if event.kind is EventKind.ARRIVAL and event.job_id in self._keys:
            timers.append(self._starvation_timer(snap.jobs[event.job_id], now))
        if event.kind is EventKind.COMPLETION:
            self.promoted.pop(event.job_id, None)
        return out + timers + self._take_wakeups()

    def _starvation_timer(self, job, now: float) -> SetTimer:
        ran = job.attained / max(1, job.num_gpus)
        return SetTimer(now + max(self.starve_min_s, self.starve_factor * ran), ("promote", job.job_id))

    def _promote(self, snap, jid) -> None:
        job = snap.jobs.get(jid)
        if job is None or jid not in self._keys:
            return
        self._unfile(job)
        self.promoted[jid] = job.attained
        self._file(job)

    def _introspect(self, snap, plan: Plan, event: Event) -> None:
        a, b = snap.jobs.get(event.job_id), snap.jobs.get(event.key)
        if a is None or b is None or a.packed_with != b.job_id:
            return
        pr = snap.pair_rate(a.job_type, b.job_type)
        if pr is None or self._pack_pays(pr.rate_a, pr.rate_b) or self._pack_pays(pr.rate_b, pr.rate_a):
            return
        self.losing_pairs.add(frozenset((a.job_type, b.job_type)))
        # LAS decides who keeps the GPU: the one with less service.
        loser = a if self.running_key(a, snap.now) > self.running_key(b, snap.now) else b
        plan.suspend(loser)

    def _pack_pays(self, r_new: float, r_partner: float) -> bool:
        return 2.0 * r_new + r_partner > 2.0 + self.pack_margin

    def _pack_waiting(self, snap, plan: Plan) -> None:
        """Waiting jobs that found no GPUs: pack each with a running job where measurement says it pays.

        Hosts come from an index by (GPU count, type) kept up to date from this policy's own placements and
        rebuilt every `HOST_REBUILD` decisions (entries are re-validated on use), so a waiting job costs
        O(job types), not O(running jobs)."""
        if not snap.running:
            return
        self._host_age += 1
        if self._host_age > self.HOST_REBUILD or not self._host_idx:
            self._rebuild_hosts(snap)
        tried = 0
        for key, jid in self._waiting:
            if tried >= self.max_pack_tries:
                break
            if jid in plan.moved:
                continue
            tried += 1
            job = snap.jobs[jid]
            best = None
            for jtype, hosts in self._host_idx.get(job.num_gpus, {}).items():
                if frozenset((job.job_type, jtype)) in self.losing_pairs:
                    continue
                other = self._first_host(snap, plan, hosts, job.num_gpus)
                if other is None or not snap.pair_fits(job, other):
                    continue
                pr = snap.pair_rate(job.job_type, jtype)
                if pr is None:
                    if not self.explore:
                        continue
                    score = 0.0
                elif self._pack_pays(pr.rate_a, pr.rate_b):
                    score = 2.0 * pr.rate_a + pr.rate_b
                else:
                    continue
                cand = (score, -other.submit_time, other.job_id)
                if best is None or cand > best:
                    best = cand
            if best is not None:
                plan.pack(job, snap.jobs[best[2]])

    HOST_REBUILD = 1000

    @staticmethod
    def _first_host(snap, plan: Plan, hosts: dict, n: int):
        """The oldest valid host in `hosts` (running, alone on its GPUs), dropping stale entries on the way."""
        stale = []
        found = None
        for rid in hosts:
            other = snap.jobs.get(rid)
            if other is None or other.packed_with is not None or len(other.gpus) != n:
                stale.append(rid)
                continue
            if rid in plan.moved or any(plan.units(g) != 1 for g in other.gpus):
                continue
            found = other
            break
        for rid in stale:
            del hosts[rid]
        return found

    def _rebuild_hosts(self, snap) -> None:
        self._host_age = 0
        self._host_idx = {}
        for rid in snap.running:
            other = snap.jobs[rid]
            if other.packed_with is None:
                self._host_idx.setdefault(len(other.gpus), {}).setdefault(other.job_type, {})[rid] = None

    def _note_hosts(self, snap, actions: list) -> None:
        for a in actions:
            if isinstance(a, (Place, Resume)):
                job = snap.jobs[a.job_id]
                self._host_idx.setdefault(len(a.gpus), {}).setdefault(job.job_type, {})[a.job_id] = None
