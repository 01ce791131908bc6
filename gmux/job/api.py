"""What a training script calls: `attach()` makes its process a gmux job, `current()` returns that job.

(Re-exported as gmux.job.attach and gmux.job.current.)
"""
from __future__ import annotations

import os
import sys
from typing import Optional

import torch
from torch.nn.modules.lazy import LazyModuleMixin

from gmux.wire.arriving import Arriving
from gmux.wire.transfer import TransferError
from .restore_wait import restore_wait
from . import control, holdings, step_starts, stray_modules, stray_scalers, stray_schedulers, stray_tensors, strays
from .checkpoint import CheckpointError
from .control import Controller
from .job import Job
from .state import TrackedState

_current: Optional[Job] = None


def attach(*objects, extras: Optional[dict] = None, state: Optional[dict] = None,
           controller: Optional[Controller] = None, pool=None, device=None, restore: Optional[str] = None) -> Job:
    """Makes this process a gmux job tracking `objects` (modules, optimizers, LR schedulers: torch's, or any object
    with state_dict() and load_state_dict() such as timm's, GradScalers, and the script's own random generators:
    torch.Generator, NumPy Generator or RandomState, random.Random),
    the tensors in `extras` and the picklable values in `state` (both dicts kept by reference: the job's `state` is
    that dict, and a tensor the script puts anew under a name of `extras` is the one a checkpoint holds). Returns
    the job, also available as `gmux.job.current()`. `pool`: a virtual GPU's memory (gmux.job.memory.device_memory,
    or a DevicePool), for a job on the CPU.

    Under gmux-launch the controller is gmuxd's agent and, after a migration, the job's state is restored
    here from the checkpoint gmuxd names in GMUX_RESTORE (or from `restore=`), so the script continues
    exactly where it left off."""
    global _current
    tracked = TrackedState()
    for obj in objects:
        tracked.add(obj)
    for name, t in (extras or {}).items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"extras['{name}'] is a {type(t).__name__}, not a tensor: pass a module, optimizer, "
                            f"scheduler or scaler to attach() as it is (attach(model, ema_model, ...)), and other "
                            f"values in state=")
    _made(tracked.modules)
    tracked.set_extras(extras if extras is not None else {})
    if state is not None:
        tracked.state = state
    restore = restore or os.environ.get("GMUX_RESTORE")
    wait = restore_wait()     # (before anything is attached)
    previous, controller = _current, controller if controller is not None else control.default()
    if previous is not None:
        # Attached under the transparent hook: the hook's job, left watching, went on reporting and taking
        # commands beside this one (two step counts, two CONTROLs).
        previous.stop_watching_loop()
    _current = Job(tracked, controller=controller, pool=pool, device=device)
    caller = sys._getframe(1)      # (loops around this call are not the job's: gmux.job.own_loops)
    _current.position.attached_at = (caller.f_code, caller.f_lineno)
    strays.watch(current)
    step_starts.count(current)
    stray_schedulers.watch()
    stray_scalers.watch()
    if previous is not None and not previous.tracked.weak and controller is not None and \
            controller is previous.controller:
        # The same job attached again (a later stage's new optimizer): its steps count on. A new process runs the
        # script from its start and restores at its first attach(), so this one restores nothing, and the job no
        # longer moves to one (a restore there would meet other objects, or, the new ones left out, train on
        # with the first stage's).
        _current.profile = previous.profile
        previous.not_rebuilt = _current.not_rebuilt = (
            "attach() was called again in this process: a new process runs the script from its start and restores "
            "at its first attach(), into other objects, so the job stays where it is (suspend and resume still "
            "work)")      # (the old one too: the script's loop may still take its boundaries)
        restore = None
    if restore and wait:
        # Started on a machine while its checkpoint is still on the way there: restored as the bytes arrive,
        # applied once all have. gmuxd hears first that this process is ready for them (interpreter, torch and
        # model built): a move's source computes on until then (gmux.node.cluster_link, "ready"). What it holds
        # already, it offers first: the source leaves that out (gmux.job.holdings; GMUX_HOLDINGS=off offers
        # nothing, the baseline a benchmark compares with).
        offer = holdings.Offer.of(_current.tracked.modules if os.environ.get("GMUX_HOLDINGS") != "off" else [])
        offered = holdings.holds_path(restore)
        offer.save(offered)
        _current.controller.report({**_current.report(), "awaiting_restore": True})
        try:
            with Arriving(restore, wait) as arriving:
                # (a refused one ends this process: the move fails)
                _current.restore(arriving, fresh=True, offer=offer)
        except TransferError as e:
            raise CheckpointError(str(e)) from None
        finally:
            offer.withdraw(offered)
    elif restore:
        _current.restore(restore)
    stray_modules.problem(_current)     # the first look: what the modules attach() was not given hold now
    stray_tensors.problem(_current, fresh=True)     # and the tensors shadowing the job's modules
    return _current


def _made(modules) -> None:
    """Refuses modules whose parameters are not made yet (a lazy module's, made at its first forward): the job's
    state has no shape to hold, suspend or restore until then, and torch's own error named none of it."""
    for m in modules:
        for name, sub in m.named_modules():
            if isinstance(sub, LazyModuleMixin) and sub.has_uninitialized_params():
                raise ValueError(f"attach(): {type(sub).__name__} {name or type(m).__name__!r} has parameters not "
                                 f"made yet (a lazy module makes them at its first forward): run one forward, on a "
                                 f"batch of the data or a dummy one, before attach()")


def current() -> Optional[Job]:
    return _current


def set_current(job: Job) -> None:
    """The transparent hook's job is the process's job too."""
    global _current
    _current = job
