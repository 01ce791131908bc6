"""gmux-law: gmux's mechanism told the size law instead of learning it. A yardstick for simulation only.

gmux ranks jobs by the Gittins index of the service law it learns from completions (gmux_default.py). How close
to the SRTF oracle can that kind of policy come when the law is not the problem? This policy is gmux, but each
job's true size (GPU-seconds, from the simulator's duration hint) joins the law when the job *arrives*: the law
of the work just submitted, known at once, with no lag and none of the bias of learning from completions (under
overload the short jobs finish and the long ones wait, so recent completions under-represent them). A job's
priority is still read from the law at its attained service, never from its own size, so it remains a policy
that does not know which job is short. It reads the law finely (two grid points per doubling of service, four
queues per octave of effective size), the variant that did best told the law; learned, the same fine reading
loses (gmux_default.py). Like sjf and srtf it refuses to run without hints.

What it showed (benchmarks/README.md, "What gmux-law shows"): at x0.25 told the law gmux's mechanism as it is
does 9.60 h against gmux's 9.68 (learning costs about 1%), read finely 9.15 h, against SRTF's 7.75 (1.18x).
"""
from __future__ import annotations

from .api import EventKind, PolicyError
from .gmux_default import GmuxPolicy


class GmuxLawPolicy(GmuxPolicy):
    name = "gmux-law"
    uses_oracle = True

    def __init__(self, grid_per_octave: int = 2, buckets_per_octave: int = 4, **params):
        # Told every size at arrival, its law has no censored members: it learns nothing from completions.
        if "censored" in params:
            raise ValueError("gmux-law: parameter 'censored' does not apply (it is told the law, never censored)")
        super().__init__(grid_per_octave=grid_per_octave, buckets_per_octave=buckets_per_octave, censored=False,
                         **params)

    def decide(self, snap, event):
        if event.kind is EventKind.ARRIVAL and event.job_id in snap.jobs:
            job = snap.jobs[event.job_id]
            if job.duration_hint is None:
                raise PolicyError(f"job {job.job_id!r} has no duration hint; gmux-law is an oracle yardstick for "
                                  f"simulation")
            self.model.add(job.num_gpus, job.duration_hint * job.num_gpus)
            self._rerank_if_changed()
        return super().decide(snap, event)

    def _learn_service(self, num_gpus: int, service: float, job_id) -> None:
        """Completions teach it nothing: it already knows the law."""
