"""Transparent mode: an unmodified training script becomes a gmux job through a global optimizer hook.

`torch.optim.optimizer.register_optimizer_step_post_hook` runs after every optimizer step of any optimizer,
which is exactly a mini-batch boundary (with gradient accumulation too). The hook costs a dictionary lookup
plus the job's boundary. The script never attached anything, so the job's state is discovered the first time
a command arrives: the optimizers that stepped, and the modules, LR schedulers and GradScalers alive in the
process (one garbage-collector scan).
"""
from __future__ import annotations

import gc
import warnings
from typing import Optional

from torch.optim.optimizer import register_optimizer_step_post_hook
from torch import nn

from .api import set_current
from .control import Controller
from .job import Job
from .state import TrackedState, _is_scaler, _is_scheduler

_installed: Optional[Job] = None


def _discover(job: Job) -> None:
    known = {id(o) for o in job.tracked.optimizers}
    if getattr(job, "_discovered", None) == known:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on deprecated lazy module proxies warns
        objects = gc.get_objects()
        modules = [o for o in objects if isinstance(o, nn.Module)]
        others = [o for o in objects if _is_scheduler(o) or _is_scaler(o)]
    children = {id(c) for m in modules for c in m.children()}
    params_in_opt = {id(p) for opt in job.tracked.optimizers for g in opt.param_groups for p in g["params"]}
    for m in modules:
        # Top-level modules that own trained parameters or buffers; a submodule is covered by its parent.
        if id(m) in children:
            continue
        if any(id(p) in params_in_opt for p in m.parameters()) or any(True for _ in m.buffers()):
            job.tracked.add(m)
    for obj in others:
        if _is_scheduler(obj) and id(getattr(obj, "optimizer", None)) in known:
            job.tracked.add(obj)
        elif _is_scaler(obj):
            job.tracked.add(obj)
    job._discovered = known


def install_hook(controller: Optional[Controller] = None, pool=None) -> Job:
    """Makes this process a gmux job whose boundaries are its optimizer steps. Idempotent. `pool`: the
    virtual GPU's memory a runner set up (gmux.job.memory.device_memory), or None."""
    global _installed
    if _installed is not None:
        return _installed
    job = Job(TrackedState(), controller=controller, pool=pool, device="cpu", discover=_discover)
    seen: set[int] = set()

    def after_step(optimizer, args, kwargs):
        if id(optimizer) not in seen:
            seen.add(id(optimizer))
            job.tracked.add(optimizer)
            first = next((p for g in optimizer.param_groups for p in g["params"]), None)
            if first is not None and first.device != job.device:
                job.move_to(first.device)
        job.boundary()

    register_optimizer_step_post_hook(after_step)
    _installed = job
    set_current(job)
    return job
