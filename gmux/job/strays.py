"""Optimizers an attached job trains with that attach() was not given (explicit mode).

A move's new process runs the script from its start and restores at its attach(): an optimizer built after that
(a later stage's Adam after SGD) is never built there again, and the job would train on silently with the one it
attached. Such a move is refused (gmux.job.movability) while an optimizer that stepped outside the job's state
is alive and holds the job's parameters. One an attached optimizer wraps (SAM's base optimizer,
ZeroRedundancyOptimizer's local one, at any depth), or an object attached by its state_dict() (a Lookahead), is
the job's; a throwaway one over parameters the job does not
train (a linear probe built at each evaluation) is rebuilt by the new process as it was.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

_SKIPPED = {"state", "param_groups", "defaults"}    # an optimizer's own bookkeeping: no optimizer in there


@functools.cache
def watch(current: Callable[[], Optional[object]]) -> None:
    """Once per process: each optimizer step not of the explicit job `current()` returns is noted in its `strays`."""

    def stepped(opt, _args, _kwargs) -> None:
        job = current()
        if job is not None and job.control == "explicit" and id(opt) not in _owned(job):
            job.strays.add(opt)
    register_optimizer_step_post_hook(stepped)


class NotedAtLookup:
    """A method of torch's that calls `note(obj)` as it is looked up on an object (which nearly always is to call
    it) and hands back torch's own bound method: no frame of gmux's stands between the caller and the method, whose
    warnings (stacklevel=2) name the caller's line and whose tracebacks end in torch's code. Looked up on the
    class, it is torch's function itself."""
    __slots__ = ("method", "note")

    def __init__(self, method: Callable, note: Callable[[object], None]):
        self.method, self.note = method, note

    def __get__(self, obj, owner=None):
        if obj is None:
            return self.method
        self.note(obj)
        return self.method.__get__(obj, owner)


def problem(job) -> Optional[str]:
    """Why a new process would train the job on without an optimizer it trains with now (None: it would not)."""
    params = {id(p) for m in job.tracked.modules for p in m.parameters()}
    for opt in list(job.strays):
        if any(id(p) in params for g in opt.param_groups for p in g["params"]):
            return (f"an optimizer attach() was not given ({type(opt).__name__}) steps the job's parameters: a new "
                    f"process runs the script from its start, restores at attach() and would train on without "
                    f"it, so the job stays where it is (suspend and resume still work); give every optimizer to "
                    f"attach()")
    return None


def _owned(job) -> set:
    """The ids of the job's optimizers and of every optimizer they hold (cached until its state changes)."""
    cached = getattr(job, "_owned", None)
    if cached is None or cached[0] is not job.tracked:
        ids: set = set()
        for opt in job.tracked.optimizers:
            _walk(opt, ids, 0)
        for kept in job.tracked.schedulers:     # (and what an object kept by its state_dict wraps: a Lookahead)
            for value in getattr(kept, "__dict__", {}).values():
                _walk(value, ids, 1)
        cached = job._owned = (job.tracked, ids)
    return cached[1]


def _walk(obj, ids: set, depth: int) -> None:
    if depth > 6:
        return
    if isinstance(obj, torch.optim.Optimizer):
        if id(obj) in ids:
            return
        ids.add(id(obj))
        for name, value in vars(obj).items():
            if name not in _SKIPPED:
                _walk(value, ids, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _walk(value, ids, depth + 1)
    elif isinstance(obj, dict):
        for value in obj.values():
            _walk(value, ids, depth + 1)
