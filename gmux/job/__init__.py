"""The in-job runtime. A training script attaches its state with one line and marks boundaries:

    job = gmux.job.attach(model, optimizer, scheduler, extras={...}, state={...})
    for epoch in job.epochs(10):
        for batch in job.data(loader):      # tracks the data position; marks boundaries by itself
            ...
            job.boundary()                  # optional: explicit boundaries (e.g. gradient accumulation)

or runs unmodified under `python -m gmux.job.run script.py` (transparent optimizer hook).

The names below are loaded on first use: gmux-launch imports its own modules from this package (the runner,
the gmuxd agent, control) to register the job before the user's script runs, and must not pay for torch first.
"""
from __future__ import annotations

import importlib

# Public name -> the module of this package that defines it.
_EXPORTS = {
    "attach": "api", "current": "api", "resident": "own_threads",
    "install_hook": "hook",
    "Job": "job", "JobExit": "job",
    "Command": "control", "Controller": "control", "LocalController": "control",
    "DevicePool": "memory.python_pool", "PoolExhausted": "memory.python_pool",
    "SpillError": "memory.spill",
    "CheckpointError": "checkpoint",
    "StateMismatch": "state", "TrackedState": "state",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value   # once loaded, a plain attribute
    return value


def __dir__():
    return sorted([*globals(), *_EXPORTS])
