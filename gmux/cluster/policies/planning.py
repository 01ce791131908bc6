"""A scratch overlay on a Snapshot, for policies that plan several moves in one decision.

A policy that suspends a job to make room for another must see the freed GPUs as idle before it has told anyone;
`Plan` records tentative unit-count changes per GPU over the (read-only) snapshot and collects the actions, so
the snapshot itself is never touched. Placement searches here cost O(GPUs per machine + machines changed in this
plan), because they start from the snapshot's idle-count index.
"""
from __future__ import annotations

from .api import JobState, Migrate, Pack, Place, Resume, Suspend, Unpack
from .snapshot import Snapshot


class Plan:
    def __init__(self, snap: Snapshot):
        self.snap = snap
        self.actions: list = []
        self._unit_delta: dict[int, int] = {}    # GPU -> change in its unit count
        self._idle_delta: dict[int, int] = {}    # machine -> change in its idle-GPU count
        self.moved: set = set()                  # jobs already given an action in this plan
        self._left_pack: set = set()             # packed jobs that left their unit to the partner

    def copy(self) -> "Plan":
        """A trial plan: change it freely, then `adopt` it or drop it."""
        t = Plan(self.snap)
        t.actions = list(self.actions)
        t._unit_delta = dict(self._unit_delta)
        t._idle_delta = dict(self._idle_delta)
        t.moved = set(self.moved)
        t._left_pack = set(self._left_pack)
        return t

    def adopt(self, trial: "Plan") -> None:
        self.actions, self._unit_delta, self._idle_delta = trial.actions, trial._unit_delta, trial._idle_delta
        self.moved, self._left_pack = trial.moved, trial._left_pack

    # ---- tentative view -----------------------------------------------------------------------------------
    def units(self, g: int) -> int:
        return len(self.snap.gpu_units[g]) + self._unit_delta.get(g, 0)

    def idle_count(self, m: int) -> int:
        return self.snap.machine_idle[m] + self._idle_delta.get(m, 0)

    @property
    def total_idle(self) -> int:
        return self.snap.total_idle + sum(self._idle_delta.values())

    def idle_on(self, m: int) -> list[int]:
        return [g for g in self.snap.machines[m].gpu_ids if self.units(g) == 0]

    def max_idle_on_a_machine(self) -> int:
        best = 0
        ibc = self.snap.idle_by_count
        for k in range(len(ibc) - 1, 0, -1):
            if any(m not in self._idle_delta for m in ibc[k]):
                best = k
                break
        for m in self._idle_delta:
            best = max(best, self.idle_count(m))
        return best

    def machines_with_idle(self, k: int):
        """Machines with exactly k idle GPUs in this plan's view."""
        for m in self.snap.idle_by_count[k]:
            if m not in self._idle_delta:
                yield m
        for m in self._idle_delta:
            if self.idle_count(m) == k:
                yield m

    def best_fit_machine(self, n: int, prefer=None, exclude=(), mem_gib: float | None = None) -> int | None:
        """The machine with the fewest idle GPUs that still has n (keeps big holes for big jobs).

        `prefer(m)` -> bool picks among machines first (Gandiva's affinity); machines in `exclude`, and those whose
        GPUs hold less than `mem_gib`, are skipped."""
        short = self.snap.machines_short_of(mem_gib)
        if short:
            exclude = short.union(exclude)
        fallback = None
        for k in range(n, self.snap.max_gpus_per_machine + 1):
            for m in self.machines_with_idle(k):
                if m in exclude:
                    continue
                if prefer is None or prefer(m):
                    return m
                if fallback is None:
                    fallback = m
        return fallback

    def find_gpus(self, n: int, prefer=None, spread: bool = False, mem_gib: float | None = None) -> tuple | None:
        """Idle GPUs for an n-GPU gang job, consolidated on as few machines as possible; None if there are none.

        Up to a machine's size a job goes on one machine; larger jobs take whole idle machines plus a best-fit
        remainder. With `spread`, a job that cannot be consolidated takes idle GPUs wherever they are (slower:
        the simulator charges the measured unconsolidated rate), most-idle machines first. Never on a machine
        whose GPUs hold less than `mem_gib` (a job's measured or requested memory per GPU, when known): it would
        fail there at every try."""
        per = self.snap.max_gpus_per_machine
        if per == 0:
            return None              # no machine up (or none with GPUs): nowhere to place anything
        short = self.snap.machines_short_of(mem_gib)
        if n <= per:
            m = self.best_fit_machine(n, prefer, mem_gib=mem_gib)
            if m is not None:
                return tuple(self.idle_on(m)[:n])
        else:
            need_whole, rest = divmod(n, per)
            whole = []
            for m in self.machines_with_idle(per):
                if len(whole) == need_whole:
                    break
                if m not in short:
                    whole.append(m)
            if len(whole) == need_whole:
                gpus = [g for m in whole for g in self.idle_on(m)]
                if rest == 0:
                    return tuple(gpus)
                m = self.best_fit_machine(rest, exclude=set(whole), mem_gib=mem_gib)
                if m is not None:
                    return tuple(gpus + self.idle_on(m)[:rest])
        if spread and self.total_idle >= n:
            order = sorted((m for m in range(len(self.snap.machines)) if m not in short),
                           key=lambda m: -self.idle_count(m))
            gpus = []
            for m in order:
                if self.idle_count(m) == 0:
                    break
                gpus.extend(self.idle_on(m)[: n - len(gpus)])
                if len(gpus) == n:
                    return tuple(gpus)
        return None

    # ---- recording moves ----------------------------------------------------------------------------------
    def _occupy(self, gpus) -> None:
        gm = self.snap.gpu_machine
        for g in gpus:
            if self.units(g) == 0:
                m = gm[g]
                self._idle_delta[m] = self._idle_delta.get(m, 0) - 1
            self._unit_delta[g] = self._unit_delta.get(g, 0) + 1

    def _vacate(self, job) -> None:
        """Remove job's unit from its GPUs in the tentative view (a packed job leaves its partner's unit)."""
        if job.packed_with is not None and job.packed_with not in self._left_pack:
            self._left_pack.add(job.job_id)    # the partner keeps the unit
            return
        gm = self.snap.gpu_machine
        for g in job.gpus:
            self._unit_delta[g] = self._unit_delta.get(g, 0) - 1
            if self.units(g) == 0:
                m = gm[g]
                self._idle_delta[m] = self._idle_delta.get(m, 0) + 1

    def place(self, job, gpus) -> None:
        self._occupy(gpus)
        self.moved.add(job.job_id)
        if job.state is JobState.PENDING:
            self.actions.append(Place(job.job_id, tuple(gpus)))
        else:
            self.actions.append(Resume(job.job_id, tuple(gpus)))

    def suspend(self, job) -> None:
        self._vacate(job)
        self.moved.add(job.job_id)
        self.actions.append(Suspend(job.job_id))

    def migrate(self, job, gpus) -> None:
        self._vacate(job)
        self._occupy(gpus)
        self.moved.add(job.job_id)
        self.actions.append(Migrate(job.job_id, tuple(gpus)))

    def pack(self, job, partner) -> None:
        self.moved.add(job.job_id)
        self.moved.add(partner.job_id)
        self.actions.append(Pack(job.job_id, partner.job_id))

    def unpack(self, job) -> None:
        for g in job.gpus:
            self._unit_delta[g] = self._unit_delta.get(g, 0) + 1
        self.moved.add(job.job_id)
        self.actions.append(Unpack(job.job_id))
