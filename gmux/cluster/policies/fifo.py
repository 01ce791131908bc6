"""FIFO, strict and backfilling: the YARN-style baselines of the papers. No sharing, no preemption.

`fifo`: the head of the queue blocks everything behind it until it fits (no backfilling). That is what "first
in, first out" promises a user, and what the published FIFO baselines (Tiresias §6, HeliosArtifact) model.

`fifo-bf`: arrival order, but a job that does not fit does not block later jobs that do: each waiting job, oldest
first, takes consolidated idle GPUs if it finds them. This is the greedy backfilling of YARN's capacity scheduler
(Philly's own scheduler was YARN-based) and of Slurm's backfill pass. Where it departs from Slurm: Slurm's
backfill (EASY) holds a reservation for the head job so that backfilled jobs never delay it, which needs
user-given time limits; the trace has none, so, like YARN-CS, it reserves nothing and a large job can be
overtaken for as long as small ones keep fitting.
"""
from __future__ import annotations

from .api import Event, Policy
from .planning import Plan
from .priority import PriorityPolicy


class FifoPolicy(Policy):
    name = "fifo"

    def decide(self, snap, event: Event) -> list:
        if not snap.pending or snap.total_idle == 0:
            return []
        plan = Plan(snap)
        for jid in snap.pending:
            job = snap.jobs[jid]
            gpus = plan.find_gpus(job.num_gpus, mem_gib=job.mem_gib)
            if gpus is None:
                break
            plan.place(job, gpus)
        return plan.actions


class FifoBackfillPolicy(PriorityPolicy):
    """Arrival order; every waiting job that fits the idle GPUs starts (PriorityPolicy's backfill pass)."""
    name = "fifo-bf"

    def waiting_key(self, job):
        return job.submit_time
