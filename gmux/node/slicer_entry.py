"""What the time-slicer (gmux.node.slicer) knows of one job on its GPU: its share, its GPU time, its mini-batch
time, and where it stands with its commands."""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Entry:
    id: str
    weight: float
    mem: Optional[int]          # working set in bytes; None: not known yet
    order: int                  # arrival order: ties go to the job that came first
    used: float = 0.0           # GPU seconds resident (real time, shown to users)
    credit: float = 0.0         # head start given on arrival so a newcomer does not monopolise the GPU
    last_ran: float = -math.inf
    held: bool = False          # suspended by the user: not scheduled
    to_boundary: bool = False   # held for a move that needs it at its boundary: stopped only while others need it
    in_place: bool = False      # held for a move that checkpoints it from live memory: its suspend copies nothing
    stop_by: Optional[float] = None   # held with a deadline of the holder's, when shorter than its own (a fence's)
    kept: bool = False          # suspended in place: keeps its memory, computes nothing, until resumed
    resident_since: Optional[float] = None   # counting GPU time since (None: not holding the GPU's compute)
    batch_s: Optional[float] = None  # its median mini-batch time: sets its deadline and its turn
    batches: deque = field(default_factory=lambda: deque(maxlen=9))   # recent GPU seconds per mini-batch
    mark: Optional[tuple] = None     # (GPU seconds, boundaries passed) when its count last moved
    stoppable: bool = True      # may be stopped (not a job on GPUs of its own: stopping it would free nothing)
    sent_at: Optional[float] = None  # when its pending suspend/resume was sent
    overdue: bool = False       # that command missed its deadline; it stays with the job for its next boundary
    stopped: bool = False       # SIGSTOPped by gmuxd: keeps its memory, computes nothing
    frozen: bool = False        # stopped by someone else: keeps its memory, no turns until it runs again
    late_told: bool = False     # the daemon has been told it cannot be stopped (once per overdue command)

    def vtime(self, now: float) -> float:
        used = self.used + (now - self.resident_since if self.resident_since is not None else 0.0)
        return (used + self.credit) / self.weight

    def stopped_while_held(self) -> bool:
        """Whether an overdue command is to stop it though stopping frees nothing for others: held (a user's
        suspend, a cut-off machine's fence), a job computes no more, and one on GPUs of its own (a gang's rank,
        a multi-GPU job: never stopped to let others run) or held by a fence's deadline trained on while said
        held (an unmodified gang trained in two places at once, its machine cut off from the scheduler)."""
        return self.held and not self.to_boundary and (not self.stoppable or self.stop_by is not None)
