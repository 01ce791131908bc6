"""Lightning `Trainer` (`lightning.pytorch` or `pytorch_lightning`) as an explicit-mode gmux job.

Boundary: the end of a training batch, once its end hooks have all run (`Callback.on_train_batch_end` finds it
due, the logger connector's batch end after the module's hook takes it: the optimizer and any step-interval
scheduler have stepped), except mid-way through a gradient-accumulation cycle, at an epoch's last batch, and
before a validation run: there Lightning's own resume does work a restored process would not (its epoch end,
its validation), or gradients are pending.

State: the LightningModule, the strategy's optimizers, the LR schedulers and the precision plugin's scaler, as
tensors the runtime moves; the random states; and in the job's state what Lightning saves besides them (its
loops' progress, the callbacks' and the datamodule's state dicts, the precision plugin's state) plus the data
position: the random states and the loader's generators as they were when the epoch's iterator was made, and
the batches of the epoch trained on; each logger's version, its rows flushed to disk first; and what Lightning's
own callbacks keep outside their state dicts and act on later (ModelCheckpoint's last save, without which a new
process writes last.ckpt again when training ends: gmux.job.frameworks.lightning_state), and the step a
ReduceLROnPlateau stepping by "step" takes after the boundary, with its metric (a restored process takes it), and
the trainer's callback_metrics (the last value of each metric, which schedulers and callbacks read between logs).
A callback of the script's own keeps only what its state_dict holds, as with Lightning's own resume.

Restore, in the process started after a move: `fit()` runs Lightning's own restore of its loops and callbacks
from that state (its checkpoint connector is handed the saved dict instead of reading a file; its loading of
weights, optimizers and schedulers is left to gmux, which restores and checks them at `on_train_start`, after
running again the script's own `on_train_epoch_start` hooks, which Lightning's resume mid-epoch skips); the
training data's iterator is made again under the random states of the epoch's start and advanced past the
batches already trained on (the loader loads them again, in the same order); the random states are the
checkpoint's from the fetch of the next batch on (a collate function or dataset drawing noise or crops from them
draws what it would have drawn unmoved). Its loggers take the versions they had (`continue_logs`): a new
process's would take the next one, splitting `lightning_logs/version_N`, and ModelCheckpoint, whose default
directory is the first logger's, would find another and drop its top-k (its best_model_path, a worse one); a
CSVLogger goes on with its metrics.csv, which Lightning's writer deletes when it finds one (its own resume too).

A move would change results, and is refused (`why_not_movable`), with a strategy other than a single device
(DDP, FSDP, DeepSpeed: several processes, sharded state), an IterableDataset or a loader that is not a torch
DataLoader (no position to return to), persistent workers whose dataset or collate function draws random numbers,
once they have served an epoch (`carried_draws`: their random state carries into the next; a move in the epoch
they start in is exact; whether they draw is tried once on a first batch, in a forked child:
gmux.job.data_draws; workers that draw nothing move, their base seed in a new process drawn from a
generator of their own, as the unmoved run's workers drew theirs only when its first epoch began), with no
workers a dataset or collate function drawing from a generator of its own (the new process's starts again),
`reload_dataloaders_every_n_epochs` (the loader is made anew under random states a resumed run does not have),
a LightningModule or a callback (Lightning's own ModelPruning and EMAWeightAveraging among them) that overrides
`on_save_checkpoint`/`on_load_checkpoint` (state of its own that gmux does not see), a callback that changes the
training at an epoch's start with state of its own (StochasticWeightAveraging, a BaseFinetuning: Lightning's
resume in the middle of an epoch skips `on_train_epoch_start`, and gmux does it again only for the script's own
hooks and a GradientAccumulationScheduler's), and state that is not plain data (numbers,
strings, tensors, lists, dicts).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import warnings
from typing import Optional

from gmux.job import frameworks
from gmux.job.frameworks import callback_attributes
from gmux.job.data_draws import draws
from gmux.job.frameworks.lightning_epoch_sums import carry_epoch_sums, check_epoch_sums, epoch_sums
from gmux.job.frameworks.lightning_state import (callback_metrics, checked_callback_metrics, checked_plateaus,
                                                 continue_logs, logger_versions, plateaus_due,
                                                 put_back_callback_metrics, put_back_unsaved, step_plateaus,
                                                 unsaved_state)

FRAMEWORK = "lightning"
_active = None      # the GmuxCallback of the fit in progress (one at a time in a process)
_EPOCH_START_CHANGERS = ("StochasticWeightAveraging", "BaseFinetuning")
# Lightning's own callbacks whose on_train_epoch_start only sets the trainer from the epoch: done again on a restore
_EPOCH_START_PURE = ("GradientAccumulationScheduler",)


def patch(module) -> None:
    Trainer = module.Trainer
    if getattr(Trainer, "_gmux_patched", False):
        return
    root = module.__name__.rsplit(".trainer.trainer", 1)[0]
    call = importlib.import_module(f"{root}.trainer.call")
    combined = importlib.import_module(f"{root}.utilities.combined_loader")
    Callback = _callback_class(importlib.import_module(f"{root}.callbacks").Callback, call,
                               importlib.import_module(root).__version__)
    original = Trainer.fit
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        global _active
        job = frameworks.job()
        if job is None or _active is not None:
            return original(self, *args, **kwargs)
        callback = Callback(self, job)
        callback_attributes.remember(_own_callbacks(self))     # (before any hook: a move carries what they change)
        frameworks.started()
        path = frameworks.take_restore()
        with warnings.catch_warnings():
            if path is not None:
                _continuation_is_expected()
                own = signature.bind(self, *args, **kwargs).arguments.get("ckpt_path")
                if own:   # a checkpoint of its own, older than the one the job was moved with: not read
                    print(f"gmux: resuming from {path} (where this job was moved from), not from {own!r}",
                          file=sys.stderr)
                callback.resume(path, frameworks.saved_state(path, FRAMEWORK))
            self.callbacks.append(callback)
            _active = callback
            try:
                return original(self, *args, **kwargs)
            finally:
                _active = None
                frameworks.finished(job)
                if callback in self.callbacks:
                    self.callbacks.remove(callback)
                for name in ("resume_start", "restore_model", "restore_optimizers_and_schedulers"):
                    self._checkpoint_connector.__dict__.pop(name, None)
                self._logger_connector.__dict__.pop("on_batch_end", None)

    Trainer.fit = fit
    _watch_epochs(combined.CombinedLoader)
    Trainer._gmux_patched = True


# What Lightning warns of in a process that goes on with a run, which gmux's restore makes right: the run's own log
# and checkpoint directories are there (its CSV rows are kept: `continue_logs`), and the data position is gmux's.
_CONTINUATION_WARNINGS = ("Experiment logs directory .* exists and is not empty",
                          "Checkpoint directory .* exists and is not empty",
                          "You're resuming from a checkpoint that ended before the epoch ended and your dataloader "
                          "is not resumable")


def _continuation_is_expected() -> None:
    for message in _CONTINUATION_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


def _watch_epochs(CombinedLoader) -> None:
    """Each time the fit's training data is iterated (an epoch starts), its random states are noted; in a
    restored process, the first time, the iterator is made under the saved ones and advanced to the position,
    and the checkpoint's random states are put back just before the first batch after it is fetched: a collate
    function or dataset drawing from them (noise, crops) draws as the moved process would have."""
    original_iter, original_next = CombinedLoader.__iter__, CombinedLoader.__next__

    @functools.wraps(original_iter)
    def __iter__(self):
        cb = _active
        if cb is None or cb.trainer.fit_loop._combined_loader is not self:
            return original_iter(self)
        return cb.iterate(self, original_iter)

    @functools.wraps(original_next)
    def __next__(self):
        cb = _active
        if cb is not None and cb.pending_rng is not None and cb.trainer.fit_loop._combined_loader is self:
            cb.put_back_rng()
        return original_next(self)

    CombinedLoader.__iter__, CombinedLoader.__next__ = __iter__, __next__


def why_not_movable(trainer, module_hooks) -> Optional[str]:
    import torch.utils.data
    strategy = type(trainer.strategy).__name__
    if strategy != "SingleDeviceStrategy":
        return f"its strategy is {strategy}: several processes or sharded state"
    if trainer.reload_dataloaders_every_n_epochs:
        return "reload_dataloaders_every_n_epochs: its loader is made anew under random states a resumed run lacks"
    if module_hooks:
        return f"its LightningModule overrides {' and '.join(module_hooks)}: state of its own that gmux does not see"
    for cb in getattr(trainer, "callbacks", []):
        name = type(cb).__name__
        if any(c.__name__ in _EPOCH_START_CHANGERS for c in type(cb).__mro__):
            return (f"its {name} callback changes the training at an epoch's start, which a resume in the middle "
                    f"of an epoch skips")
        hooks = [h for h in ("on_save_checkpoint", "on_load_checkpoint") if _callback_overrides(cb, h)]
        if hooks:
            return f"its {name} callback keeps state of its own in {' and '.join(hooks)}, which gmux does not see"
    for dl in _training_loaders(trainer):
        if not isinstance(dl, torch.utils.data.DataLoader):
            return f"its training data is a {type(dl).__name__}, not a torch DataLoader: no position to return to"
        if isinstance(dl.dataset, torch.utils.data.IterableDataset):
            return "its dataset is an IterableDataset, whose stream cannot be rewound to a position"
        if not dl.num_workers:
            drew = draws(dl.dataset, dl.collate_fn, dl.batch_size or 1)
            if drew is not None and drew.own:
                return ("its dataset or collate function draws from a random generator of its own, whose state "
                        "a resumed run does not have")
    return None


def _training_loaders(trainer) -> list:
    loader = trainer.fit_loop._combined_loader
    return loader.flattened if loader is not None else []


def carried_draws(trainer) -> Optional[str]:
    """Why a move is refused once the training loader's persistent workers have served an epoch: their dataset
    or collate function draws random numbers (or could not be tried), so their random states carry into the next
    epoch, which a new process's workers would start from their seed. In the epoch they start in, a move is exact
    (the new process's workers start from the same seed and load the same batches again)."""
    for dl in _training_loaders(trainer):
        if getattr(dl, "persistent_workers", False) and getattr(dl, "num_workers", 0):
            drew = draws(dl.dataset, dl.collate_fn, dl.batch_size or 1)
            if drew is None or drew.any():
                what = "its dataset or collate function " + ("could not be tried" if drew is None else "draws")
                return (f"persistent_workers=True, and {what}: its workers' random states carry across epochs, and "
                        f"a resumed run's workers would start anew (a move is exact only in the epoch they start in)")
    return None


def plain(value, where: str = "state"):
    """`value` as data a gmux checkpoint holds (dicts, lists, tuples, numbers, strings, tensors), or TypeError."""
    import torch
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.Tensor)):
        return value
    if isinstance(value, dict):
        return {k: plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v, f"{where}[{i}]") for i, v in enumerate(value))
    if hasattr(value, "item") and getattr(value, "shape", None) == ():    # a NumPy scalar
        return value.item()
    raise TypeError(f"{where} is a {type(value).__name__}, which a gmux checkpoint does not hold")


def _callback_class(Callback, call, version: str):
    class GmuxCallback(Callback):
        """Attaches the fit's state to the job, marks boundaries at batch ends, and restores a moved job."""

        def __init__(self, trainer, job):
            self.trainer, self.job, self.version = trainer, job, version
            self.restore_from: Optional[str] = None
            self.position: Optional[dict] = None    # where a restored process resumes its epoch
            self.epoch_start: Optional[dict] = None
            self.index = 0                            # batches of the epoch trained on at the last boundary
            self.workers_from: Optional[int] = None   # the epoch the run's first process began (its workers too)
            self.carried: Optional[str] = None        # why no move once the workers served an epoch (carried_draws)
            self.pending_rng = None    # the checkpoint's random states, until the first batch after it is fetched
            self.step_row: Optional[dict] = None    # this step's log row, as at the last command (leaving)
            self.unsaved: Optional[dict] = None     # a restored process's callbacks' state beyond their state_dict
            self.sums: Optional[dict] = None        # ... and its epoch metrics' sums so far (lightning_epoch_sums)
            self.attributes: Optional[dict] = None  # ... and its own callbacks' attributes (callback_attributes)
            self.plateaus: Optional[list] = None    # ... and the plateau steps due after its boundary (plateaus_due)
            self.metrics: dict = {}                 # ... and the trainer's callback_metrics
            self.restored = False       # restored, its first batch still to come
            self.due = False            # a boundary once the batch's last end hook has run (`after_batch_hooks`)

        # -- restoring -----------------------------------------------------------------------------------
        def resume(self, path: str, saved: dict) -> None:
            from gmux.job.generators import random_states
            random_states(saved["data"].get("rng"), path, "state 'data' 'rng'")
            self.restore_from, self.position = path, saved["data"]
            self.unsaved = saved.get("unsaved")     # put back once Lightning has restored the callbacks
            self.sums = saved.get("epoch_sums")
            self.plateaus = saved.get("plateaus_due")
            self.metrics = checked_callback_metrics(saved.get("callback_metrics"), path)
            check_epoch_sums(self.sums, path)       # (put back at on_train_start: refused before anything is)
            self.attributes = callback_attributes.check(_own_callbacks(self.trainer), saved.get("callback_attributes"),
                                                        path)
            connector = self.trainer._checkpoint_connector
            loaded = dict(saved["lightning"])

            def resume_start(checkpoint_path=None, weights_only=None):
                connector._ckpt_path = None
                connector._loaded_checkpoint = loaded
            connector.resume_start = resume_start
            connector.restore_model = lambda: None                       # gmux's restore, at on_train_start
            connector.restore_optimizers_and_schedulers = lambda: None
            continue_logs(self.trainer, saved.get("logs"), path)

        def iterate(self, loader, original):
            from gmux.job.state import capture_rng, restore_rng
            generators = _generators(loader)
            if self.position is None:
                if self.workers_from is None:
                    self.workers_from = self.trainer.current_epoch
                if self.carried and self.later_epoch():
                    frameworks.no_longer_movable(self.job, self.carried)
                self.epoch_start = {"rng": capture_rng(), "generators": [g.get_state() for g in generators]}
                return original(loader)
            position, self.position = self.position, None
            restore_rng(position["rng"])
            for g, state in zip(generators, position["generators"]):
                g.set_state(state)
            self.epoch_start = {"rng": position["rng"], "generators": position["generators"]}
            # persistent workers started in an earlier epoch drew their base seed then, not at this epoch's start:
            # the new process's workers draw theirs from a generator of their own (they draw nothing: checked)
            self.workers_from = position.get("workers_from", self.trainer.current_epoch)
            later = self.later_epoch()
            it = _seeded_apart(loader, original) if later else original(loader)
            for _ in range(position["index"]):
                next(it)
            self.index = position["index"]
            return it

        def later_epoch(self) -> bool:
            """Whether the run's persistent workers (if any) were started in an earlier epoch."""
            return self.trainer.current_epoch > self.workers_from

        def on_train_start(self, trainer, pl_module):
            from gmux.job.state import capture_rng
            hooks = [h for h in ("on_save_checkpoint", "on_load_checkpoint") if _overrides(pl_module, h)]
            schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
            scaler = getattr(trainer.precision_plugin, "scaler", None)
            if self.restore_from is not None:
                self.epoch_start_again(trainer, pl_module)
            why = why_not_movable(trainer, hooks)
            self.carried = carried_draws(trainer) if why is None else None
            frameworks.attach(self.job, FRAMEWORK, [pl_module, *trainer.strategy.optimizers, *schedulers, scaler],
                              why, self.refresh, self.leaving)
            if self.restore_from is not None:
                due = checked_plateaus(trainer, self.plateaus, self.restore_from)   # (before anything is restored)
                put_back_unsaved(trainer, self.unsaved, self.restore_from)
                # (after what the callbacks' on_train_start and, done again, on_train_epoch_start set up)
                callback_attributes.put_back(_own_callbacks(trainer), self.attributes, pl_module.device)
                carry_epoch_sums(trainer, self.sums, self.restore_from)
                self.job.restore(self.restore_from)
                self.job.restored_from = self.restore_from   # gmux-launch checks that the move was restored
                put_back_callback_metrics(trainer, self.metrics)
                step_plateaus(trainer, due)     # (due after the boundary: after the schedulers' restore)
                # put back again when the first batch is fetched: hooks run after this one (the module's own
                # on_train_start) may draw, as they did once in the first process, long before the checkpoint
                self.pending_rng = capture_rng()
                self.restore_from = None
                self.restored = True

        def epoch_start_again(self, trainer, pl_module) -> None:
            """Lightning's resume in the middle of an epoch skips on_train_epoch_start: what the script's own
            module and callbacks without a state of their own do there (freeze a layer from an epoch on) is done
            again, before the checkpoint's state is restored over what it set (its random draws too)."""
            if _overrides(pl_module, "on_train_epoch_start"):
                call._call_lightning_module_hook(trainer, "on_train_epoch_start")
            for cb in trainer.callbacks:
                pure = any(c.__name__ in _EPOCH_START_PURE for c in type(cb).__mro__)
                # (one with a state of its own has it back from Lightning already, as the hook had left it)
                own_state = _overrides(cb, "state_dict")
                if cb is not self and (pure or (_overrides(cb, "on_train_epoch_start") and not own_state)):
                    cb.on_train_epoch_start(trainer, pl_module)

        def put_back_rng(self) -> None:
            from gmux.job.state import restore_rng
            restore_rng(self.pending_rng)
            self.pending_rng = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.due = False    # (one the last batch's end never took: its hooks raised, or none ran after them)
            if self.pending_rng is not None:    # a loader fetched ahead, before on_train_start: the step at least
                self.put_back_rng()
            if self.restored:
                # Lightning's restore leaves its fit loop "restarting" until the epoch ends, and skips the
                # ReduceLROnPlateau step at that end (a metric it assumes lost): this epoch validates here, as it
                # did unmoved, whose plateau scheduler steps on it (before: a moved run's did not, and trained on
                # with its LR unreduced). Its setup, which the flag is for, is over by the first batch.
                self.restored = False
                trainer.fit_loop._restarting = False       # (the fit loop's own; its inner loops' stay as set)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            done = batch_idx + 1
            loop = trainer.fit_loop.epoch_loop
            if done % trainer.accumulate_grad_batches or loop.batch_progress.is_last_batch:
                return      # gradients pending, or the epoch's end still to run
            try:
                validating = loop._should_check_val_fx(trainer.fit_loop._data_fetcher)
            except Exception:
                return      # cannot tell: no boundary rather than one before a validation run
            if validating:
                return
            self.index = done
            if self.after_batch_hooks(trainer):
                self.due = True
            else:
                self.job.boundary()

        def after_batch_hooks(self, trainer) -> bool:
            """The boundary comes once the batch's end hooks have all run: the module's on_train_batch_end runs
            after every callback's, and so do the callbacks Lightning orders after gmux's (ModelCheckpoint). A
            process restored at the boundary resumes with the next batch: before, at a move's batch, the module's
            hook (an EMA update, a count) ran in neither process. The logger connector's batch end follows them
            in the training loop (and in evaluation's, where no boundary is due). False where it has none (then
            the boundary is taken at gmux's hook)."""
            connector = trainer._logger_connector
            if "on_batch_end" in connector.__dict__:
                return True
            original = getattr(connector, "on_batch_end", None)
            if not callable(original):
                return False

            @functools.wraps(original)
            def on_batch_end(*args, **kwargs):
                done = original(*args, **kwargs)
                if self.due:
                    self.due = False
                    self.job.boundary()
                return done
            connector.on_batch_end = on_batch_end
            return True

        def leaving(self) -> None:
            """The process leaves at this boundary (a move, a spill by exit). Lightning logs a step's metrics
            only after its batch-end hooks, where the boundary is: the row taken at the boundary (`refresh`) is
            logged now, at the step Lightning would give it, and flushed, so that the next process goes on after
            it."""
            if self.step_row:
                self.trainer._logger_connector.log_metrics(dict(self.step_row))
            for logger in self.trainer.loggers:
                logger.save()

        def _step_row(self) -> Optional[dict]:
            """The metrics Lightning will log for this step after the batch-end hooks (None: none this step), as
            plain numbers: taken before a suspend, whose tensors a spill's exit may no longer reach."""
            trainer = self.trainer
            connector = trainer._logger_connector
            if trainer.fit_loop._should_accumulate() and trainer.lightning_module.automatic_optimization:
                return None
            if not (connector.should_update_logs or trainer.fast_dev_run):
                return None
            return {k: v.item() if hasattr(v, "item") else v for k, v in connector.metrics["log"].items()}

        def refresh(self) -> None:
            trainer = self.trainer
            self.step_row = self._step_row()
            saved = {
                "epoch": trainer.current_epoch, "global_step": trainer.global_step,
                "pytorch-lightning_version": self.version,
                "loops": trainer._checkpoint_connector._get_loops_state_dict(),
                "callbacks": call._call_callbacks_state_dict(trainer),
            }
            precision = trainer.precision_plugin.state_dict()
            if precision:
                saved[trainer.precision_plugin.__class__.__qualname__] = precision
            if trainer.datamodule is not None:
                state = call._call_lightning_datamodule_hook(trainer, "state_dict")
                if state:
                    saved[trainer.datamodule.__class__.__qualname__] = state
            self.job.tracked.state["lightning"] = plain(saved, "lightning state")
            self.job.tracked.state["unsaved"] = unsaved_state(trainer)
            own = _own_callbacks(trainer)
            self.job.tracked.state["callback_attributes"] = callback_attributes.capture(own)
            uncarried = callback_attributes.not_carried(own)
            if uncarried is not None:     # (a move asked now is refused with it)
                frameworks.no_longer_movable(self.job, uncarried)
            self.job.tracked.state["epoch_sums"] = epoch_sums(trainer)
            self.job.tracked.state["plateaus_due"] = plateaus_due(trainer, self.index)
            self.job.tracked.state["callback_metrics"] = callback_metrics(trainer)
            self.job.tracked.state["logs"] = logger_versions(trainer)
            self.job.tracked.state["data"] = {**(self.epoch_start or {}), "index": self.index,
                                              "workers_from": self.workers_from}

    return GmuxCallback


def _callback_overrides(callback, hook: str) -> bool:
    """Whether a callback's class, Lightning's own included, defines `hook` (the base Callback's does not count)."""
    for cls in type(callback).__mro__:
        if hook in cls.__dict__:
            return not (cls.__name__ == "Callback" and cls.__module__.startswith(("lightning.", "pytorch_lightning.")))
    return False


def _own_callbacks(trainer) -> dict:
    """The script's own callbacks whose attributes gmux carries: not one with a state_dict(), which Lightning's
    restore puts back."""
    return callback_attributes.own(trainer.callbacks, lambda cb: _overrides(cb, "state_dict"))


def _overrides(obj, hook: str) -> bool:
    """Whether the class of the user's LightningModule or callback defines `hook` (Lightning's own do not count)."""
    for cls in type(obj).__mro__:
        if hook in cls.__dict__:
            return not cls.__module__.startswith(("lightning.", "pytorch_lightning."))
    return False


def _seeded_apart(loader, original):
    """`original(loader)` with each persistent-worker DataLoader's base seed drawn from a scratch generator."""
    from gmux.job.data import workers_seeded_apart
    with workers_seeded_apart(dl for dl in loader.flattened
                              if getattr(dl, "persistent_workers", False) and getattr(dl, "num_workers", 0)):
        return original(loader)


def _generators(loader) -> list:
    """The torch generators that decide the epoch's order and its workers' seeds, each once."""
    found = []
    for dl in loader.flattened:
        for g in (getattr(dl, "generator", None), getattr(getattr(dl, "sampler", None), "generator", None)):
            if g is not None and not any(g is f for f in found):
                found.append(g)
    return found

