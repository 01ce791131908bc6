"""What the torchmetrics Metrics inside a job's modules have counted so far, which their state_dict() leaves out.

A Metric keeps its counts (`add_state`: a tensor summed over the batches, or a list of tensors joined at compute())
as attributes of its own, which state_dict() holds only when made persistent, and by default they are not. An
epoch's accuracy logged at its end (Lightning's `self.log("train_acc", self.train_acc, on_epoch=True)`), computed
in the process a move continued the run in, counted only the batches after the move, and a ReduceLROnPlateau,
EarlyStopping or ModelCheckpoint monitoring it decided otherwise than unmoved. So gmux keeps each Metric's states
and its count of updates with its module, moves them with the job's other tensors at a suspend, and puts them back
in place: into the tensors and lists the Metric holds, which a MetricCollection's compute groups share.

A Metric is known by its class, without importing torchmetrics (a job that does not use it does not pay for it).
One outside every attached module (built beside the model rather than in it) is not seen.
"""
from __future__ import annotations

import sys
from typing import Iterator, Optional

import torch
from torch import nn

MAX_ITEMS = 1 << 20                 # items in one list state (a checkpoint is read from a file)
_is_metric_class: dict = {}


def is_metric(module: nn.Module) -> bool:
    cls = type(module)
    known = _is_metric_class.get(cls)
    if known is None:
        known = _is_metric_class[cls] = any(c.__name__ == "Metric" and c.__module__.startswith("torchmetrics.")
                                            for c in cls.__mro__)
    return known


def metrics(module: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """The Metrics in `module` (itself included), by their dotted names."""
    if "torchmetrics" not in sys.modules:
        return      # (none can exist: every suspend and report of a job that does not use it walks no modules)
    for name, sub in module.named_modules():
        if is_metric(sub) and isinstance(getattr(sub, "_defaults", None), dict):
            yield name, sub


def held(m: nn.Module) -> list:
    """What a Metric counts in, by name: its add_state states, and the tensors it keeps as attributes of its own
    (MinMaxMetric's extremes over the epochs' computes: a new process's would start from infinity again)."""
    return [*m._defaults, *(k for k, v in vars(m).items()
                            if isinstance(v, torch.Tensor) and not k.startswith("_") and k not in m._defaults)]


def tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor the module's Metrics count in, by a readable name (for the swap engine: they are the job's)."""
    for prefix, m in metrics(module):
        for name in held(m):
            value = getattr(m, name, None)
            where = f"{prefix}.{name}" if prefix else name
            if isinstance(value, torch.Tensor):
                yield where, value
            elif isinstance(value, list):
                yield from ((f"{where}[{i}]", t) for i, t in enumerate(value) if isinstance(t, torch.Tensor))


def problem(job) -> Optional[str]:
    """Why a new process would not take the counts of the job's Metrics (None: it would): a MetricTracker holds a
    copy of its metric for each increment() so far, which the new process makes as the script's loop goes on from
    the move, not before it (the restore found other Metrics and was refused there, the move lost)."""
    if "torchmetrics" not in sys.modules:
        return None
    for i, top in enumerate(job.tracked.modules):
        for name, m in top.named_modules():
            if type(m).__name__ == "MetricTracker" and type(m).__module__.startswith("torchmetrics.") and \
                    len(m) > 1:
                return (f"module {i}'s torchmetrics MetricTracker '{name}' holds {len(m) - 1} copies of its metric "
                        f"made by increment() as the job trained, which a new process would not have made by the "
                        f"move, so the job stays where it is (suspend and resume still work)")
    return None


def capture(module: nn.Module) -> dict:
    """{name: {"states": {state: tensor or list of tensors}, "count": updates}}, referring to the live tensors."""
    return {prefix: {"states": {name: getattr(m, name) for name in held(m)}, "count": int(m._update_count)}
            for prefix, m in metrics(module)}


def check(fit, saved, modules: list, mismatch: type) -> None:
    """Refuses (gmux.job.restore_check.Fit's way) what apply() could not put back whole: each module's Metrics by
    name, each state of the live one's kind, a tensor of its dtype and shape, a list of tensors of any length."""
    if not isinstance(saved, list) or len(saved) != len(modules):
        fit.fail(f"'metrics': a {type(saved).__name__}, the job has a list of {len(modules)}")
    for i, (entries, module) in enumerate(zip(saved, modules)):
        _check_module(fit, entries, module, f"module {i}", mismatch)


def _check_module(fit, saved, module: nn.Module, where: str, mismatch: type) -> None:
    fail = fit.fail
    live = dict(metrics(module))
    if not isinstance(saved, dict):
        fail(f"{where} metrics: a {type(saved).__name__}, the job has a dict")
    if set(saved) != set(live):
        fail(f"{where} metrics: {sorted(map(str, saved))[:8]}, the job has {sorted(live)[:8]}", mismatch)
    for prefix, m in live.items():
        entry, at = saved[prefix], f"{where} metric '{prefix}'"
        if not (isinstance(entry, dict) and set(entry) == {"states", "count"} and isinstance(entry["states"], dict)):
            fail(f"{at}: not a Metric's states and a count of its updates")
        fit.counter(entry["count"], f"{at} 'count'")
        names = held(m)
        if set(entry["states"]) != set(names):
            fail(f"{at} states: {sorted(map(str, entry['states']))[:8]}, the job has {sorted(names)[:8]}", mismatch)
        for name in names:
            now, value = getattr(m, name), entry["states"][name]
            if name not in m._defaults:       # (assigned, not copied into: one compute() may change its dtype)
                shape = fit.row(value, f"{at} '{name}'").shape
                if shape != tuple(now.shape):
                    fail(f"{at} '{name}': shape {shape}, the job has {tuple(now.shape)}")
            elif isinstance(now, torch.Tensor):
                fit.tensor(value, str(now.dtype).removeprefix("torch."), tuple(now.shape), f"{at} state '{name}'")
            elif not (isinstance(now, list) and isinstance(value, list)):
                fail(f"{at} state '{name}': a {type(value).__name__}, the job has a {type(now).__name__}")
            else:
                rows(fit, value, f"{at} state '{name}'")


def rows(fit, value, where: str) -> None:
    """A list state as a checkpoint holds it: tensors, any number of them (an epoch's batches) up to MAX_ITEMS."""
    if not isinstance(value, list):
        fit.fail(f"{where}: a {type(value).__name__}, the job has a list")
    if len(value) > MAX_ITEMS:
        fit.fail(f"{where}: a list of {len(value)} items, more than the {MAX_ITEMS} a list state may hold")
    for i, t in enumerate(value):
        fit.row(t, f"{where}[{i}]")


def alike(fit, module: nn.Module, key: str, saved, live, where: str) -> None:
    """A value in `module`'s state_dict() that is no tensor: a persistent list state's rows, else Fit.alike."""
    if key in persistent_lists(module):
        rows(fit, saved, where)
    else:
        fit.alike(saved, live, where)


def persistent_lists(module: nn.Module) -> set:
    """The state_dict() keys of list states made persistent (metric.persistent(True)): as long as the epoch's
    batches so far, which a new process's empty list is not, so they are checked as rows(), not like the job's."""
    return {f"{prefix}.{name}" if prefix else name for prefix, m in metrics(module) for name in m._defaults
            if getattr(m, "_persistent", {}).get(name) and isinstance(getattr(m, name, None), list)}


def apply(module: nn.Module, saved: dict) -> None:
    """Only for what check() passed: nothing here can fail half-way."""
    live = dict(metrics(module))
    for prefix, entry in saved.items():
        m = live[prefix]
        for name, value in entry["states"].items():
            now = getattr(m, name)
            if name not in m._defaults:
                setattr(m, name, value.to(now.device))
            elif isinstance(now, torch.Tensor):
                now.copy_(value)
            else:
                now[:] = [t.to(m.device) for t in value]
        m._update_count = entry["count"]
        m._computed = None           # (a result cached from before the restore)
        m._forward_cache = None
