"""Whether a new process would continue an attached job exactly: the one answer that a move asks (refused in
the job, Job._check_rebuildable) and that its reports give (gmuxd then refuses such a move up front and plans none:
gmux.node.job_handlers).

A move's new process runs the script from its start and restores at attach(). It could not continue exactly where
the epoch's loader cannot be put back (gmux.job.data: workers that drew their seeds in an earlier epoch), where the
script attached again, where an optimizer attach() was not given trains the job's parameters (gmux.job.strays),
where the job's state was found by the optimizer hook rather than given, where an optimizer was given parameter
groups since attach (add_param_group: progressive unfreezing), or a module's parameters or buffers changed (pruned,
a layer replaced), which the new process would rebuild as they were, or
where an LR scheduler attach() was not given drives an optimizer (the new process's would count from 0:
gmux.job.stray_schedulers), or an AMP GradScaler does (its scale would start again: gmux.job.stray_scalers), where a
gradient at the boundary is of a layout no checkpoint holds (a compressed sparse one: gmux.job.sparse_tensors; an
Embedding(sparse=True)'s, sparse COO, moves), where a module attach() was not given
is changed in place (an EMA copy: gmux.job.stray_modules; one kept as a dict of tensors: gmux.job.stray_tensors),
where a torchmetrics MetricTracker has made metrics as it trained (gmux.job.metric_states), where itertools.cycle
reads job.data (gmux.job.data_epoch: a new process's would not hold the batches it kept to give again), where a
loader's dataset or sampler holds a NumPy or Python random generator of its own that has drawn
(gmux.job.held_generators), or a variable of the script's holds one not attached that drew in its loop
(gmux.job.script_generators), or where a module's own attribute changed into numbers a checkpoint does not carry (a
NumPy float: gmux.job.module_attributes; an optimizer's of the script's own: gmux.job.optimizer_attributes).
Each of these can change while the job runs (a new epoch, an optimizer freed), so every report asks again.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import (data_epoch, held_generators, metric_states, module_attributes, optimizer_attributes, script_generators,
               sparse_tensors, stray_modules, stray_scalers, stray_schedulers, stray_tensors, strays)


def problem(job, fresh: bool = False) -> Optional[str]:
    """Why a new process could not continue `job` exactly now (None: it could). `fresh`: a move asks, and looks
    for modules changed outside the job's state now rather than by the last minute's look (stray_modules)."""
    try:
        return _problem(job, fresh)
    except Exception as e:
        # The looks walk whatever the script holds (its modules' attributes, every object of the process): one
        # that fails on an object nobody foresaw must not end the training it was asked about, from a report at a
        # boundary. Unjudged, the job is not moved.
        return (f"gmux could not judge whether a new process would continue the job exactly ({type(e).__name__}: "
                f"{str(e)[:200]}), so it stays where it is (suspend and resume still work)")


def _problem(job, fresh: bool) -> Optional[str]:
    why = job.position.unmovable or data_epoch.cycled(job.position, look=fresh) or job.not_rebuilt or \
        (strays.problem(job) if job.strays else None)
    if why:
        return why
    if job.tracked.weak:
        return ("a transparent-mode job (its state found by the optimizer hook) is not restored by a new process, "
                "which would start the script from its beginning: attach() it to make it movable (suspend and "
                "resume still work)")
    groups, modules = job.at_attach
    for i, (then, now) in enumerate(zip(groups, group_sizes(job))):
        if then != now:
            return (f"optimizer {i}'s parameter groups changed since attach (sizes {then} then, {now} now): a new "
                    f"process rebuilds the optimizer as the script builds it and could not take this state, so the "
                    f"job stays where it is (suspend and resume still work)")
    for i, (then, now) in enumerate(zip(modules, map(_module_layout, job.tracked.modules))):
        if then != now:
            return (f"module {i}'s parameters and buffers changed since attach ({_changes(then, now)}): a new process "
                    f"builds the module as the script builds it before attach() and could not take this state (a "
                    f"layer pruned, replaced or added, a dtype changed), so the job stays where it is (suspend and "
                    f"resume still work)")
    return (held_generators.problem(job.position.watched) or script_generators.problem(job) or
            stray_schedulers.problem(job) or
            stray_scalers.problem(job) or _unmarked_groups(job)
            or _unheld_tensor(job) or metric_states.problem(job) or stray_modules.problem(job, fresh)
            or stray_tensors.problem(job, fresh) or (_unkept_attributes(job) if fresh else None))


def _unkept_attributes(job) -> Optional[str]:
    # (a move asks only: a walk of every submodule's attributes, as a checkpoint's capture of them takes)
    return next(filter(None, map(module_attributes.not_carried, job.tracked.modules)), None) or \
        next(filter(None, map(optimizer_attributes.not_carried, job.tracked.optimizers)), None)


def _unheld_tensor(job) -> Optional[str]:
    # (one a checkpoint refuses: its reports said movable, and every move failed)
    for i, m in enumerate(job.tracked.modules):
        for name, t in (*m.named_parameters(), *m.named_buffers()):
            if why := sparse_tensors.unstorable(t):
                return (f"module {i}'s '{name}' is {why}: a new process could not be given it, so the job stays "
                        f"where it is (suspend and resume still work); hold it as COO (.to_sparse()) or dense")
        for name, p in m.named_parameters():
            if p.grad is not None and (why := sparse_tensors.unstorable(p.grad)):
                return (f"module {i}'s '{name}' has a gradient at this boundary that is {why}: clear it "
                        f"(optimizer.zero_grad()) before the boundary to make the job movable (suspend and resume "
                        f"still work)")
    return None


def _unmarked_groups(job) -> Optional[str]:
    # Every LR scheduler but ReduceLROnPlateau marks the groups it drives with their "initial_lr" as it is built:
    # this sees one whose step() stray_schedulers did not (a subclass's own, timm's).
    driven = {id(opt) for s in stray_schedulers.attached(job).values() for opt in stray_schedulers.driven_by(s)}
    for i, opt in enumerate(job.tracked.optimizers):
        if driven.isdisjoint(map(id, (opt, *stray_schedulers.driven_by(opt)))) and \
                any("initial_lr" in g for g in opt.param_groups):
            return (f"an LR scheduler attach() was not given drives optimizer {i} ({type(opt).__name__}): a new "
                    f"process builds it anew, counting from its first step, and would train on with other learning "
                    f"rates, so the job stays where it is (suspend and resume still work); give it to attach()")
    return None


def layout(job) -> tuple:
    """What a new process's attach() finds as the script built it: each optimizer's parameter group sizes, and each
    module's parameters and buffers (names, shapes, dtypes)."""
    return group_sizes(job), [_module_layout(m) for m in job.tracked.modules]


def group_sizes(job) -> list:
    return [[len(g["params"]) for g in o.param_groups] for o in job.tracked.optimizers]


def _module_layout(module) -> dict:
    return {name: (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else None
            for name, t in module.state_dict(keep_vars=True).items()}


def _changes(then: dict, now: dict) -> str:
    gone, new = [k for k in then if k not in now], [k for k in now if k not in then]
    changed = [f"{k} {then[k][0]} {then[k][1]} now {now[k][0]} {now[k][1]}"
               for k in then if k in now and then[k] != now[k] and then[k] and now[k]]
    said = ([f"gone: {', '.join(gone[:4])}"] if gone else []) + ([f"new: {', '.join(new[:4])}"] if new else [])
    return "; ".join(said + changed[:3]) or "their kinds"


def report(job) -> dict:
    """What an explicit job's reports say of moving it; {} for other jobs, whose reports say it otherwise (a
    framework's by its Trainer's setup, a hooked job's by gmux-launch's registration)."""
    if job.control != "explicit":
        return {}
    why = problem(job)
    return {"movable": why is None, "unmovable": why}
