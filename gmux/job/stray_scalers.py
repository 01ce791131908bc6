"""AMP GradScalers that step an attached job's optimizer and that attach() was not given (explicit mode).

A GradScaler's scale and its count of steps since the last growth are state: the steps it skips (an overflow at
too high a scale, the first steps of every fp16 run) and those it grows at depend on them. A move's new process
builds the scaler anew at its initial scale, skips again what the first process skipped long ago, and trains on
otherwise (a run moved at step 7 of 36 ended with 5 steps skipped instead of 4, its weights up to 0.31 apart),
while every report said it was movable. So each scaler's step() notes the optimizers it steps: one that is
enabled, alive, not attached, and steps one of the job's optimizers keeps the job where it is, naming why.
"""
from __future__ import annotations

import functools
import weakref
from typing import Optional

import torch

from . import strays

# scaler -> the optimizers it stepped (weakly: neither is kept alive for this)
_stepped: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_installed = False


def watch() -> None:
    """Once per process: torch's GradScaler.step (its CUDA and CPU subclasses inherit it) notes what it steps."""
    global _installed
    if _installed:
        return
    _installed = True
    step = torch.amp.GradScaler.step

    @functools.wraps(step)
    def noting(self, optimizer, *args, **kwargs):
        try:
            _stepped.setdefault(self, weakref.WeakSet()).add(optimizer)
        except TypeError:       # (an object that takes no weak reference is not one of the job's optimizers)
            pass
        return step(self, optimizer, *args, **kwargs)
    torch.amp.GradScaler.step = noting


def problem(job) -> Optional[str]:
    """Why a new process would step the job's optimizers under a scaler other than this one (None: it would not)."""
    if not _stepped or job.control != "explicit":
        return None
    mine = {id(s) for s in job.tracked.scalers}
    ours = strays._owned(job)
    for scaler, optimizers in list(_stepped.items()):
        if id(scaler) in mine or not scaler.is_enabled():
            continue
        for opt in list(optimizers):
            if id(opt) in ours:
                return (f"an AMP GradScaler attach() was not given steps an optimizer of the job "
                        f"({type(opt).__name__}): a new process builds it anew at its initial scale (now "
                        f"{scaler.get_scale():g}) and would skip and scale other steps, so the job stays where it "
                        f"is (suspend and resume still work); give it to attach()")
    return None
