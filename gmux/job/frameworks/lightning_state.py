"""What gmux keeps of a Lightning run beyond what Lightning's own checkpoint holds, and puts back in the process it
continues in (gmux.job.frameworks.lightning): each logger's version and a CSVLogger's rows, the state of
Lightning's own callbacks that their state dicts leave out, and the steps of step-interval plateau schedulers due
after the boundary. Read from a checkpoint file, each is checked before use.
"""
from __future__ import annotations

import csv
import os

# State of Lightning's own callbacks that their state_dict leaves out, which a new process would start without:
# ModelCheckpoint's last save (without it, on_train_end writes last.ckpt again at the run's last step; a
# save_last="link" links nothing) and a save deferred until validation gives its monitored metric.
UNSAVED = {"ModelCheckpoint": {"_last_global_step_saved": int, "_last_checkpoint_saved": str,
                                "_defer_save_until_validation": bool}}


def _unsaved_kinds(callback) -> dict:
    """The attributes of `UNSAVED` a callback of Lightning's own has, with their types ({}: none)."""
    for cls in type(callback).__mro__:
        if cls.__name__ in UNSAVED and cls.__module__.startswith(("lightning.", "pytorch_lightning.")):
            return {n: kind for n, kind in UNSAVED[cls.__name__].items() if hasattr(callback, n)}
    return {}


def unsaved_state(trainer) -> dict:
    """{callback's state_key: {attribute: value}} of the `UNSAVED` state of the fit's callbacks."""
    out = {}
    for cb in trainer.callbacks:
        kinds = _unsaved_kinds(cb)
        if kinds:
            out[cb.state_key] = {n: getattr(cb, n) for n in kinds}
    return out


def put_back_unsaved(trainer, saved, path: str) -> None:
    """A restored process's callbacks take the `UNSAVED` state they had (checked: it comes from a file)."""
    if saved is None:
        return      # (a checkpoint written before gmux kept it)
    from gmux.job.checkpoint import CheckpointError
    if not isinstance(saved, dict):
        raise CheckpointError(path, "state 'unsaved' is not a mapping of callbacks")
    taken = []
    for cb in trainer.callbacks:
        kinds, values = _unsaved_kinds(cb), saved.get(getattr(cb, "state_key", None))
        if not kinds or values is None:
            continue
        if not isinstance(values, dict) or not all(
                n in kinds and type(v) is kinds[n] and (kinds[n] is not str or len(v) <= 4096)
                for n, v in values.items()):
            raise CheckpointError(path, f"state 'unsaved' of callback {cb.state_key!r} is not what gmux keeps")
        taken.append((cb, values))
    for cb, values in taken:        # (all checked first: a refusal sets nothing)
        for n, v in values.items():
            setattr(cb, n, v)


def logger_versions(trainer) -> list:
    """Each logger's version (None for a logger without Lightning's versions), its rows flushed to disk: a moved
    run's next process writes on from there."""
    out = []
    for logger in trainer.loggers:
        logger.save()
        v = getattr(logger, "_version", None)
        out.append(v if _is_version(v) else None)
    return out


def _is_version(v) -> bool:
    # (a version names a directory under the logger's: nothing that leads out of it)
    return (isinstance(v, int) and not isinstance(v, bool) and v >= 0) or \
        (isinstance(v, str) and 0 < len(v) <= 255 and v not in (".", "..") and not set(v) & {"/", "\\", "\0"})


def continue_logs(trainer, versions, path: str) -> None:
    """In a restored process, before fit: each logger whose version is still to be chosen takes the one it had,
    and a CSVLogger's writer keeps the metrics.csv it finds, and its header."""
    if versions is None:
        return      # (a checkpoint written before gmux kept them)
    if not isinstance(versions, list) or len(versions) > 64 or not all(v is None or _is_version(v) for v in versions):
        from gmux.job.checkpoint import CheckpointError
        raise CheckpointError(path, "state 'logs' is not a list of logger versions")
    for logger, v in zip(trainer.loggers, versions):
        if v is not None and getattr(logger, "_version", 0) is None:
            logger._version = v
        if type(logger).__name__ != "CSVLogger" or getattr(logger, "_experiment", 0) is not None:
            continue
        metrics = os.path.join(logger.log_dir, "metrics.csv")
        if not os.path.isfile(metrics):
            continue
        aside = metrics + ".gmux-kept"
        os.replace(metrics, aside)
        try:
            writer = logger.experiment
        finally:
            os.replace(aside, metrics)
        with open(metrics, newline="") as f:
            writer.metrics_keys = next(csv.reader(f), [])


def plateaus_due(trainer, done: int) -> list:
    """At a boundary (a training batch's end, the `done`-th of its epoch): [[index of its config, the metric]] for
    each ReduceLROnPlateau stepping by "step" that Lightning steps after the batch-end hooks (in on_advance_end,
    once validation could have logged), on the metric it monitors as it is now. A process restored there resumes
    with the next batch and would never take that step: a moved run's LR stayed unreduced, and it trained on
    apart."""
    if not trainer.lightning_module.automatic_optimization:
        return []       # (Lightning steps none itself then)
    due = [(i, c) for i, c in enumerate(trainer.lr_scheduler_configs)
           if c.reduce_on_plateau and c.interval == "step" and done % c.frequency == 0]
    if not due:
        return []
    metrics = trainer.callback_metrics
    # (a metric not there yet: Lightning's step raises or skips, in the process that goes on; nothing is carried)
    return [[i, metrics[c.monitor].detach().cpu().clone()] for i, c in due if metrics.get(c.monitor) is not None]


def checked_plateaus(trainer, due, path: str) -> list:
    """The plateau steps a checkpoint says were due after its boundary (`plateaus_due`), checked against this fit's
    schedulers before anything is restored: [(scheduler, metric)]."""
    if due is None:
        return []       # (a checkpoint written before gmux kept them)
    import torch
    configs = trainer.lr_scheduler_configs
    if not isinstance(due, list) or not all(
            isinstance(d, list) and len(d) == 2 and type(d[0]) is int and 0 <= d[0] < len(configs)
            and configs[d[0]].reduce_on_plateau and configs[d[0]].interval == "step"
            and isinstance(d[1], torch.Tensor) and d[1].numel() == 1 for d in due):
        from gmux.job.checkpoint import CheckpointError
        raise CheckpointError(path, "state 'plateaus_due' is not a list of this fit's step-interval plateau "
                                    "schedulers and their metrics")
    return [(configs[i].scheduler, metric) for i, metric in due]


def step_plateaus(trainer, due: list) -> None:
    """In a restored process, once its schedulers are restored: the plateau steps the moved run had still to take at
    its boundary, on the metric it had, as Lightning would have taken them (through the module's hook)."""
    progress = trainer.fit_loop.epoch_loop.scheduler_progress
    for scheduler, metric in due:
        progress.increment_ready()
        trainer.lightning_module.lr_scheduler_step(scheduler, metric)
        progress.increment_completed()


def callback_metrics(trainer) -> dict:
    """The metrics callbacks and schedulers read (`trainer.callback_metrics`: the last logged value of each, a
    validation's among them), which Lightning's checkpoint leaves out: a restored process found none until each was
    logged again. A ReduceLROnPlateau stepping by "step" on val_loss raised that it is missing (strict), or
    skipped its steps and trained on apart; a ModelCheckpoint or a script's hook read nothing where unmoved read the
    last validation's."""
    import torch
    return {k: v.detach().cpu().clone() for k, v in trainer.callback_metrics.items()
            if isinstance(k, str) and isinstance(v, torch.Tensor) and v.numel() == 1}


def checked_callback_metrics(saved, path: str) -> dict:
    """A checkpoint's `callback_metrics`, checked before anything is restored ({}: one written before gmux kept
    them)."""
    if saved is None:
        return {}
    import torch
    if not isinstance(saved, dict) or len(saved) > 4096 or not all(
            isinstance(k, str) and len(k) <= 4096 and isinstance(v, torch.Tensor) and v.numel() == 1
            for k, v in saved.items()):
        from gmux.job.checkpoint import CheckpointError
        raise CheckpointError(path, "state 'callback_metrics' is not a mapping of metric names to single values")
    return saved


def put_back_callback_metrics(trainer, metrics: dict) -> None:
    """Into a restored process's logger connector (after Lightning's reset of them at the fit's start), where the
    metrics each new log updates are; on the module's device, as logged values are."""
    device = trainer.lightning_module.device
    trainer._logger_connector._callback_metrics.update({k: v.to(device) for k, v in metrics.items()})
