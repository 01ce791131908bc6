"""Tiresias (NSDI'19): discretized two-dimensional least-attained-service (2D-LAS).

A job's priority is its attained service in GPU-seconds (GPUs held x time: the "two dimensions"), discretized
into queues by `thresholds`: queue 0 below the first threshold, and so on. Lower queues come first; inside a
queue, jobs go in submission order (Tiresias' FIFO within a queue), which keeps the discretization from
thrashing jobs of nearly equal service. A job is demoted when its service crosses a threshold: the policy asks
for a timer at that instant. Higher-priority waiting jobs preempt lower-priority running ones by suspend.

Defaults: two thresholds, 1 and 10 GPU-hours (three queues). Tiresias' own evaluation used two queues with a
threshold chosen per workload; with Philly's median job of ~19 minutes on one GPU, 1 GPU-hour separates the
short majority from the long tail, and the 10 GPU-hour queue keeps multi-day jobs from sharing a queue with
medium ones. Not modelled: Tiresias' starvation knob (promotion of long-waiting jobs), off in its defaults here.
"""
from __future__ import annotations

import bisect

from .priority import PriorityPolicy


class TiresiasPolicy(PriorityPolicy):
    name = "tiresias"
    preemptive = True

    def __init__(self, thresholds=(3600.0, 36000.0)):
        super().__init__()
        th = tuple(float(t) for t in thresholds)
        if any(t <= 0 for t in th) or list(th) != sorted(th):
            raise ValueError(f"thresholds must be positive and increasing, got {thresholds!r}")
        self.thresholds = th

    def describe(self) -> dict:
        return {"name": self.name, "thresholds_gpu_s": list(self.thresholds)}

    def level(self, attained: float) -> int:
        return bisect.bisect_right(self.thresholds, attained)

    def waiting_key(self, job):
        return (self.level(job.attained), job.submit_time)

    def running_key(self, job, now):
        return (self.level(job.attained_at(now)), job.submit_time)

    def rekey_at(self, job, now, gpus: int):
        # Running alone, a job gains `gpus` GPU-seconds of service per second: it crosses its next threshold
        # at a known instant (a stale timer only causes a harmless re-key).
        lvl = self.level(job.attained)
        if lvl >= len(self.thresholds):
            return None
        return now + (self.thresholds[lvl] - job.attained) / max(1, gpus) + 1e-6
