"""Gandiva (Xiao et al., OSDI'18), as a policy over the common interface.

What it follows, by section of the paper:
- Placement (§5, "Scheduling policy"): a job goes consolidated onto one machine when it fits one, preferring
  machines that already run jobs of its GPU count (Gandiva's *affinity*: machines partitioned by job size so
  multi-GPU jobs find whole machines), then empty ones, best fit; a job larger than a machine takes whole
  machines. Waiting jobs are served in arrival order.
- Migration (§3.3, §5): when a job finds enough idle GPUs but no machine with room, one machine is
  *defragmented* by migrating up to `defrag_moves` small jobs off it. When GPUs free up, jobs spread over more
  machines than their size needs are *consolidated* (any size, whole machines for the large ones), and jobs
  that share a GPU move to idle GPUs (*de-sharing*), in that order and only after waiting jobs were served.
- Over-subscription by time-slicing and packing (§3.1, §3.2, §5): when nothing fits, a job shares the
  least-shared GPU set of a running job of its own size (affinity): packed with it when the pair fits in
  memory and is not known to lose, else time-sliced (suspend-resume every 60 s quantum), at most `max_units`
  deep. Every job makes progress soon after it arrives, the early feedback Gandiva is built for.
- Introspection (§3.4): a pack runs for a measurement window; if the measured rates of the pair sum to less
  than 1 + `pack_margin`, it is undone (the two are time-sliced instead) and the type pair is not packed again.
- Grow-shrink (§3.5): elastic jobs take idle GPUs on their machine while nobody waits and give them back when
  someone does.

Where it departs:
- Relaxed placement: a job that fits no machine but finds enough idle GPUs in scattered holes starts spread over
  them (at the measured unconsolidated rate) rather than time-slicing on busy GPUs, and consolidation puts it
  together as soon as a machine has room. The paper relaxes affinity before it waits; we relax locality too,
  so that idle GPUs are never left idle beside a waiting job.
- A job spread over machines is never shared (packed or time-sliced with): that would keep it spread, as a
  shared job is moved only by de-sharing.
- Defragmentation only clears room on one machine (jobs of at most a machine's GPUs); a job larger than a
  machine waits for whole machines, spreads, or time-slices.
- Gandiva's scheduler is work-conserving and FIFO among waiting jobs; it has no notion of job priority, so
  nothing is ever suspended to host memory except by time-slicing.
"""
from __future__ import annotations

from .api import Event, EventKind, Policy, require
from .planning import Plan
from .sharing import (consolidate, defragment_for, deshare, grow_elastic, place_consolidated, share_targets,
                      shrink_elastic, waiting_in_order)


class GandivaPolicy(Policy):
    name = "gandiva"
    preemptive = True

    def __init__(self, max_units: int = 4, pack_margin: float = 0.1, pack: bool = True, migrate: bool = True,
                 grow_shrink: bool = True, defrag_moves: int = 4):
        require(self.name, max_units=(max_units, max_units >= 1, ">= 1"),
                pack_margin=(pack_margin, pack_margin >= 0, ">= 0"),
                defrag_moves=(defrag_moves, defrag_moves >= 0, ">= 0"))
        self.max_units = max_units
        self.pack_margin = pack_margin
        self.pack = pack
        self.migrate = migrate
        self.grow_shrink = grow_shrink
        self.defrag_moves = defrag_moves
        self.losing_pairs: set = set()     # frozenset({type_a, type_b}) measured not to beat time-slicing

    def describe(self) -> dict:
        return {"name": self.name, "max_units": self.max_units, "pack_margin": self.pack_margin, "pack": self.pack,
                "migrate": self.migrate, "grow_shrink": self.grow_shrink, "defrag_moves": self.defrag_moves}

    def decide(self, snap, event: Event) -> list:
        plan = Plan(snap)
        if event.kind is EventKind.MEASUREMENT:
            self._introspect(snap, plan, event)
        self._serve(snap, plan)
        if self.migrate and plan.total_idle:
            # Waiting jobs had the idle GPUs first; what is left puts spread jobs together, then un-shares.
            consolidate(snap, plan)
            if plan.total_idle:
                deshare(snap, plan)
        if self.grow_shrink:
            waiting = (j for q in (snap.pending, snap.suspended) for j in q)
            if not any(j not in plan.moved for j in waiting):
                grow_elastic(snap, plan)
        return plan.actions

    def _introspect(self, snap, plan: Plan, event: Event) -> None:
        a = snap.jobs.get(event.job_id)
        b = snap.jobs.get(event.key)
        if a is None or b is None or a.packed_with != b.job_id:
            return
        pr = snap.pair_rate(a.job_type, b.job_type)
        if pr is not None and pr.gain < 1.0 + self.pack_margin:
            self.losing_pairs.add(frozenset((a.job_type, b.job_type)))
            plan.unpack(a)

    def may_pack(self, snap, job, partner) -> bool:
        return (self.pack and partner.packed_with is None and snap.pair_fits(job, partner)
                and frozenset((job.job_type, partner.job_type)) not in self.losing_pairs)

    def _serve(self, snap, plan: Plan) -> None:
        """Give every waiting job, oldest first, idle GPUs or a share of busy ones. Once one could have neither,
        no younger job joins a share (it may still take idle GPUs): a share keeps its GPUs from ever going idle,
        and narrow jobs behind a stream of wide ones sharing every GPU waited for all of them (20 s jobs waited
        ~400,000 s on a 64-GPU cluster, Gandiva's average JCT 2.3x FIFO's)."""
        failed_sizes: set = set()
        shrunk = False
        queue = list(waiting_in_order(snap))
        for pos, job in enumerate(queue):
            n = job.num_gpus
            size = (n, snap.machines_short_of(job.mem_gib))    # (a job too large for some machines fails alone)
            if size in failed_sizes or job.job_id in plan.moved:
                continue
            gpus = place_consolidated(snap, plan, job)
            if gpus is None and self.migrate and n <= snap.max_gpus_per_machine:
                gpus = defragment_for(snap, plan, n, self.defrag_moves, mem_gib=job.mem_gib)
            if gpus is None and self.grow_shrink and not shrunk:
                shrunk = True
                if shrink_elastic(snap, plan, n - plan.total_idle if plan.total_idle < n else n):
                    gpus = place_consolidated(snap, plan, job)
            if gpus is None and self.migrate:
                gpus = plan.find_gpus(n, spread=True, mem_gib=job.mem_gib)   # relaxed locality; consolidate() undoes it
            if gpus is not None:
                if job.elastic and self.grow_shrink and pos == len(queue) - 1:
                    gpus = self._grown(snap, plan, job, gpus)
                plan.place(job, gpus)
                continue
            if failed_sizes or not self._share(snap, plan, job):
                failed_sizes.add(size)
                if len(failed_sizes) >= 10:
                    break

    @staticmethod
    def _grown(snap, plan: Plan, job, gpus: tuple) -> tuple:
        """An elastic job that is the last one waiting starts with the idle GPUs beside it, up to its maximum."""
        ms = snap.machines_of(gpus)
        if len(ms) != 1:
            return gpus
        extra = [g for g in plan.idle_on(next(iter(ms))) if g not in gpus]
        return tuple(gpus) + tuple(extra[: job.max_gpus - len(gpus)])

    def _share(self, snap, plan: Plan, job) -> bool:
        targets = share_targets(snap, plan, job, self.max_units)
        if not targets:
            return False
        for t in targets:
            if max(plan.units(g) for g in t.gpus) == 1 and self.may_pack(snap, job, t):
                plan.pack(job, t)
                return True
        t = targets[0]
        plan.place(job, t.gpus)
        return True
