"""The event loop of one simulated cluster: arrivals, completions, policy timers and pack measurements.

Between events every job's speed is constant, so the loop only visits instants where something changes: it
settles the jobs an event touches, asks the policy, applies its actions through SimCluster (which refuses
impossible ones), re-rates the touched jobs and re-predicts their completions. Stale completion predictions are
dropped by a per-job version number instead of being searched for in the heap.

Events at the same instant are taken completions first (freed GPUs are visible), then measurements, timers,
and arrivals last, each arrival in trace order.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from gmux.cluster.policies.api import Event, EventKind, JobState, JobView, MachineView, Pack, PolicyError, SetTimer
from gmux.cluster.policies.snapshot import Snapshot
from gmux.cluster.sim.cluster import Costs, SimCluster, SimJob
from gmux.cluster.sim.throughputs import Throughputs
from gmux.cluster.sim.trace import TraceJob

_DONE, _MEASURE, _TIMER = 0, 1, 2


class SimulationError(Exception):
    pass


@dataclass
class RunResult:
    policy: str
    cluster: str
    num_gpus: int
    # (job_id, submit, first_run, finish, gpus, work, suspends, migrations, packs, held, waited, stalled): see
    # metrics.COLS
    jobs: list[tuple] = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    busy_gpu_s: float = 0.0
    idle_waiting_gpu_s: float = 0.0  # idle GPU-seconds while some job waited (pending or suspended)
    start: float = 0.0               # first submission
    end: float = 0.0                 # last completion (timers left over after it do not count)
    # (time, busy GPUs from then on), at each change: as many entries as events, however long the jobs run
    busy_steps: list = field(default_factory=list)
    decisions: int = 0
    decide_s: float = 0.0


def make_machines(n_machines: int, gpus_per_machine: int = 8, gpu_mem_gib: float = 16.0,
                  gpu_type: str = "v100") -> list[MachineView]:
    return [MachineView(m, tuple(range(m * gpus_per_machine, (m + 1) * gpus_per_machine)), gpu_mem_gib, gpu_type)
            for m in range(n_machines)]


class Engine:
    def __init__(self, machines: list[MachineView], jobs: list[TraceJob], policy, tput: Throughputs,
                 costs: Costs | None = None, cluster_name: str = "cluster", check: bool = False,
                 on_event=None, timer_fn=None):
        self.snap = Snapshot(machines)
        self.costs = costs or Costs()
        self.cluster = SimCluster(self.snap, tput, self.costs)
        self.policy = policy
        self.tput = tput
        self.check = check
        self.on_event = on_event            # test hook: called after every event with the engine
        self.timer_fn = timer_fn            # optional clock for measuring decision time (None: not measured)
        self.snap.no_fit = set(tput.no_fit)
        for a in tput.solo:
            for b in tput.solo:
                if (a, b) not in tput.pairs and (b, a) not in tput.pairs:
                    self.snap.no_fit.add((a, b))
        per = self.snap.max_gpus_per_machine
        too_big = [j for j in jobs if j.num_gpus > self.snap.total_gpus]
        if too_big:
            raise SimulationError(f"{cluster_name}: {len(too_big)} job(s) need more GPUs than the cluster's "
                                  f"{self.snap.total_gpus} (first: trace line {too_big[0].line})")
        self.jobs = sorted(jobs, key=lambda j: (j.submit, j.job_id))
        self.per = per
        self.heap: list = []
        self.seq = 0
        self.now = 0.0
        self.result = RunResult(policy=policy.name, cluster=cluster_name, num_gpus=self.snap.total_gpus)
        self._same = 0
        self.completed: set = set()

    # ---- bookkeeping -------------------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, payload))

    # Decisions allowed at one instant before the run is declared a livelock (a policy that keeps asking to be
    # woken "now", or two actions undoing each other forever).
    MAX_SAME_INSTANT = 200_000

    def _advance(self, t: float, decisions: bool = True) -> None:
        """Integrate busy GPUs from the last instant to t (utilisation and its time series). `decisions`: whether
        what happens at t is the policy's (a timer, an action's completion), which counts toward the livelock
        limit; the trace's arrivals do not (a valid trace may submit any number of jobs at one instant)."""
        if t <= self.now:
            self._same += decisions
            if self._same > self.MAX_SAME_INSTANT:
                raise SimulationError(f"{self.result.cluster}: policy {self.policy.name} made "
                                      f"{self.MAX_SAME_INSTANT} decisions at t={self.now:.3f} s without time "
                                      f"advancing (livelock)")
            return
        self._same = 0
        busy = self.snap.total_gpus - self.snap.total_idle
        r = self.result
        r.busy_gpu_s += busy * (t - self.now)
        if self.snap.pending or self.snap.suspended:
            r.idle_waiting_gpu_s += self.snap.total_idle * (t - self.now)
        if (r.busy_steps[-1][1] if r.busy_steps else 0) != busy:
            r.busy_steps.append((self.now, busy))
        self.now = t
        self.snap.now = t

    def _rerate(self, jids) -> None:
        cl = self.cluster
        for jid in jids:
            sj = cl.sim.get(jid)
            if sj is None or sj.finish is not None:
                continue
            cl.update_rate(sj)
            sj.version += 1
            t = cl.completion_time(sj, self.now)
            if t is not None:
                self._push(t, _DONE, (jid, sj.version))

    def _decide(self, event: Event) -> None:
        if self.timer_fn is not None:
            t0 = self.timer_fn()
            actions = self.policy.decide(self.snap, event)
            self.result.decide_s += self.timer_fn() - t0
        else:
            actions = self.policy.decide(self.snap, event)
        self.result.decisions += 1
        if not actions:
            return
        cl = self.cluster
        touched: set = set()
        for a in actions:
            if isinstance(a, SetTimer):
                if not math.isfinite(a.at):
                    raise PolicyError(f"timer at {a.at!r} is not a finite time")
                self._push(max(a.at, self.now), _TIMER, a.key)
                continue
            jobs, gpus = cl.touched_by(a)
            for jid in jobs:
                sj = cl.sim.get(jid)
                if sj is not None:
                    cl.settle(sj, self.now)
            cl.apply(a, self.now)
            touched |= jobs
            touched |= cl.residents(gpus)
            if isinstance(a, Pack):
                self._push(self.now + self.costs.measure_s, _MEASURE, (a.job_id, a.partner))
        self._rerate(touched)

    # ---- the loop ------------------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        cl, snap, jobs = self.cluster, self.snap, self.jobs
        oracle = getattr(self.policy, "uses_oracle", False)
        i, n = 0, len(jobs)
        if n:
            self.now = snap.now = jobs[0].submit
            self.result.start = self.now
        while i < n or self.heap:
            if self.heap and (i >= n or self.heap[0][0] <= jobs[i].submit):
                t, kind, _, payload = heapq.heappop(self.heap)
                if kind == _DONE:
                    jid, version = payload
                    sj = cl.sim.get(jid)
                    if sj is None or sj.version != version or sj.finish is not None:
                        continue
                    self._advance(t)
                    self._complete(sj)
                    self._decide(Event(EventKind.COMPLETION, job_id=jid))
                elif kind == _MEASURE:
                    a, b = payload
                    va, vb = snap.jobs.get(a), snap.jobs.get(b)
                    if va is None or vb is None or va.packed_with != b:
                        continue
                    self._advance(t)
                    pr = self.tput.pair(va.job_type, vb.job_type)
                    snap.pair_rates[(va.job_type, vb.job_type)] = pr
                    self._decide(Event(EventKind.MEASUREMENT, job_id=a, key=b))
                else:
                    self._advance(t)
                    self._decide(Event(EventKind.TIMER, key=payload))
            else:
                # Jobs submitted at one instant (a sweep launched by a script, a batch given at t=0) are all there
                # before the first decision: decided one by one, SJF served them in trace order and SRTF
                # suspended the long ones it had just started. Each then has its own arrival event.
                t, first = jobs[i].submit, i
                while i < n and jobs[i].submit == t:
                    i += 1
                self._advance(t, decisions=False)
                for tj in jobs[first:i]:
                    self._arrive(tj, oracle)
                for tj in jobs[first:i]:
                    self._decide(Event(EventKind.ARRIVAL, job_id=tj.job_id))
            if self.check:
                self.check_invariants()
            if self.on_event is not None:
                self.on_event(self)
        if snap.jobs:
            left = list(snap.jobs)[:5]
            raise SimulationError(f"{self.result.cluster}: policy {self.policy.name} left {len(snap.jobs)} job(s) "
                                  f"unfinished with nothing left to wake it (e.g. {left})")
        # The end is the last completion: a policy's timers may still fire after it, with nothing left to run.
        self.result.end = max((r[3] for r in self.result.jobs), default=self.result.start)
        self.result.counters = dict(cl.counters)
        return self.result

    def _arrive(self, tj: TraceJob, oracle: bool) -> None:
        el = tj.elastic and tj.num_gpus <= self.per
        view = JobView(job_id=tj.job_id, num_gpus=tj.num_gpus, job_type=tj.job_type, submit_time=tj.submit,
                       updated_at=tj.submit, elastic=el,
                       min_gpus=max(1, tj.num_gpus // 2) if el else tj.num_gpus,
                       max_gpus=min(self.per, 2 * tj.num_gpus) if el else tj.num_gpus,
                       remaining_hint=tj.duration if oracle else None,
                       duration_hint=tj.duration if oracle else None, owner=tj.user or None)
        uncons = self.tput.unconsolidated.get(tj.job_type, 1.0)
        self.cluster.sim[tj.job_id] = SimJob(view, tj.duration, self.per, uncons)
        self.snap.add_job(view)

    def _complete(self, sj: SimJob) -> None:
        cl, snap = self.cluster, self.snap
        v = sj.view
        neighbours = cl.residents(v.gpus)
        for jid in neighbours:
            cl.settle(cl.sim[jid], self.now)
        # (progress is rate x elapsed clock: thousands of years into a trace the clock's own rounding is ~1e-4 s)
        if sj.work - sj.progress > 1e-6 * max(1.0, sj.work) + 16 * math.ulp(self.now):
            raise SimulationError(f"job {v.job_id} completed with {sj.work - sj.progress:.6f} s of work left")
        sj.progress = sj.work
        sj.finish = self.now
        if v.job_id in self.completed:
            raise SimulationError(f"job {v.job_id} completed twice")
        self.completed.add(v.job_id)
        snap.remove_job(v.job_id)
        neighbours.discard(v.job_id)
        self._rerate(neighbours)
        self.result.jobs.append((v.job_id, v.submit_time, v.first_run, sj.finish, v.num_gpus, sj.work,
                                 sj.suspends + sj.sliced_suspends, sj.migrations, sj.packs, sj.held, sj.waited,
                                 sj.stalled))

    # ---- invariants (tests) -----------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        snap, cl = self.snap, self.cluster
        seen: dict = {}
        for g, units in snap.gpu_units.items():
            if len(units) > self.costs.max_units_per_gpu:
                raise AssertionError(f"GPU {g} time-slices {len(units)} units")
            for u in units:
                if not 1 <= len(u) <= 2:
                    raise AssertionError(f"GPU {g} runs {len(u)} jobs concurrently")
                if len(u) == 2:
                    a, b = snap.jobs[u[0]], snap.jobs[u[1]]
                    if not self.tput.fits(a.job_type, b.job_type):
                        raise AssertionError(f"GPU {g}: pack {u} over-commits memory")
                for jid in u:
                    seen.setdefault(jid, []).append(g)
        idle = sum(1 for u in snap.gpu_units.values() if not u)
        if idle != snap.total_idle:
            raise AssertionError(f"idle index says {snap.total_idle}, GPUs say {idle}")
        for jid, v in snap.jobs.items():
            on = seen.get(jid, [])
            if v.state is JobState.RUNNING:
                if sorted(on) != sorted(v.gpus) or not v.gpus:
                    raise AssertionError(f"job {jid} thinks it is on {v.gpus}, GPUs hold it on {on}")
            elif on or v.gpus:
                raise AssertionError(f"{v.state.value} job {jid} still on GPUs {on}")
        if set(seen) - set(snap.jobs):
            raise AssertionError(f"GPUs hold unknown jobs {set(seen) - set(snap.jobs)}")
        if len(snap.pending) + len(snap.running) + len(snap.suspended) != len(snap.jobs):
            raise AssertionError("state indexes disagree with the job table")
        # GPU-time conservation: busy GPU time equals the GPU time attributed to jobs, finished or not.
        for sj in cl.sim.values():
            if sj.finish is None:
                cl.settle(sj, self.now)
        held = sum(sj.held for sj in cl.sim.values())
        if abs(held - self.result.busy_gpu_s) > 1e-6 * max(1.0, held):
            raise AssertionError(f"GPU time not conserved: jobs held {held}, GPUs were busy {self.result.busy_gpu_s}")
