"""gmux-law: gmux's own mechanism, told the size law instead of learning it. A yardstick for simulation only.

gmux ranks jobs by the Gittins index of the service law it learns from completions (gmux_default.py). How much
of its distance to the SRTF oracle is that learning, and how much is not knowing sizes at all? This policy is
gmux in every other respect, but each job's true size (GPU-seconds, from the simulator's duration hint) joins
the law when the job *arrives*: the law of the work just submitted, known at once, with no lag and none of the
bias of learning from completions (under overload the short jobs finish and the long ones wait, so the recent
completions under-represent them). A job's priority is still read from the law at its attained service, never
from its own size, so it remains a policy that does not know which job is short: the best gmux's mechanism can
do with perfect knowledge of the law. Like sjf and srtf it refuses to run without hints.

What it showed (benchmarks/simulate.py, nineteenth session): at x0.25 it averages 9.60 h against gmux's 9.68 h
and SRTF's 7.75 (x0.35 5.41 against 5.32, x0.5 4.06 against 4.04). Learning the law from completions costs gmux
about 1% at the heaviest load and nothing at the others, so gmux's distance to SRTF is not knowing which job is
short, and how finely the mechanism reads the law (gmux_default.py, "Measured in the nineteenth session").
"""
from __future__ import annotations

from .api import EventKind, PolicyError
from .gmux_default import GmuxPolicy


class GmuxLawPolicy(GmuxPolicy):
    name = "gmux-law"
    uses_oracle = True

    def decide(self, snap, event):
        if event.kind is EventKind.ARRIVAL and event.job_id in snap.jobs:
            job = snap.jobs[event.job_id]
            if job.duration_hint is None:
                raise PolicyError(f"job {job.job_id!r} has no duration hint; gmux-law is an oracle yardstick for "
                                  f"simulation")
            self.model.add(job.num_gpus, job.duration_hint * job.num_gpus)
            self._rerank_if_changed()
        return super().decide(snap, event)

    def _learn_service(self, num_gpus: int, service: float) -> None:
        """Completions teach it nothing: it already knows the law."""
