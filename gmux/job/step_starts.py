"""Which of job.data's fetches begin a training step: only they are the job's boundaries.

A new process resumes a job.data loop at its next fetch and runs the loop's body on from there, with none of the
body's own variables. A body that fetches more than once per step (`x, y = next(it), next(it)`: a support and a
query set, the two halves of a pair) holds what it fetched first while it fetches again; a move between the two
had the new process pair its batches one off, and its weights differed from an uninterrupted run's, silently.
So a fetch is a boundary only where an optimizer step came since the epoch loader's previous fetch. A suspend is
taken there too, as the transparent hook takes it at steps: a job suspended may be moved before it resumes, and
gradient accumulation's micro-batch fetches, which wait for the step that ends them, would copy the gradients
out and back for nothing. A command waits at most a step's time more.

A job that attached no optimizer (updates written by hand, a loop that only reads) has every fetch a boundary, as
before: a body of its that fetches twice is not told apart. One that did, but reads its epoch's loader without
stepping (an evaluation read first in an epoch), has every fetch a boundary again from the FETCHES_WITHOUT_STEP-th
in a row on.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional

from torch.optim.optimizer import register_optimizer_step_post_hook

FETCHES_WITHOUT_STEP = 16


class StepStarts:
    def __init__(self):
        self.steps = 0          # optimizer steps in this process while the job was the attached one
        self._at_fetch = 0      # `steps` at the epoch loader's previous fetch
        self._without = 0       # fetches in a row with no step before them

    def fetch(self, stepping: bool) -> bool:
        """The epoch's loader fetches next: whether this is a boundary. `stepping`: the job attached an optimizer."""
        stepped, self._at_fetch = self.steps != self._at_fetch, self.steps
        self._without = 0 if stepped else self._without + 1
        return not stepping or stepped or self._without >= FETCHES_WITHOUT_STEP


@functools.cache
def count(current: Callable[[], Optional[object]]) -> None:
    """Once per process: each optimizer step is counted for the job `current()` returns."""

    def stepped(_opt, _args, _kwargs) -> None:
        job = current()
        if job is not None:
            job.step_starts.steps += 1
    register_optimizer_step_post_hook(stepped)
