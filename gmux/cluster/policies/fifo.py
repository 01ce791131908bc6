"""FIFO: the YARN-style baseline of the papers. No sharing, no preemption, strict arrival order.

The head of the queue blocks everything behind it until it fits (no backfilling): that is what "first in,
first out" promises a user, and what the published FIFO baselines model.
"""
from __future__ import annotations

from .api import Event, Policy
from .planning import Plan


class FifoPolicy(Policy):
    name = "fifo"

    def decide(self, snap, event: Event) -> list:
        if not snap.pending or snap.total_idle == 0:
            return []
        plan = Plan(snap)
        for jid in snap.pending:
            job = snap.jobs[jid]
            gpus = plan.find_gpus(job.num_gpus)
            if gpus is None:
                break
            plan.place(job, gpus)
        return plan.actions
