"""How long a job's turn on a GPU lasts, and how long gmuxd waits for it to reach a boundary, from its mini-batch.

Both follow the job's measured median mini-batch time (`batch_s` in its reports), because a suspend can only
happen at a boundary:
  - the deadline: once told to suspend (or resume), a job has max(floor, k x batch_s) to do it. A job that
    misses it is stopped (SIGSTOP) so that it cannot hold the GPU's compute while others wait; k > 1 leaves
    room for an ordinary slow mini-batch, the floor for a job whose mini-batch time is not known yet (its first
    mini-batches, or none ever) and for the suspend's own copy.
  - the turn: max(quantum, c x batch_s). A job whose mini-batch is longer than the quantum would otherwise pay
    a suspend and a resume for every step, and its neighbours would wait out most of each such step; with c >= 1
    it does at least c steps per turn. Fairness is kept by the slicer's stride scheduling (a longer turn is
    paid for with fewer of them), not by the turn's length.
Pure arithmetic: no clock, no state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Pacing:
    floor: float = 1.0      # seconds: the shortest deadline
    k: float = 3.0          # a deadline is this many mini-batches
    c: float = 2.0          # a turn is at least this many mini-batches

    def __post_init__(self):
        if not (self.floor > 0 and self.k >= 1 and self.c >= 1):
            raise ValueError(f"pacing needs floor > 0, k >= 1 and c >= 1 (got {self})")

    def deadline(self, batch_s: Optional[float]) -> float:
        """Seconds a job is given to acknowledge a suspend or a resume."""
        return max(self.floor, self.k * batch_s) if _measured(batch_s) else self.floor

    def turn(self, quantum: float, batch_s: Optional[float]) -> float:
        """The length of a job's turn on a time-sliced GPU."""
        return max(quantum, self.c * batch_s) if _measured(batch_s) else quantum


def _measured(batch_s: Optional[float]) -> bool:
    return batch_s is not None and math.isfinite(batch_s) and batch_s > 0
