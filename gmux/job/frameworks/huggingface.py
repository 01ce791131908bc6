"""Hugging Face `transformers.Trainer` (which trains through `accelerate`) as an explicit-mode gmux job.

Boundary: the end of each optimizer step (`TrainerCallback.on_step_end`: the scheduler has stepped, gradients
are cleared, `global_step` counts the step; gradient accumulation is never mid-cycle there), once the Trainer's
work after the step is over (`_after_step_work`: its log, its evaluations and their comparison of a best metric,
its save), so that recipes logging, evaluating or saving every step get one at every step. None at a step after
which the training or the epoch stops, nor at an epoch's last step where the Trainer logs, evaluates or saves by
epoch, or where a callback of the script's own acts: a process restored there would skip that work, as the
Trainer's own resume does. A restored process does not evaluate at its start (`eval_on_start`) again.

State: the model, the optimizer (the torch optimizer inside accelerate's wrapper), the LR scheduler and the AMP
scaler, as tensors the runtime moves; the random states; `TrainerState` (global step, epoch, the stateful
callbacks' states) as JSON in the job's state; and the running totals of the `train()` call (`_RUN_TOTALS`: the
loss summed since the last log and over the call, the FLOPs not yet added to `total_flos`, where the call began),
so that a moved run logs the same losses, train_loss and total_flos as an unmoved one (the Trainer's own resume
restarts them; a Trainer that keeps them in locals, as older transformers did, restarts them here too).

Restore, in the process started after a move: `train()` is run with the Trainer's own `resume_from_checkpoint`
pointing at a directory holding only that `trainer_state.json`, so the Trainer computes the epoch and the
batches to skip itself (accelerate's `skip_first_batches`; its seeded sampler gives each epoch the same order
in any process); its loading of weights, optimizer, scheduler and scaler is replaced by gmux's restore of the
checkpoint at `on_train_begin` (checked against the live objects before anything is applied), and its loading
of the random states by the states the checkpoint holds. accelerate fetches one batch ahead, so at a boundary the
next step's first batch was already fetched (indexed and collated), under the random states of before the step;
the checkpoint keeps those too (`fetch_rng`), and a restored process fetches that batch under them and the one
after it under the checkpoint's, as the unmoved process did: a random transform of the dataset, a collator
drawing masks or noise, draw the same (`_Fetches`: where each fetch begins is seen through the dataset's
`__getitems__`, or through the collate function where the dataset is evaluated on too).

A move would change results, and is refused (`why_not_movable`), with DeepSpeed or FSDP (they shard and
checkpoint the state themselves), several processes, an IterableDataset (its stream cannot be rewound to a
position), a training loader that is not a torch DataLoader (accelerate cannot skip in it), a shuffling sampler
other than accelerate's seeded one and those drawing from torch's stream (a custom sampler: the epoch's order
would differ; `group_by_length`'s and, under `use_seedable_sampler=False`, torch's RandomSampler move: `_EpochOrder`
keeps the states its epoch's order was drawn under), data-loader workers whose dataset or collator draws random numbers
(their seeds come from the random state when the epoch's iterator starts, and a restored process's workers
load other batches first; whether they draw is tried once on a first batch, in a child process forked as
workers are: gmux.job.data_draws) or that persist (`dataloader_persistent_workers`: measured, a later epoch's
order is not a new loader's), a dataset or collator drawing from a generator of its own (a masking collator's
`seed=`, found by name or because the trial's batch comes out otherwise from the same random states: its state is
not the job's), with no workers a dataset that draws as it is indexed and is evaluated on too (the batch fetched
ahead would be indexed again under other states), and `ignore_data_skip=True`.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import sys
import tempfile
from typing import Optional

import torch.utils.data

from gmux.job import frameworks
from gmux.job.frameworks import callback_attributes
from gmux.job.data_draws import draws

FRAMEWORK = "huggingface"
_EXACT_SAMPLERS = ("SequentialSampler", "SeedableRandomSampler", "_EpochOrder")
# samplers that draw an epoch's order from torch's stream when their iteration starts (no generator of their own)
_FROM_STREAM = ("LengthGroupedSampler", "RandomSampler")
_MASKING = ("DataCollatorForLanguageModeling", "DataCollatorForPermutationLanguageModeling")
_LOADERS = ("_load_from_checkpoint", "_load_optimizer_and_scheduler", "_load_scaler", "_load_rng_state")
_STEP_WORK = "_maybe_log_save_evaluate"
# The Trainer's running totals of a train() call (set before on_train_begin, where a restored process puts the
# moved ones back), and whether each counts steps (a whole number) or sums (a number)
_RUN_TOTALS = {"_tr_loss": float, "_total_loss_scalar": float, "current_flos": float,
               "_globalstep_last_logged": int, "_initial_global_step": int, "_initial_num_input_tokens_seen": int}


def patch(module) -> None:
    Trainer = module.Trainer
    if getattr(Trainer, "_gmux_patched", False):
        return
    original = Trainer.train
    Callback = _callback_class(module.TrainerCallback)

    @functools.wraps(original)
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        job = frameworks.job()
        if job is None:
            return original(self, resume_from_checkpoint, *args, **kwargs)
        callback = Callback(self, job)
        callback_attributes.remember(_own_callbacks(self))     # (before any hook: a move carries what they change)
        self.add_callback(callback)
        callback.after_step_work = _after_step_work(self, callback)
        frameworks.started()
        path = frameworks.take_restore()
        scratch, evaluates_at_start = None, False
        try:
            if path is not None:
                if resume_from_checkpoint:   # a checkpoint of its own, older than the one the job was moved with
                    print(f"gmux: resuming from {path} (where this job was moved from), not from "
                          f"{resume_from_checkpoint!r}", file=sys.stderr)
                scratch = tempfile.mkdtemp(prefix="gmux-hf-")
                saved = frameworks.saved_state(path, FRAMEWORK)
                from gmux.job.generators import random_states
                for name in ("fetch_rng", "order_rng"):
                    if saved.get(name) is not None:
                        setattr(callback, name, random_states(saved[name], path, f"state '{name}'"))
                with open(os.path.join(scratch, "trainer_state.json"), "w") as f:
                    f.write(saved["trainer_state"])
                callback.totals = _run_totals(saved.get("run_totals"), path)
                _put_back_callback_states(self, saved["trainer_state"], callback, path)
                callback.attributes = callback_attributes.check(_own_callbacks(self), saved.get("callback_attributes"),
                                                                path)
                callback.restore_from = path
                _take_over_loading(self, callback)
                resume_from_checkpoint = scratch
                # (the first process evaluated at its start, in the log history it was moved with)
                evaluates_at_start = bool(getattr(self.args, "eval_on_start", False))
                if evaluates_at_start:
                    self.args.eval_on_start = False
            return original(self, resume_from_checkpoint, *args, **kwargs)
        finally:
            if evaluates_at_start:
                self.args.eval_on_start = True
            frameworks.finished(job)
            if callback.fetches is not None:
                callback.fetches.remove()
            self.remove_callback(callback)
            for name in (*_LOADERS, _STEP_WORK):
                self.__dict__.pop(name, None)
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    Trainer.train = train
    Trainer._gmux_patched = True


def _after_step_work(trainer, callback) -> bool:
    """The Trainer's work after a step (its log; its evaluations, of every eval dataset, with the best-metric
    comparison, a plateau scheduler's step and a trial's report; its save) is one method in every version, after
    which only its stop check runs before the next batch: the step's boundary follows it. The batches evaluation
    fetches, through the training dataset too (a Subset of it), are not the training loader's (`_Fetches`).
    False where a Trainer has no such method (then a step it logs, evaluates or saves after gets no boundary)."""
    work = getattr(trainer, _STEP_WORK, None)
    if not callable(work):
        return False

    @functools.wraps(work)
    def then_boundary(*args, **kwargs):
        callback.in_step_work = True
        try:
            done = work(*args, **kwargs)
        finally:
            callback.in_step_work = False
        callback.step_work_done()
        return done
    setattr(trainer, _STEP_WORK, then_boundary)
    return True


def _put_back_callback_states(trainer, trainer_state: str, gmux_callback, path: str) -> None:
    """The stateful callbacks' states (`ExportableState`: EarlyStoppingCallback's patience counter) as the moved
    run left them, into the script's own callback objects. The Trainer's resume puts them back only when the script
    asks (`restore_callback_states_from_checkpoint`, False by default): a moved run's early stopping counted its
    patience from 0 again, and stopped later than an unmoved one. The script built its callbacks with the same
    arguments again; their attributes are what changed."""
    from gmux.job.checkpoint import CheckpointError
    try:
        stored = json.loads(trainer_state).get("stateful_callbacks") or {}
    except (ValueError, AttributeError):
        raise CheckpointError(path, "its Trainer state is not a JSON object") from None
    if not isinstance(stored, dict):
        raise CheckpointError(path, "its Trainer state's stateful_callbacks is not a JSON object")
    taken = []
    for name, states in stored.items():
        mine = [cb for cb in trainer.callback_handler.callbacks
                if type(cb).__name__ == name and cb is not gmux_callback]
        for cb, state in zip(mine, states if isinstance(states, list) else [states]):
            attributes = state.get("attributes") if isinstance(state, dict) else None
            if not isinstance(attributes, dict) or not all(
                    isinstance(a, str) and _plain_like(getattr(cb, a, _MISSING), v) for a, v in attributes.items()):
                raise CheckpointError(path, f"its Trainer state's attributes for its {name[:40]!r} are not what "
                                            f"the callback holds")
            taken.append((cb, attributes))
    for cb, attributes in taken:        # (all checked first: a refusal sets nothing)
        for attribute, value in attributes.items():
            setattr(cb, attribute, value)


_MISSING = object()


def _plain_like(now, value) -> bool:
    """Whether a callback's attribute may take `value` (JSON) from a checkpoint: one it has, holding plain data (not
    a method), and `value` of its kind (a number for a number; either None)."""
    if now is None:
        return True
    return _kind(now) is not None and (value is None or _kind(now) == _kind(value))


def _kind(v):
    # (bool before the numbers: True is an int)
    return bool if isinstance(v, bool) else "number" if isinstance(v, (int, float)) else \
        type(v) if isinstance(v, (str, list, dict)) else None


def _take_over_loading(trainer, callback) -> None:
    """The Trainer's resume loads weights, optimizer, scheduler and scaler from files gmux did not write; gmux
    restores them itself at on_train_begin. Its random states are the checkpoint's, set where it sets them."""
    nothing = lambda *args, **kwargs: None   # noqa: E731
    trainer._load_from_checkpoint = nothing
    trainer._load_optimizer_and_scheduler = nothing
    trainer._load_scaler = nothing
    trainer._load_rng_state = lambda checkpoint: callback.put_back_rng()


def why_not_movable(trainer, train_dataloader, fetches_seen: bool = False) -> Optional[str]:
    """Why continuing this Trainer in a new process could change its results; None if it cannot.
    `fetches_seen`: gmux sees where each training batch's fetch begins (its dataset's `__getitems__`)."""
    args = trainer.args
    if getattr(trainer, "is_deepspeed_enabled", False):
        return "DeepSpeed shards and checkpoints the training state itself"
    if getattr(trainer, "is_fsdp_enabled", False):
        return "FSDP shards the training state across processes"
    if args.world_size > 1:
        return f"it trains in {args.world_size} processes"
    if args.ignore_data_skip:
        return "ignore_data_skip=True: a resumed run would not skip the batches already trained on"
    if isinstance(trainer.train_dataset, torch.utils.data.IterableDataset):
        return "its dataset is an IterableDataset, whose stream cannot be rewound to a position"
    loader = getattr(train_dataloader, "base_dataloader", train_dataloader)
    if not isinstance(loader, torch.utils.data.DataLoader):
        return (f"its training data is a {type(loader).__name__}, not a torch DataLoader: accelerate cannot skip "
                f"to a position in it")
    if loader.num_workers and loader.persistent_workers:
        return ("dataloader_persistent_workers=True: an epoch after the first is drawn in an order that a new "
                "process's loader does not give for that epoch")
    collate = getattr(loader.collate_fn, "gmux_collate", loader.collate_fn)     # (not gmux's own fetch hook)
    drew = draws(loader.dataset, collate, getattr(args, "train_batch_size", None) or 1)
    if loader.num_workers and (drew is None or drew.any()):
        what = ("draw random numbers as its dataset is indexed" if drew.indexed else
                "draw random numbers as its collator collates" if drew.collated else
                "draw from a random generator of their data's own") if drew else \
            "may draw random numbers (a batch of its data could not be tried)"
        return f"its data loader's worker processes {what}, under seeds a resumed run's workers do not have"
    if drew and drew.own:
        return ("its dataset or data collator draws from a random generator of its own (a collator's seed=), "
                "whose state a resumed run does not have")
    if drew and drew.indexed and not fetches_seen:
        return ("its dataset draws random numbers as it is indexed (a random transform), and a resumed run "
                "would index the batch fetched ahead again under other random states")
    collator = type(getattr(trainer, "data_collator", None))
    if any(c.__name__ in _MASKING for c in collator.__mro__) and \
            getattr(trainer.data_collator, "seed", None) is not None:
        return (f"its data collator ({collator.__name__}) draws masks from a generator of its own (seed=), whose "
                f"state a resumed run does not have")
    sampler = getattr(getattr(train_dataloader, "batch_sampler", None), "sampler", None) \
        or getattr(train_dataloader, "sampler", None)
    name = type(sampler).__name__
    if sampler is not None and name not in _EXACT_SAMPLERS:
        return (f"its training data is drawn by a {name}, whose order a resumed run does not reproduce "
                f"(accelerate's seeded sampler does: accelerator_config use_seedable_sampler=True, the default)")
    return None


def _callback_class(TrainerCallback):
    class GmuxCallback(TrainerCallback):
        """Attaches the Trainer's state to the job and marks a boundary at the end of each step."""

        def __init__(self, trainer, job):
            self.trainer, self.job = trainer, job
            self.restore_from: Optional[str] = None
            self.totals: dict = {}      # a restored process: the moved run's totals (_RUN_TOTALS)
            self._rng = None
            self.fetch_rng = None       # a restored process: the states the first batch it fetches was fetched under
            self.fetches: Optional[_Fetches] = None
            self.order: Optional[_EpochOrder] = None
            self.order_rng = None       # a restored process: the states its epoch's order was drawn under
            self.attributes: Optional[dict] = None     # ... and its own callbacks' (callback_attributes)
            self._step_ended = False
            self.after_step_work = False    # the Trainer's work after a step is wrapped (`_after_step_work`)
            self.in_step_work = False
            # a callback of the script's own acting at an epoch's end (an evaluation of its own): no boundary at
            # the epoch's last step, which a restored process would resume after that act
            self._acts_at_epoch_end = any(
                "on_epoch_end" in c.__dict__ and not c.__module__.startswith("transformers.")
                for cb in trainer.callback_handler.callbacks for c in type(cb).__mro__)

        def on_train_begin(self, args, state, control, **kwargs):
            trainer = self.trainer
            optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)     # accelerate's wrapper
            # (one gmux cannot keep leaves the job unmovable: gmux.job.frameworks.attach)
            scheduler = getattr(trainer.lr_scheduler, "scheduler", trainer.lr_scheduler)
            loader = getattr(kwargs.get("train_dataloader"), "base_dataloader", kwargs.get("train_dataloader"))
            if isinstance(loader, torch.utils.data.DataLoader) and not loader.num_workers \
                    and getattr(self.fetches, "loader", None) is not loader:
                if self.fetches is not None:     # a loader made again (auto_find_batch_size retries smaller)
                    self.fetches.remove()
                self.fetches = _Fetches(self, loader, _eval_datasets(trainer))
            batch_sampler = getattr(loader, "batch_sampler", None)
            drawn = getattr(batch_sampler, "sampler", None)
            if (type(drawn).__name__ in _FROM_STREAM and getattr(drawn, "generator", 1) is None
                    and hasattr(kwargs.get("train_dataloader"), "base_dataloader")):
                batch_sampler.sampler = self.order = _EpochOrder(drawn, self)
            frameworks.attach(self.job, FRAMEWORK,
                              [trainer.model, optimizer, scheduler, getattr(trainer.accelerator, "scaler", None)],
                              why_not_movable(trainer, kwargs.get("train_dataloader"),
                                              self.fetches is not None and self.fetches.dataset is not None),
                              self.refresh)
            if self.restore_from is not None:
                from gmux.job.state import capture_rng
                self.job.restore(self.restore_from)
                self.job.restored_from = self.restore_from   # gmux-launch checks that the move was restored
                self._rng = capture_rng()     # the Trainer sets these once it has skipped to the position
                self.restore_from = None
                for name, value in self.totals.items():
                    if name == "_tr_loss" and hasattr(trainer, name):
                        trainer._tr_loss.fill_(value)          # (a tensor on the device, summed there)
                    elif hasattr(trainer, name):
                        setattr(trainer, name, value)

        def put_back_rng(self) -> None:
            if self._rng is not None:
                from gmux.job.state import restore_rng
                restore_rng(self._rng)
                self._rng = None

        def on_epoch_begin(self, args, state, control, **kwargs):
            # (after what the script's callbacks set up at the run's and the epoch's start, again in this process)
            callback_attributes.put_back(_own_callbacks(self.trainer), self.attributes, args.device)
            self.attributes = None

        def on_step_begin(self, args, state, control, **kwargs):
            self._step_ended = False

        def on_step_end(self, args, state, control, **kwargs):
            epoch_ends = state.epoch is not None and float(state.epoch).is_integer() and (any(
                getattr(s, "value", s) == "epoch"
                for s in (args.eval_strategy, args.save_strategy, args.logging_strategy))
                or self._acts_at_epoch_end)
            if control.should_training_stop or control.should_epoch_stop or epoch_ends:
                return     # the Trainer acts at the epoch's end, or ends; a restored process would not
            if self.after_step_work:
                self._step_ended = True     # the boundary follows the step's log, evaluations and save
            elif not (control.should_log or control.should_evaluate or control.should_save):
                self.job.boundary()

        def step_work_done(self) -> None:
            """The Trainer's work after a step is over (`_after_step_work`): the boundary, unless a callback
            stopped the epoch or the training meanwhile (a loss threshold, early stopping)."""
            control = self.trainer.control
            if self._step_ended:
                self._step_ended = False
                if not (control.should_training_stop or control.should_epoch_stop):
                    self.job.boundary()

        def refresh(self) -> None:
            """TrainerState, with the stateful callbacks' states as they are now (as the Trainer saves it)."""
            trainer = self.trainer
            exportable = [cb for cb in trainer.callback_handler.callbacks + [trainer.control]
                          if hasattr(cb, "state") and callable(cb.state) and cb is not self]
            callbacks = {}
            for cb in exportable:
                callbacks.setdefault(cb.__class__.__name__, []).append(cb.state())
            trainer.state.stateful_callbacks = {k: v[0] if len(v) == 1 else v for k, v in callbacks.items()}
            self.job.tracked.state["trainer_state"] = json.dumps(dataclasses.asdict(trainer.state), sort_keys=True)
            own = _own_callbacks(trainer)
            self.job.tracked.state["callback_attributes"] = callback_attributes.capture(own)
            uncarried = callback_attributes.not_carried(own)
            if uncarried is not None:     # (a move asked now is refused with it)
                frameworks.no_longer_movable(self.job, uncarried)
            self.job.tracked.state["run_totals"] = json.dumps(
                {name: float(getattr(trainer, name)) if kind is float else getattr(trainer, name)
                 for name, kind in _RUN_TOTALS.items() if hasattr(trainer, name)})
            gradient = trainer.accelerator.gradient_state
            mid_epoch = gradient.in_dataloader and not gradient.end_of_dataloader
            self.job.tracked.state["fetch_rng"] = self.fetches.before if self.fetches and mid_epoch else None
            self.job.tracked.state["order_rng"] = self.order.before if self.order and mid_epoch else None

    return GmuxCallback


class _Fetches:
    """Where each batch of the training loader is fetched: noted at the start of its dataset's `__getitems__`
    (torch's fetcher calls it before it indexes; an attribute of the dataset while the Trainer trains), or at its
    collate function where the dataset takes no attribute or is evaluated on too. Each fetch notes the random
    states it starts under; in a restored process the first fetch starts under the states that batch had unmoved
    and the second under the checkpoint's (the Trainer's own loading of them comes after both: held back)."""

    def __init__(self, callback, loader, eval_datasets: list):
        self.callback, self.loader, self.before, self._second = callback, loader, None, False
        self.dataset = loader.dataset if all(loader.dataset is not d for d in eval_datasets) else None
        if self.dataset is not None:
            own, dataset = getattr(self.dataset, "__getitems__", None), self.dataset

            def getitems(indices):
                self.note()
                return own(indices) if own is not None else [dataset[i] for i in indices]
            try:
                dataset.__getitems__ = getitems
            except (AttributeError, TypeError):
                self.dataset = None
        if self.dataset is None:
            collate = loader.collate_fn

            def collated(items):
                self.note()
                return collate(items)
            collated.gmux_collate = collate
            loader.collate_fn = collated

    def note(self) -> None:
        from gmux.job.state import capture_rng, restore_rng
        cb = self.callback
        if cb.in_step_work:
            return          # an evaluation's batch (a Subset of the training dataset), not the training loader's
        if cb.fetch_rng is not None:
            restore_rng(cb.fetch_rng)
            cb.fetch_rng, self._second = None, True
        elif self._second or cb._rng is not None:   # its second fetch, or a first with none fetched ahead
            self._second = False
            cb.put_back_rng()
        self.before = capture_rng()

    def remove(self) -> None:
        """The dataset as the script gave it (the loader is the Trainer's, and ends with the training)."""
        if self.dataset is not None:
            self.dataset.__dict__.pop("__getitems__", None)


class _EpochOrder:
    """The training sampler of an order drawn from torch's stream at each epoch (`group_by_length`'s): notes the
    random states its iteration starts under; a restored process draws its epoch's order under those noted in
    the first process, then goes on under the states it had."""

    def __init__(self, sampler, callback):
        self.sampler, self.callback, self.before = sampler, callback, None

    def __iter__(self):
        from gmux.job.state import capture_rng, restore_rng
        cb = self.callback
        if cb.order_rng is None:
            self.before = capture_rng()
            return iter(self.sampler)
        found = capture_rng()
        restore_rng(cb.order_rng)
        self.before, cb.order_rng = cb.order_rng, None
        order = list(self.sampler)          # (drawn now, under those states)
        restore_rng(found)
        return iter(order)

    def __len__(self):
        return len(self.sampler)

    def __getattr__(self, name):            # set_epoch, lengths, ...
        if name.startswith("__") or name == "sampler":
            raise AttributeError(name)
        return getattr(self.sampler, name)


def _run_totals(text, path: str) -> dict:
    """The running totals a checkpoint holds (none in one written before gmux kept them), checked before use."""
    if text is None:
        return {}
    from gmux.job.checkpoint import CheckpointError
    try:
        totals = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        totals = None
    if not isinstance(totals, dict):
        raise CheckpointError(path, "state 'run_totals' is not a JSON object")
    for name, value in totals.items():
        kind = _RUN_TOTALS.get(name)
        if kind is None or isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (kind is int and not isinstance(value, int)) or not math.isfinite(value):
            raise CheckpointError(path, f"state 'run_totals': {str(name)[:40]!r} = {str(value)[:40]!r} is not "
                                        f"one of the Trainer's totals")
    return {name: kind(totals[name]) for name, kind in _RUN_TOTALS.items() if name in totals}


def _own_callbacks(trainer) -> dict:
    """The script's own callbacks whose attributes gmux carries: not an ExportableState, whose state() the Trainer
    saves (_put_back_callback_states)."""
    return callback_attributes.own(trainer.callback_handler.callbacks, lambda cb: callable(getattr(cb, "state", None)))


def _eval_datasets(trainer) -> list:
    found = getattr(trainer, "eval_dataset", None)
    return list(found.values()) if isinstance(found, dict) else [found]

