"""LR schedulers that step an attached job's optimizer and that attach() was not given (explicit mode).

A move's new process runs the script from its start and restores at its attach(): a scheduler it was not given is
built there anew, at its first step, and the job would train on with other learning rates (a StepLR decays again
from 0; a ReduceLROnPlateau forgets its best metric and its patience). Most schedulers mark the groups they drive
with "initial_lr" as they are built, which movability reads; ReduceLROnPlateau marks nothing, and a second scheduler
on an optimizer an attached one drives hides behind the first. So every scheduler's step() is watched (as it is
looked up, which nearly always is to call it): one that stepped since it was built (the step its constructor takes
does not count: the new process takes it too), is alive, is neither attached nor held by an attached one
(SequentialLR's and ChainedScheduler's parts, the one accelerate's wrapper drives), and drives one of the job's
optimizers keeps the job where it is.

A subclass that overrides step() without calling torch's through super() is not seen here; "initial_lr" still is.
"""
from __future__ import annotations

import functools
import weakref
from typing import Optional

from torch.optim import lr_scheduler

from . import strays

_stepped: weakref.WeakSet = weakref.WeakSet()


@functools.cache
def watch() -> None:
    """Once per process: watches the step() of every scheduler class torch defines one in."""
    for cls in vars(lr_scheduler).values():
        if (isinstance(cls, type) and issubclass(cls, (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau))
                and "step" in vars(cls)):
            cls.step = strays.NotedAtLookup(vars(cls)["step"], _note)


def _note(scheduler) -> None:
    # A constructor's own step runs with the count at 0 (LRScheduler._initial_step); ReduceLROnPlateau has no count
    # and takes no step when built.
    if getattr(scheduler, "_step_count", 1) != 0:
        _stepped.add(scheduler)


def problem(job) -> Optional[str]:
    """Why a new process would drive the job's optimizers with a scheduler other than this one (None: it would not)."""
    if not _stepped:
        return None
    mine = attached(job)
    ours = strays._owned(job)
    for s in list(_stepped):
        if id(s) in mine:
            continue
        for opt in driven_by(s):
            if id(opt) in ours:
                index = next((i for i, o in enumerate(job.tracked.optimizers) if o is opt), None)
                which = f"optimizer {index} ({type(opt).__name__})" if index is not None else \
                    f"an optimizer of the job ({type(opt).__name__})"
                return (f"an LR scheduler attach() was not given ({type(s).__name__}) drives {which}: a new process "
                        f"builds it anew, at its first step, and would train on with other learning rates, so the "
                        f"job stays where it is (suspend and resume still work); give it to attach()")
    return None


def attached(job) -> dict:
    """The job's schedulers and those they hold, by id: SequentialLR's and ChainedScheduler's parts, the one a
    wrapper drives (accelerate's AcceleratedScheduler)."""
    found: dict = {}

    def walk(s, depth: int) -> None:
        found[id(s)] = s
        if depth < 4:
            for part in [*(getattr(s, "_schedulers", None) or ()), getattr(s, "scheduler", None)]:
                if part is not None:
                    walk(part, depth + 1)
    for s in job.tracked.schedulers:
        walk(s, 0)
    return found


def driven_by(obj) -> list:
    """The optimizer a scheduler drives (or an optimizer wraps) and those it wraps in turn: accelerate's
    AcceleratedOptimizer holds the torch one."""
    chain, opt = [], getattr(obj, "optimizer", None)
    while opt is not None and len(chain) < 4:
        chain.append(opt)
        opt = getattr(opt, "optimizer", None)
    return chain
