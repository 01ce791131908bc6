"""SJF and SRTF: oracle baselines that know every job's duration, used to check the simulator against the
published numbers (HeliosArtifact reports both on Philly). No real scheduler knows durations; gmux-scheduler
gives these policies no hints, and they refuse to run without them.

Both backfill (a job that does not fit does not block shorter ones behind it) and order by duration alone, as
the published baselines do; the GPU count only decides whether a job fits.
"""
from __future__ import annotations

from .api import PolicyError
from .priority import PriorityPolicy


def _hint(job, value):
    if value is None:
        raise PolicyError(f"job {job.job_id!r} has no duration hint; sjf/srtf are oracle baselines for simulation")
    return value


class SjfPolicy(PriorityPolicy):
    """Shortest job first, non-preemptive."""
    name = "sjf"
    uses_oracle = True

    def waiting_key(self, job):
        return _hint(job, job.duration_hint)


class SrtfPolicy(PriorityPolicy):
    """Shortest remaining time first, preemptive (by suspend)."""
    name = "srtf"
    uses_oracle = True
    preemptive = True

    def waiting_key(self, job):
        return _hint(job, job.remaining_hint)

    def running_key(self, job, now):
        return _hint(job, job.remaining_at(now))
