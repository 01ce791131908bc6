"""Moves shared by the GPU-sharing policies (gandiva, gmux): finding a GPU set to share, undoing sharing when
GPUs free up, defragmenting a machine for a waiting job, consolidating spread jobs, growing and shrinking
elastic jobs. Each function reads the snapshot, records moves in a Plan, and returns what it did.
"""
from __future__ import annotations

from .api import Grow, Shrink
from .planning import Plan


def machine_affinity(snap, m: int):
    """The GPU count of the jobs on machine m (Gandiva groups jobs of one size per machine); None if empty."""
    units = snap.gpu_units
    for g in snap.machines[m].gpu_ids:
        if units[g]:
            job = snap.jobs.get(units[g][0][0])
            if job is not None:
                return job.num_gpus
    return None


def place_consolidated(snap, plan: Plan, job, spread: bool = False):
    """Idle GPUs for `job`, preferring machines already used by jobs of its size (affinity), then empty ones."""
    n = job.num_gpus

    def prefer(m):
        a = machine_affinity(snap, m)
        return a == n

    gpus = plan.find_gpus(n, prefer=prefer, mem_gib=job.mem_gib)
    if gpus is None and spread:
        gpus = plan.find_gpus(n, spread=True, mem_gib=job.mem_gib)
    return gpus


def share_targets(snap, plan: Plan, job, max_units: int):
    """Running jobs of the same size whose GPU set `job` could join, least-shared first (ties: oldest).

    Not a job spread over more machines than its size needs: sharing its GPUs would pin it spread, since
    consolidate() leaves shared jobs to deshare(), which needs a whole idle home for the one it moves (a 4-GPU
    pack stayed over three 2-GPU machines beside two machines' worth of room)."""
    n = job.num_gpus
    if snap.max_gpus_per_machine == 0:
        return []
    need = -(-n // snap.max_gpus_per_machine)
    short = snap.machines_short_of(job.mem_gib)
    out = []
    for jid in snap.running:
        if jid in plan.moved:
            continue
        other = snap.jobs[jid]
        if len(other.gpus) != n or len(snap.machines_of(other.gpus)) > need:
            continue
        if short and not short.isdisjoint(snap.machines_of(other.gpus)):
            continue
        depth = max(plan.units(g) for g in other.gpus)
        if depth >= max_units:
            continue
        out.append((depth, other.packed_with is not None, other.submit_time, jid))
    out.sort()
    return [snap.jobs[t[3]] for t in out]


def deshare(snap, plan: Plan, limit: int | None = None, packed_only: bool = False) -> int:
    """Move time-sliced or packed jobs onto idle GPUs, deepest sharing first. Returns how many moved.

    `packed_only`: the caller never time-slices, so only packed jobs (an index of the snapshot) are looked at."""
    if plan.total_idle == 0:
        return 0
    cands = []
    for jid in (snap.packed if packed_only else snap.running):
        if jid in plan.moved:
            continue
        job = snap.jobs[jid]
        depth = max(plan.units(g) for g in job.gpus)
        if depth > 1 or job.packed_with is not None:
            # Newest first within a set: it has run least there, so moving it loses least locality.
            cands.append((-depth, job.packed_with is None, -job.submit_time, jid))
    cands.sort()
    moved = 0
    for _, _, _, jid in cands:
        if limit is not None and moved >= limit:
            break
        job = snap.jobs[jid]
        if jid in plan.moved or (job.packed_with is not None and job.packed_with in plan.moved):
            continue
        depth = max(plan.units(g) for g in job.gpus)
        if depth <= 1 and job.packed_with is None:
            continue
        gpus = place_consolidated(snap, plan, job)
        if gpus is None:
            continue
        plan.migrate(job, gpus)
        moved += 1
    return moved


def defragment_for(snap, plan: Plan, n: int, max_moves: int = 4, mem_gib: float | None = None) -> tuple | None:
    """Make n idle GPUs on one machine by migrating small jobs off it to idle GPUs elsewhere.

    Tries machines with the most idle GPUs first and takes the first whose clearing works out in a trial plan;
    moves only jobs that run alone, live entirely on that machine and are smaller than n, at most `max_moves`
    of them (each a move to another machine: seconds of held GPUs and of stall, see sim/costs.py), and not on
    a machine whose GPUs hold less than `mem_gib`. Returns the GPUs made idle, or None (plan untouched)."""
    per = snap.max_gpus_per_machine
    if n > per or plan.total_idle < n:
        return None
    units = snap.gpu_units
    short = snap.machines_short_of(mem_gib)
    # machines short of n by 1..max_moves idle GPUs, most idle first (from the plan's idle index: a scan of every
    # machine here was most of a decision's time on a large cluster)
    order = (m for k in range(n - 1, max(n - max_moves, 0) - 1, -1) for m in sorted(plan.machines_with_idle(k)))
    for m in order:
        if m in short:
            continue
        movable = {}
        for g in snap.machines[m].gpu_ids:
            if plan.units(g) != 1 or len(units[g]) != 1 or len(units[g][0]) != 1:
                continue
            j = snap.jobs[units[g][0][0]]
            if j.job_id in plan.moved or len(j.gpus) >= n or snap.machines_of(j.gpus) != {m}:
                continue
            if any(plan.units(x) != 1 for x in j.gpus):
                continue
            movable[j.job_id] = j
        need = n - plan.idle_count(m)
        trial = plan.copy()
        freed = 0
        for j in sorted(movable.values(), key=lambda j: (len(j.gpus), j.submit_time)):
            if freed >= need:
                break
            dest = trial.best_fit_machine(len(j.gpus), exclude={m}, mem_gib=j.mem_gib)
            if dest is None:
                break
            trial.migrate(j, tuple(trial.idle_on(dest)[: len(j.gpus)]))
            freed += len(j.gpus)
        if trial.idle_count(m) >= n:
            plan.adopt(trial)
            return tuple(plan.idle_on(m)[:n])
    return None


def consolidate(snap, plan: Plan, limit: int = 4) -> int:
    """Migrate multi-GPU jobs spread over more machines than they need onto as few as their size allows, when
    that many machines have room, counting the GPUs a job already holds (only the stragglers really move).

    Jobs of any size: a job larger than a machine goes to whole machines plus a best-fit remainder. Jobs that
    share their GPUs (time-sliced or packed) are left alone: deshare() moves them."""
    moved = 0
    spread = snap.spread
    if not spread:
        return 0
    for jid in snap.running:
        if moved >= limit:
            break
        if jid not in spread or jid in plan.moved:
            continue
        job = snap.jobs[jid]
        n = len(job.gpus)
        if job.packed_with is not None or any(plan.units(g) != 1 for g in job.gpus):
            continue
        ms = snap.machines_of(job.gpus)
        trial = plan.copy()
        trial._vacate(job)           # its own GPUs count as room
        own = set(ms)
        target = trial.find_gpus(n, prefer=lambda m: m in own, mem_gib=job.mem_gib)
        if target is None or len(snap.machines_of(target)) >= len(ms):
            continue
        plan.migrate(job, target)
        moved += 1
    return moved


def grow_elastic(snap, plan: Plan) -> int:
    """Give idle GPUs on an elastic job's own machine to it, up to its maximum (only when nobody waits)."""
    grown = 0
    for jid in snap.running:
        job = snap.jobs[jid]
        if not job.elastic or jid in plan.moved or job.packed_with is not None:
            continue
        if len(job.gpus) >= job.max_gpus or max(plan.units(g) for g in job.gpus) > 1:
            continue
        ms = snap.machines_of(job.gpus)
        if len(ms) != 1:
            continue
        m = next(iter(ms))
        extra = plan.idle_on(m)[: job.max_gpus - len(job.gpus)]
        if not extra:
            continue
        plan._occupy(extra)
        plan.moved.add(jid)
        plan.actions.append(Grow(jid, tuple(job.gpus) + tuple(extra)))
        grown += 1
    return grown


def shrink_elastic(snap, plan: Plan, want: int) -> int:
    """Take GPUs back from grown elastic jobs (down to their request) until `want` more GPUs are idle."""
    freed = 0
    for jid in snap.running:
        if freed >= want:
            break
        job = snap.jobs[jid]
        if not job.elastic or jid in plan.moved or len(job.gpus) <= job.num_gpus:
            continue
        keep = tuple(job.gpus[: job.num_gpus])
        give = job.gpus[job.num_gpus:]
        gm = snap.gpu_machine
        for g in give:
            plan._unit_delta[g] = plan._unit_delta.get(g, 0) - 1
            if plan.units(g) == 0:
                plan._idle_delta[gm[g]] = plan._idle_delta.get(gm[g], 0) + 1
        plan.moved.add(jid)
        plan.actions.append(Shrink(jid, keep))
        freed += len(give)
    return freed


def waiting_in_order(snap):
    """Suspended jobs (oldest suspension first), then pending ones in arrival order."""
    for jid in snap.suspended:
        yield snap.jobs[jid]
    for jid in snap.pending:
        yield snap.jobs[jid]


__all__ = ["machine_affinity", "place_consolidated", "share_targets", "deshare", "defragment_for", "consolidate",
           "grow_elastic", "shrink_elastic", "waiting_in_order"]
