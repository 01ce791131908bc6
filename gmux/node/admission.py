"""gmuxd's admission and placement: which GPU a new job gets, whole GPUs for multi-GPU jobs and gangs (held
exclusively), the queue of jobs waiting for GPUs, and defragmentation (moving single-GPU jobs to free whole GPUs).

A multi-GPU job or gang rank that the user suspends gives its GPUs back once it has suspended ("parked"):
other jobs may use them meanwhile. Resumed, it waits in the queue for those same GPUs (its process was started
on them), and defragmentation moves movable jobs off them as it would for any waiting unit.

A single-GPU job is placed at once when a GPU can take it. A multi-GPU job, and a gang's ranks, wait in the
queue until enough whole GPUs are free; each tick tries the queue again and, if GPUs are missing, plans moves
of movable jobs, reserves the GPUs being freed (no new job lands on them) and logs the plan with its numbers.
A gang's ranks are one unit: placed together, suspended, resumed and killed together.

An object the daemon holds (composed, not mixed in): it reads the machine's GPUs, the job table and the
slicers, owns the queue, the reservations and the defragmentation under way, and asks the daemon for the rest
through the narrow `Node` interface. The decisions themselves are the pure functions of gmux.node.placement.
"""
from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Optional, Protocol

from gmux.node import placement
from gmux.node.inventory import Gpu, gpu_list
from gmux.node.jobs import Job, gang_members
from gmux.node.slicer import Slicer
from gmux.node.store import Store
from gmux.util.sizes import format_size
from gmux.wire.server import Refused

log = logging.getLogger("gmux.daemon")

DEFRAG_RETRY_S = 2.0    # a defragmentation that has not freed its GPUs is planned again after this long


def _own_gpus(job: Job) -> list:
    """The GPUs a waiting job must have: those it gave back while suspended (its process waits there), else the
    one it is pinned to (none: any)."""
    return list(job.parked_gpus) or ([job.pinned] if job.pinned is not None else [])


def _pinned(members: list) -> tuple:
    """The GPUs a waiting unit must have."""
    return tuple(sorted({g for m in members for g in _own_gpus(m)}))


def _needed(units: list) -> dict:
    """unit -> the GPUs it must have, for the waiting units not held by their users (those take no GPU)."""
    return {unit: _pinned(members) for unit, members in units if not any(m.held for m in members)}


def _gpus(gpus: list) -> str:
    return f"GPU{'s' if len(gpus) > 1 else ''} {','.join(map(str, gpus))}"


class Node(Protocol):
    """What admission asks of the daemon."""

    def decide(self, gpu: Optional[int], kind: str, jobs: list, numbers: dict, text: str) -> None:
        """Logs a decision (the decision log, and gmuxd's log)."""

    def seat(self, job: Job, now: float) -> None:
        """The job, registered, joins the slicer of its GPU (job.gpu)."""

    def leave_gpu(self, job: Job, now: float) -> None:
        """The job leaves its GPU's slicer and packer (its GPU time is kept)."""

    def migrate(self, job: Job, gpu: int) -> None:
        """Moves a single-GPU job to `gpu` (at its next boundary, in its own process where it can);
        Refused if it cannot move now."""

    def moves_in_process(self, job: Job, gpu: int) -> bool:
        """Whether a move of the job to `gpu` is made in its own process (gmux.node.moves)."""

    def switch(self, slicer: Slicer, now: float) -> None:
        """Carries out what the GPU's slicer decides now (its suspends, resumes, stops and continues)."""


class Admission:
    def __init__(self, gpus: dict[int, Gpu], jobs: dict[str, Job], slicers: dict[int, Slicer], store: Store,
                 node: Node):
        self.gpus, self.jobs, self.slicers, self.store, self.node = gpus, jobs, slicers, store, node
        self.queue: list[str] = []            # admitted jobs without a GPU yet, in arrival order
        self.reserved: dict[int, str] = {}    # GPU -> the waiting multi-GPU job or gang it is being freed for
        self.defrag: Optional[dict] = None    # the defragmentation under way: unit, GPUs, moves, started at
        self._plan_at: dict[str, float] = {}  # unit -> when a defragmentation may next be planned for it
        self._wait_why: dict[str, str] = {}   # unit -> why it waits (logged when it changes)

    # --- the queue, as others see it ---
    def queued(self, job_id: str) -> bool:
        return job_id in self.queue

    def dequeue(self, job_id: str) -> None:
        if job_id in self.queue:
            self.queue.remove(job_id)

    def requeue(self, job: Job) -> None:
        """A re-attached job without its GPUs (after a daemon restart) waits again, its state as it was."""
        self.queue.append(job.id)

    def reserved_for(self, gpu: int) -> Optional[str]:
        """The waiting unit this GPU is being freed for, if any."""
        return self.reserved.get(gpu)

    def move_refusal(self, job: Job, gpu: int) -> Optional[str]:
        """Why `gpu` cannot take the single-GPU `job` moving there (None: it can): too small for its working set,
        or held (or being freed) for a multi-GPU job or gang, which it names. A GPU whose jobs are running is not
        refused: the job time-slices with them there, as a job admitted there would."""
        need = job.working_set() or 0
        if need > self.gpus[gpu].mem_total:
            return f"{job.id} needs {format_size(need)}, GPU {gpu} has {format_size(self.gpus[gpu].mem_total)}"
        # (named as the GPU table names them to every caller: its HELD BY column)
        holder = next((j for j in self.jobs.values() if not j.final and gpu in j.exclusive_gpus), None)
        if holder is not None:
            what = (f"rank {holder.gang['rank']} of gang {holder.gang['id']}" if holder.gang else
                    f"a job on {holder.gpus_wanted} GPUs")
            return f"GPU {gpu} is held by {holder.id} ({what}) to itself"
        if self.reserved.get(gpu):
            return f"GPU {gpu} is being freed for {self.reserved[gpu]}, which waits for GPUs to itself"
        return None

    def admit(self, job: Job, what: str) -> None:
        """Refuses what this machine can never run; otherwise places a single-GPU job now if a GPU can take it,
        or leaves job.gpu None: the job waits in the queue (multi-GPU jobs and gang ranks always start there)."""
        need = job.working_set() or 0
        pinned, n = job.pinned, len(self.gpus)
        here = gpu_list(self.gpus)
        if pinned is not None and pinned not in self.gpus:
            raise Refused(f"{what}: no GPU {pinned}; this machine has {here}")
        if job.gpus_wanted > n:
            raise Refused(f"{what}: the job asks for {job.gpus_wanted} GPUs; this machine has {n} ({here})")
        if job.gpus_wanted > 1 and job.gang is not None:
            raise Refused(f"{what}: a gang rank uses one GPU; give --gpus 1 (or leave it out) with --gang")
        if job.gpus_wanted > 1 and pinned is not None:
            raise Refused(f"{what}: --gpu pins a single-GPU job or a gang rank; a job asking for "
                          f"{job.gpus_wanted} GPUs is given them by gmuxd")
        fitting = [g for g in self.gpus.values() if g.mem_total >= need]
        if pinned is not None and self.gpus[pinned].mem_total < need:
            raise Refused(f"{what}: the job needs {format_size(need)}, GPU {pinned} has "
                          f"{format_size(self.gpus[pinned].mem_total)}")
        if not fitting:
            biggest = max(g.mem_total for g in self.gpus.values())
            raise Refused(f"{what}: the job needs {format_size(need)} but the largest GPU has "
                          f"{format_size(biggest)}; lower --mem or add a bigger GPU")
        if len(fitting) < job.gpus_wanted:
            raise Refused(f"{what}: the job asks for {job.gpus_wanted} GPUs of {format_size(need)}; only "
                          f"{len(fitting)} of this machine's GPUs are that big")
        if job.gang is not None:
            self._join_gang(job, what, len(fitting))
        job.gpu = None
        if not job.exclusive:
            job.gpu = placement.single_gpu(self._views(), need, pinned, keep_free=self._exclusive_waiting())

    def _join_gang(self, job: Job, what: str, fitting: int) -> None:
        g = job.gang
        peers = gang_members(self.jobs, g["id"])
        if peers:
            first = peers[0]
            if first.gang["size"] != g["size"]:
                raise Refused(f"{what}: gang {g['id']} has {first.gang['size']} ranks (so said rank "
                              f"{first.gang['rank']}, {first.id}); this rank says {g['size']}")
            same = [p for p in peers if p.gang["rank"] == g["rank"]]
            if same:
                raise Refused(f"{what}: rank {g['rank']} of gang {g['id']} is already registered ({same[0].id})")
            if job.pinned is not None and any(p.pinned == job.pinned for p in peers):
                other = next(p for p in peers if p.pinned == job.pinned)
                raise Refused(f"{what}: rank {g['rank']} of gang {g['id']} is pinned to GPU {job.pinned}, as is "
                              f"rank {other.gang['rank']} ({other.id}): each rank needs a GPU of its own")
        if job.pinned is None and g["size"] > fitting and what == "submit":
            # (a submitted gang's name is gmuxd's choice, not yet shown anywhere: the user's words are --ranks)
            raise Refused(f"{what}: --ranks {g['size']}: this machine has {fitting} GPU"
                          f"{'s' if fitting != 1 else ''} that can hold a rank, and each rank needs a GPU of its own")
        if job.pinned is None and g["size"] > fitting:
            raise Refused(f"{what}: gang {g['id']} has {g['size']} ranks and this machine {fitting} GPUs that "
                          f"hold one: each rank needs a GPU of its own (ranks of a gang spanning machines are "
                          f"pinned with --gpu)")

    def enqueue(self, job: Job) -> None:
        if job.id not in self.queue:
            self.queue.append(job.id)
        job.state = "waiting"
        job.detail = ("waiting for its gang's ranks and whole GPUs" if job.gang else
                      f"waiting for {job.gpus_wanted} GPUs to itself" if job.exclusive else
                      "waiting: every GPU it fits is held by a multi-GPU job or gang")

    def _exclusive_waiting(self) -> bool:
        return any(self.jobs[j].exclusive for j in self.queue)

    def _views(self) -> list:
        """The GPUs as the placement functions see them: who holds each exclusively, and which single-GPU
        jobs are on it (a moving job counts on its destination, and on its source until it has left)."""
        owner = {g: j.id for j in self.jobs.values() if not j.final for g in j.exclusive_gpus}
        occupants: dict[int, list] = {g: [] for g in self.gpus}
        for j in self.jobs.values():
            if j.final or j.exclusive:
                continue
            where = set()
            if j.target_gpu is not None:
                where.add(j.target_gpu)
            if j.gpu is not None and (j.id in self.slicers[j.gpu].entries or not j.registered):
                where.add(j.gpu)
            why_not = self._unmovable(j)
            moved = (j.mem_boundary or j.working_set() or 0) if j.started else 0
            for g in where:
                occupants[g].append(placement.Occupant(j.id, j.working_set() or 0, moved, not why_not, why_not,
                                                       j.weight))
        return [placement.GpuView(i, g.mem_total, occupants[i], owner.get(i), self.reserved.get(i))
                for i, g in sorted(self.gpus.items())]

    def _unmovable(self, j: Job) -> str:
        """Why the single-GPU job cannot be moved off its GPU to make room now ("": it can)."""
        return ("it is moving now" if j.target_gpu is not None else
                f"pinned to GPU {j.pinned} with --gpu" if j.pinned is not None else
                _not_restorable(j) if j.started and not j.migratable and not self.in_process(j) else
                # (its start is a resume that awaits its first boundary: one that reaches none waited "busy with a
                # resume" for good, as if that were a moment's work)
                "it has reached no boundary yet (it is moved at one)"
                if not j.started and j.gpu is not None and self.slicers[j.gpu].busy_with(j.id) == "resume" else
                f"busy with a {self.slicers[j.gpu].busy_with(j.id)}"
                if j.gpu is not None and self.slicers[j.gpu].busy_with(j.id) else "")

    def in_process(self, job: Job) -> bool:
        """Whether the job would move in its own process wherever it goes, so that it needs no restore in a new
        process (gmux.node.moves)."""
        return job.gpu is not None and all(self.node.moves_in_process(job, g) for g in self.gpus if g != job.gpu)

    def _units(self) -> list[tuple[str, list]]:
        """Waiting multi-GPU jobs and gangs, in arrival order: (name, jobs). A gang's waiting ranks are one unit
        once all its ranks are known here, placed all at once (a rank placed alone would wait in its first
        collective, holding its GPU, and two gangs pinned to the same GPUs, each given one, would wait for each
        other for good); until then a rank pinned with --gpu (a cluster scheduler placed it; its gang may span
        machines) is placed alone, on its GPU, and the others wait."""
        units, seen = [], set()
        for job_id in self.queue:
            job = self.jobs[job_id]
            if not job.exclusive:
                continue
            if job.gang is None:
                units.append((job.id, [job]))
                continue
            name = "gang " + job.gang["id"]
            if name in seen:
                continue
            seen.add(name)
            ranks = gang_members(self.jobs, job.gang["id"])
            waiting = [r for r in ranks if r.id in self.queue]
            if len(ranks) < job.gang["size"]:
                units.extend((r.id, [r]) for r in waiting if r.pinned is not None)
                for r in ranks:
                    if r.gpu is None and r.pinned is None:
                        r.detail = (f"waiting for gang {job.gang['id']}'s other ranks "
                                    f"({len(ranks)} of {job.gang['size']} registered)")
                continue
            units.append((name, waiting))
        return units

    def run(self, now: float) -> None:
        """Gives queued jobs their GPUs: single-GPU jobs wherever they fit, multi-GPU jobs and gangs whole GPUs
        when enough are free; otherwise it defragments (moves single-GPU jobs) to free them."""
        if not self.queue and not self.reserved:
            return
        units = self._units()
        names = {u for u, _ in units}
        self.reserved = {g: u for g, u in self.reserved.items() if u in names}
        self._plan_at = {u: t for u, t in self._plan_at.items() if u in names}
        self._wait_why = {u: w for u, w in self._wait_why.items() if u in names}
        if self.defrag is not None and self.defrag["unit"] not in names:
            self.defrag = None
        views = self._views()
        keep_free = self._exclusive_waiting()
        for job_id in list(self.queue):
            job = self.jobs[job_id]
            if job.exclusive:
                continue
            gpu = placement.single_gpu(views, job.working_set() or 0, (_own_gpus(job) or [None])[0], keep_free)
            if gpu is not None:
                self._grant([job], [gpu], now)
                views = self._views()
        wanted = _needed(units)
        for unit, members in units:
            if unit not in wanted:
                continue       # suspended by the user while waiting: it takes no GPU until resumed
            count = sum(m.gpus_wanted for m in members)
            need = max(m.working_set() or 0 for m in members)
            pinned = wanted[unit]
            got = placement.whole_gpus(views, unit, count, need, pinned)
            if got is not None:
                self._grant(members, got, now)
                self.node.decide(got[0], "exclusive", [m.id for m in members], {"gpus": got, "unit": unit},
                             f"{unit} gets GPU{'s' if len(got) > 1 else ''} {','.join(map(str, got))} to itself")
                self.reserved = {g: u for g, u in self.reserved.items() if u != unit}
                if self.defrag is not None and self.defrag["unit"] == unit:
                    self.defrag = None
                self._wait_why.pop(unit, None)
                views = self._views()
            else:
                keep_clear = tuple(g for u, gpus in wanted.items() if u != unit for g in gpus)
                self._defragment(unit, members, count, need, pinned, keep_clear, views, now)

    def _grant(self, members: list, gpus: list, now: float) -> None:
        """Each job gets its GPU (a multi-GPU job all of them); a registered one joins its GPU's slicer, which
        starts it; a submitted one whose process has not registered yet joins it when it does."""
        taken = {g for m in members for g in _own_gpus(m)}
        rest = [g for g in sorted(gpus) if g not in taken]
        for job in members:
            own = _own_gpus(job)
            if own:                # back on the GPUs its process was started on, or on its pinned one
                mine, job.parked_gpus = own, []
            else:
                mine, rest = rest[:job.gpus_wanted], rest[job.gpus_wanted:]
            job.gpu = mine[0]
            job.exclusive_gpus = list(mine) if job.exclusive else []
            if job.id in self.queue:
                self.queue.remove(job.id)
            job.detail = "" if job.registered else "starting"     # (its process has not registered yet)
            if job.registered:
                self.node.seat(job, now)
            self.store.save(job)

    def park_held(self, now: float) -> None:
        """A held multi-GPU job or gang rank that has suspended gives its GPUs back (its memory there is free),
        as does a held single-GPU job that cannot move (pinned, say: a cluster scheduler placed it, and
        suspended it for the gang) from a GPU that a waiting multi-GPU job or gang must have (pinned there, or
        parked there itself). Either resumes on its GPUs once they are free again."""
        wanted = {g for gpus in _needed(self._units() if self.queue else []).values() for g in gpus}
        waited_for = wanted | {g for j in self.queue for g in _pinned([self.jobs[j]]) if not self.jobs[j].held}
        for job in self.jobs.values():
            if job.final or not job.held or job.gpu not in self.slicers:
                continue
            if self._continue_to_boundary(job, waited_for if job.exclusive else wanted, now):
                continue
            if not job.exclusive_gpus and (job.exclusive or job.gpu not in wanted):
                continue
            slicer = self.slicers[job.gpu]
            if job.id not in slicer.entries or job.id in slicer.resident or slicer.busy_with(job.id):
                continue
            if not job.exclusive_gpus and not self._unmovable(job):
                continue      # defragmentation moves it instead, and it can resume at once where it goes
            gpus = sorted(job.exclusive_gpus) or [job.gpu]
            self.node.leave_gpu(job, now)
            job.parked_gpus, job.exclusive_gpus, job.gpu = gpus, [], None
            job.state, job.detail = "held", f"suspended; gave back {_gpus(gpus)} until `gmux resume`"
            self.store.save(job)
            self.node.decide(gpus[0], "park", [job.id], {"gpus": gpus},
                         f"{job.id} is suspended by the user: {_gpus(gpus)} free for other jobs until it is "
                         f"resumed (it resumes there)")

    def _continue_to_boundary(self, job: Job, wanted: set, now: float) -> bool:
        """A held job stopped before its boundary (past its suspend's deadline: it keeps its memory there) on a
        GPU that a waiting job must have is continued to its boundary (with its gang's other ranks, which meet
        it there), where it suspends and then parks. Whether it was. Not one stopped by a deadline it was given
        (a machine cut off from its scheduler: it must not train beside the copy started elsewhere)."""
        if not ({job.gpu, *job.exclusive_gpus} & wanted):
            return False
        unit = gang_members(self.jobs, job.gang["id"]) if job.gang else [job]
        entries = [(m, self.slicers[m.gpu].entries.get(m.id)) for m in unit if m.gpu in self.slicers]
        stopped = [(m, e) for m, e in entries if e is not None and e.stopped and not e.frozen and not e.to_boundary
                   and e.stop_by is None]
        for m, e in stopped:
            self.slicers[m.gpu].hold(m.id, to_boundary=True, in_place=e.in_place)
            self.node.switch(self.slicers[m.gpu], now)
        return bool(stopped)

    def unpark(self, job: Job) -> None:
        """A parked job the user resumes waits for its own GPUs."""
        self.enqueue(job)
        job.detail = f"waiting for {_gpus(job.parked_gpus)} back (its process runs there)"

    def _defragment(self, unit: str, members: list, count: int, need: int, pinned: tuple, keep_clear: tuple,
                    views: list, now: float) -> None:
        if self.defrag is not None:
            if self.defrag["unit"] != unit:
                for m in members:
                    m.detail = f"waiting for {count} GPUs to itself, after {self.defrag['unit']}"
                return
            moving = [mv.job for mv in self.defrag["moves"]
                      if not self.jobs[mv.job].final and self.jobs[mv.job].target_gpu is not None]
            if moving or now - self.defrag["t"] < DEFRAG_RETRY_S:
                return
            # The moves are over but the GPUs are not all free (a move was refused or failed, a job arrived):
            # plan again from what is true now.
            self.reserved = {g: u for g, u in self.reserved.items() if u != unit}
            self.defrag = None
            views = self._views()
        # Each waiting unit is planned for at most every DEFRAG_RETRY_S; one that cannot be helped does not
        # keep a later, smaller one from being planned for.
        if now < self._plan_at.get(unit, 0.0):
            return
        self._plan_at[unit] = now + DEFRAG_RETRY_S
        plan, why = placement.plan_defrag(views, unit, count, need, pinned, keep_clear)
        if plan is None:
            for m in members:
                m.detail = f"waiting for {count} GPUs to itself: {why}"[:300]
            if self._wait_why.get(unit) != why:
                self._wait_why[unit] = why
                self.node.decide(None, "wait", [m.id for m in members], {"unit": unit, "gpus": count, "mem": need},
                             f"{unit} waits for {count} GPUs to itself: {why}")
            return
        free = [v.index for v in views if v.index in plan.gpus and not v.occupants]
        for g in plan.gpus:
            self.reserved[g] = unit
        self.defrag = {"unit": unit, "gpus": plan.gpus, "moves": plan.moves, "t": now}
        self._wait_why.pop(unit, None)
        moves = "; ".join(f"{m.job} GPU {m.src}->{m.dst} ({format_size(m.bytes)})" for m in plan.moves)
        self.node.decide(None, "defrag", [m.job for m in plan.moves] + [m.id for m in members],
                     {"unit": unit, "need": count, "mem": need, "free": free, "gpus": plan.gpus,
                      "moves": [asdict(m) for m in plan.moves], "bytes": plan.bytes},
                     f"defragmenting for {unit}: {count} whole GPUs needed, {len(free)} free; freeing GPUs "
                     f"{','.join(map(str, plan.gpus))} by moving {len(plan.moves)} job(s), "
                     f"{format_size(plan.bytes)} in all: {moves or 'nothing to move'}")
        for m in members:
            m.detail = f"waiting for {count} GPUs to itself: moving {len(plan.moves)} job(s) off GPUs " \
                       f"{','.join(map(str, plan.gpus))}"
        for mv in plan.moves:
            try:
                self.node.migrate(self.jobs[mv.job], mv.dst)
            except Refused as e:   # busy this instant: the plan is made again if the GPUs do not come free
                log.info("defrag: %s", e)


def _not_restorable(j: Job) -> str:
    """Why a new process could not restore the job: what its reports say, else its transparent mode."""
    why = j.unmovable()
    return (f"it would not continue exactly in a new process: {why}" if why else
            "an unmodified script (transparent mode) cannot be restored in a new process")
