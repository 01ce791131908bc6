"""AMP GradScalers that step an attached job's optimizer and that attach() was not given (explicit mode).

A GradScaler's scale and its count of steps since the last growth are state: the steps it skips (an overflow at
too high a scale, the first steps of every fp16 run) and those it grows at depend on them. A move's new process
builds the scaler anew at its initial scale, skips again what the first process skipped long ago, and trains on
otherwise (a run moved at step 7 of 36 ended with 5 steps skipped instead of 4, its weights up to 0.31 apart),
while every report said it was movable. So each scaler's step() notes the optimizers it steps: one that is
enabled, alive, not attached, and steps one of the job's optimizers keeps the job where it is, naming why.

What a scaler steps is read from the scaler itself, as its update() is looked up (strays.NotedAtLookup: no frame
of gmux's between the script and torch's code), once an iteration: the optimizers it unscaled and stepped since the
last update, by id.
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch

from . import strays

# scaler -> the ids of the optimizers it stepped (the scaler weakly: it is not kept alive for this)
_stepped: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def watch() -> None:
    """At each attach: the update() of torch's GradScaler and of each subclass that defines its own (FSDP's
    ShardedGradScaler: imported by then where the script uses it) notes what the scaler steps."""
    classes, seen = [torch.amp.GradScaler], set()
    while classes:
        cls = classes.pop()
        if cls not in seen:
            seen.add(cls)
            classes += cls.__subclasses__()
            update = vars(cls).get("update")
            if update is not None and type(update) is not strays.NotedAtLookup:
                cls.update = strays.NotedAtLookup(update, _note)


def _note(scaler) -> None:
    states = getattr(scaler, "_per_optimizer_states", None)     # (id(optimizer) -> its stage, until update())
    if states:
        try:
            _stepped.setdefault(scaler, set()).update(states)
        except TypeError:       # (a scaler that takes no weak reference is none of torch's)
            pass


def problem(job) -> Optional[str]:
    """Why a new process would step the job's optimizers under a scaler other than this one (None: it would not)."""
    if not _stepped or job.control != "explicit":
        return None
    mine = {id(s) for s in job.tracked.scalers}
    ours = strays._owned(job)
    for scaler, stepped in list(_stepped.items()):
        if id(scaler) in mine or not scaler.is_enabled() or not stepped & ours:
            continue
        opt = next((o for o in job.tracked.optimizers if id(o) in stepped), None)
        return (f"an AMP GradScaler attach() was not given steps an optimizer of the job "
                f"({type(opt).__name__ if opt is not None else 'one an optimizer of the job wraps'}): a new process "
                f"builds it anew at its initial scale (now {scaler.get_scale():g}) and would skip and scale other "
                f"steps, so the job stays where it is (suspend and resume still work); give it to attach()")
    return None
