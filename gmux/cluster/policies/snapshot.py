"""The cluster snapshot a policy reads, with the indexes that keep a decision fast on 8,000 GPUs.

Policies only read a Snapshot. Its owner (the simulator's cluster model, or gmux-scheduler fed by the daemons)
changes it through the `attach`/`detach`/`add_job`/`remove_job` methods below, which keep the indexes true:
  - `gpu_units[g]`: the units on GPU g (a unit is a tuple of job ids running concurrently; several units on one
    GPU are time-sliced);
  - `machine_idle[m]` and `idle_by_count[k]`: idle-GPU counts per machine and the machines with exactly k idle
    GPUs, so a best-fit search costs O(GPUs per machine), not O(machines);
  - `pending` / `suspended` / `running`: ordered sets of job ids by state. `pending` is in arrival order;
    OrderedDict because reading the first key of a plain dict after many front deletions is O(n) in CPython.
"""
from __future__ import annotations

from collections import OrderedDict

from .api import JobState, JobView, MachineView, PairRate


class Snapshot:
    def __init__(self, machines: list[MachineView], now: float = 0.0):
        self.now = now
        self.machines = machines
        self.gpu_machine: dict[int, int] = {}
        for m in machines:
            for g in m.gpu_ids:
                if g in self.gpu_machine:
                    raise ValueError(f"GPU id {g} appears on machine {self.gpu_machine[g]} and {m.machine_id}")
                self.gpu_machine[g] = m.machine_id
        for i, m in enumerate(machines):
            if m.machine_id != i:
                raise ValueError(f"machine ids must be 0..n-1 in order; position {i} has id {m.machine_id}")
        self.gpu_units: dict[int, list[tuple]] = {g: [] for g in self.gpu_machine}
        self.max_gpus_per_machine = max((len(m.gpu_ids) for m in machines), default=0)
        self.total_gpus = len(self.gpu_machine)
        self.machine_idle = [len(m.gpu_ids) for m in machines]
        self.idle_by_count: list[set[int]] = [set() for _ in range(self.max_gpus_per_machine + 1)]
        for m in machines:
            self.idle_by_count[len(m.gpu_ids)].add(m.machine_id)
        self.total_idle = self.total_gpus
        self.jobs: dict = {}
        self.pending: OrderedDict = OrderedDict()
        self.suspended: OrderedDict = OrderedDict()
        self.running: OrderedDict = OrderedDict()
        self.pair_rates: dict[tuple[str, str], PairRate] = {}
        self.packed: set = set()   # jobs running packed with a partner (both members)
        self.spread: set = set()   # jobs on more machines than their size needs (what consolidation looks at)
        # Type pairs known not to fit together in one GPU's memory (or not to be packable at all).
        self.no_fit: set[tuple[str, str]] = set()
        self._short_of: dict[float, frozenset] = {}

    def machines_short_of(self, mem_gib: float | None) -> frozenset:
        """Machines whose smallest GPU holds less than `mem_gib` (none when a job's memory is not known)."""
        if mem_gib is None:
            return frozenset()
        short = self._short_of.get(mem_gib)
        if short is None:
            short = self._short_of[mem_gib] = frozenset(m.machine_id for m in self.machines if m.gpu_mem_gib < mem_gib)
        return short

    # ---- reading helpers for policies ---------------------------------------------------------------------
    def idle_gpus(self, machine_id: int) -> list[int]:
        units = self.gpu_units
        return [g for g in self.machines[machine_id].gpu_ids if not units[g]]

    def machines_of(self, gpus) -> set[int]:
        gm = self.gpu_machine
        return {gm[g] for g in gpus}

    def pair_rate(self, type_a: str, type_b: str) -> PairRate | None:
        """Measured rates of type_a and type_b packed together (rate of a first), or None if never measured."""
        pr = self.pair_rates.get((type_a, type_b))
        if pr is not None:
            return pr
        pr = self.pair_rates.get((type_b, type_a))
        if pr is not None:
            return PairRate(pr.rate_b, pr.rate_a)
        return None

    def pair_fits(self, a: JobView, b: JobView) -> bool:
        """Whether two jobs may share one GPU's memory: by measured peaks when both are known, else by type (and
        never when the one known is already more than the GPU holds)."""
        known = [j.mem_gib for j in (a, b) if j.mem_gib is not None]
        if known and a.gpus + b.gpus:
            mem = min(self.machines[self.gpu_machine[g]].gpu_mem_gib for g in a.gpus + b.gpus)
            if sum(known) > mem:
                return False
            if len(known) == 2:
                return True
        return (a.job_type, b.job_type) not in self.no_fit and (b.job_type, a.job_type) not in self.no_fit

    def units_on(self, gpus) -> int:
        """The deepest time-slicing among `gpus` (0 if all idle)."""
        return max((len(self.gpu_units[g]) for g in gpus), default=0)

    # ---- mutation, for the snapshot's owner only ----------------------------------------------------------
    def add_job(self, job: JobView) -> None:
        if job.job_id in self.jobs:
            raise ValueError(f"job {job.job_id!r} is already in the snapshot")
        self.jobs[job.job_id] = job
        self._index_state(job)

    def remove_job(self, job_id) -> JobView:
        job = self.jobs.pop(job_id)
        if job.gpus:
            self.detach(job)
        self._unindex_state(job)
        return job

    def set_state(self, job: JobView, state: JobState) -> None:
        self._unindex_state(job)
        job.state = state
        self._index_state(job)

    def _index_state(self, job: JobView) -> None:
        {JobState.PENDING: self.pending, JobState.SUSPENDED: self.suspended,
         JobState.RUNNING: self.running}[job.state][job.job_id] = None

    def _unindex_state(self, job: JobView) -> None:
        {JobState.PENDING: self.pending, JobState.SUSPENDED: self.suspended,
         JobState.RUNNING: self.running}[job.state].pop(job.job_id, None)

    def attach(self, job: JobView, gpus: tuple, partner: JobView | None = None) -> None:
        """Put `job` on `gpus`: as its own unit, or into `partner`'s unit (a pack)."""
        units = self.gpu_units
        for g in gpus:
            if partner is None:
                was_idle = not units[g]
                units[g].append((job.job_id,))
                if was_idle:
                    self._idle_change(self.gpu_machine[g], -1)
            else:
                lst = units[g]
                i = lst.index((partner.job_id,))
                lst[i] = (partner.job_id, job.job_id)
        job.gpus = tuple(gpus)
        if len(gpus) >= 2 and len(self.machines_of(gpus)) > -(-len(gpus) // self.max_gpus_per_machine):
            self.spread.add(job.job_id)
        if partner is not None:
            job.packed_with = partner.job_id
            partner.packed_with = job.job_id
            self.packed.add(job.job_id)
            self.packed.add(partner.job_id)

    def detach(self, job: JobView) -> None:
        """Take `job` off its GPUs; a pack partner stays as a unit of its own."""
        units = self.gpu_units
        jid = job.job_id
        for g in job.gpus:
            lst = units[g]
            for i, u in enumerate(lst):
                if jid in u:
                    if len(u) == 1:
                        del lst[i]
                        if not lst:
                            self._idle_change(self.gpu_machine[g], +1)
                    else:
                        lst[i] = tuple(x for x in u if x != jid)
                    break
            else:
                raise AssertionError(f"job {jid!r} is not on GPU {g}")
        if job.packed_with is not None:
            partner = self.jobs.get(job.packed_with)
            if partner is not None:
                partner.packed_with = None
            self.packed.discard(job.packed_with)
            self.packed.discard(jid)
            job.packed_with = None
        job.gpus = ()
        self.spread.discard(jid)

    def split_pack(self, job: JobView) -> None:
        """Turn `job`'s pack into two time-sliced units on the same GPUs."""
        partner = self.jobs[job.packed_with]
        for g in job.gpus:
            lst = self.gpu_units[g]
            i = next(i for i, u in enumerate(lst) if job.job_id in u)
            lst[i] = (partner.job_id,)
            lst.append((job.job_id,))
        job.packed_with = None
        partner.packed_with = None
        self.packed.discard(job.job_id)
        self.packed.discard(partner.job_id)

    def _idle_change(self, m: int, delta: int) -> None:
        k = self.machine_idle[m]
        self.idle_by_count[k].discard(m)
        k += delta
        self.machine_idle[m] = k
        self.idle_by_count[k].add(m)
        self.total_idle += delta
