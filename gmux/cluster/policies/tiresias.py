"""Tiresias (Gu et al., NSDI'19): discretized two-dimensional least-attained-service (2D-LAS, §4.2).

A job's priority is its attained service in GPU-seconds (GPUs held x time: the "two dimensions"), discretized
into K queues by `thresholds`: queue 0 below the first threshold, and so on. Lower queues come first; inside a
queue, jobs keep arrival order (FIFO), and a waiting job never preempts a running one of its own queue: only a
job of a higher-priority queue does, by suspend (§4.2, "discretized 2D-LAS" with FIFO within a queue, which is
what keeps jobs of nearly equal service from thrashing). A job is demoted when its service crosses a threshold:
the policy asks for a timer at that instant.

Parameters: the published ones of the authors' simulator for the `dlas-gpu` schedule (SymbioticLab/Tiresias,
simulator/jobs.py and run_sim.py): three queues, limits 3,250 and 7,200 GPU-seconds, service in GPU-seconds,
the starvation knob (promotion of jobs that waited longer than STARVE x their run time) off, as in `dlas-gpu`.

Where it departs: placement is consolidated for every job (best fit on one machine, whole machines for larger
jobs); Tiresias relaxes consolidation for models its profiler finds insensitive to placement, which needs a
per-model skew profile the trace does not carry. Its simulator re-evaluates all queues on every event; here a
decision examines the best waiting jobs against the worst running ones (priority.py), which reaches the same
allocation whenever the waiting jobs it examines can be placed.
"""
from __future__ import annotations

import bisect
import math

from .priority import PriorityPolicy

MAX_THRESHOLDS = 64     # queues; more is a typo (each costs a pass over the waiting jobs)


class TiresiasPolicy(PriorityPolicy):
    name = "tiresias"
    preemptive = True

    def __init__(self, thresholds=(3250.0, 7200.0)):
        super().__init__()
        try:
            th = tuple(float(t) for t in thresholds)
        except (TypeError, ValueError, OverflowError):      # (overflow: an integer past the largest float)
            raise ValueError(f"tiresias: thresholds must be numbers of GPU-seconds, got {thresholds!r}") from None
        if not all(0 < t < math.inf for t in th) or any(a >= b for a, b in zip(th, th[1:])) or \
                len(th) > MAX_THRESHOLDS:
            raise ValueError(f"tiresias: thresholds must be at most {MAX_THRESHOLDS} finite positive numbers in "
                             f"increasing order, got {thresholds!r}"[:300])
        self.thresholds = th

    def describe(self) -> dict:
        return {"name": self.name, "thresholds_gpu_s": list(self.thresholds)}

    def level(self, attained: float) -> int:
        return bisect.bisect_right(self.thresholds, attained)

    def waiting_key(self, job):
        return (self.level(job.attained), 1, job.submit_time)

    def running_key(self, job, now):
        # A running job sorts ahead of every waiting job of its own queue (the 0), so only a better queue
        # preempts it; of two running jobs in one queue the later-submitted is the first to go.
        return (self.level(job.attained_at(now)), 0, job.submit_time)

    def suspended_key(self, job, now):
        return (self.level(job.attained_at(now)), 1, job.submit_time)

    def rekey_at(self, job, now, gpus: int):
        # Running, a job gains service at a known rate: it crosses its next threshold at a known instant (a
        # timer that fires early only re-keys the job and asks again).
        lvl = self.level(job.attained_at(now))
        if lvl >= len(self.thresholds):
            return None
        return self.service_until(job, now, gpus, self.thresholds[lvl])
