"""Transparent mode: an unmodified training script becomes a gmux job through torch's global hooks.

Where its boundaries are is boundaries.LoopWatch's business (optimizer steps; outermost module calls in loops
that update by hand; never inside a step such as LBFGS's closure calls; one per iteration of a loop over
several models; none between micro-batches whose gradients wait): its docstring lists exactly which loops get
boundaries and which get none. This module makes each of them the job's boundary and records how the job is
controlled (`Job.control`: "none yet" until the first boundary, then "optimizer hook" or "module hook").
The script never attached anything, so the job's state is discovered the first time a command arrives: the
optimizers that stepped, the outermost modules the loop called, and the modules, LR schedulers and GradScalers
alive in the process (one garbage-collector scan).
"""
from __future__ import annotations

import gc
from typing import Optional

from torch import nn

from .api import set_current
from .boundaries import LoopWatch
from .control import Controller
from .job import Job
from .state import TrackedState, _is_scaler, _is_scheduler

_installed: Optional[Job] = None


def _discover(job: Job, watch: LoopWatch) -> None:
    # Nothing new since the last discovery: no optimizer stepped for the first time, no new model called.
    if getattr(job, "_discovered", None) == (job.tracked.added, watch.roots_added):
        return
    known = {id(o) for o in job.tracked.optimizers}
    roots = watch.roots
    # By type(), not isinstance(): isinstance() reads an object's __class__, which a weakref.proxy forwards (it
    # raises for a dead one and answers for a live one: torch.compile leaves both) and which a deprecated lazy
    # module proxy warns on. A proxy is not the object.
    objects = gc.get_objects()
    modules = [o for o in objects if issubclass(type(o), nn.Module)]
    others = [o for o in objects if _is_scheduler(o) or _is_scaler(o)]
    children = {id(c) for m in modules for c in m.children()}
    params_in_opt = {id(p) for opt in job.tracked.optimizers for g in opt.param_groups for p in g["params"]}
    for m in modules:
        # Top-level modules that own trained parameters or buffers, or that the loop calls (updated by hand);
        # a submodule is covered by its parent.
        if id(m) in children:
            continue
        if (any(id(p) in params_in_opt for p in m.parameters()) or any(True for _ in m.buffers())
                or id(m) in roots and any(True for _ in m.parameters())):
            job.tracked.add(m)
    for obj in others:
        if _is_scheduler(obj) and id(getattr(obj, "optimizer", None)) in known:
            job.tracked.add(obj)
        elif _is_scaler(obj):
            job.tracked.add(obj)
    job._discovered = (job.tracked.added, watch.roots_added)


def install_hook(controller: Optional[Controller] = None, pool=None) -> Job:
    """Makes this process a gmux job whose boundaries are its training loop's (boundaries.py). Idempotent.
    `pool`: the virtual GPU's memory a runner set up (gmux.job.memory.device_memory), or None."""
    global _installed
    if _installed is not None:
        return _installed
    watch: Optional[LoopWatch] = None
    job = Job(TrackedState(weak=True), controller=controller, pool=pool, device="cpu",
              discover=lambda j: _discover(j, watch))
    job.control = "none yet"

    def found_optimizer(optimizer) -> None:
        job.tracked.add(optimizer)
        first = next((p for g in optimizer.param_groups for p in g["params"]), None)
        if first is not None and first.device != job.device:
            job.move_to(first.device)

    def found_module(module) -> None:
        # Without an optimizer, the device of the first model the loop calls (a helper on the CPU does not
        # take the job off its GPU).
        first = next(module.parameters(), None)
        if first is not None and job.device.type == "cpu" and first.device.type != "cpu" and not job.suspended:
            job.move_to(first.device)

    def mark(source: str) -> None:
        job.control = source
        job.boundary()

    watch = LoopWatch(mark, found_optimizer, found_module)
    job.loop_watch = watch
    _installed = job
    set_current(job)
    return job

