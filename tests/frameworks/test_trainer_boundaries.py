"""Where a real Hugging Face Trainer gets its boundaries (gmux/job/frameworks/huggingface.py), driven in this
process with a job that records them: a step the Trainer logs after still gets one, once the log is written."""
import importlib.util
import os
import tempfile

import pytest
import torch
from torch import nn

from gmux.job import frameworks
from gmux.job.job import Job
from gmux.job.state import TrackedState

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers not installed (pip install -e .[test])")


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def forward(self, x, labels=None):
        pred = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(pred, labels), "logits": pred}


def _boundaries(monkeypatch, callbacks=(), events=None, evaluated_on=None, points=list, at_boundary=None,
                scheduler=None, **arguments) -> tuple[list, list]:
    """Trains 8 steps; returns the global steps at which the job got a boundary, and those the Trainer logged.
    `events`: a list each boundary is also noted in, as ("boundary", step); `evaluated_on`: the eval dataset, from
    the training dataset (default: its first 16 points); `points`: makes the training dataset from a list of 64
    points; `at_boundary`: called with gmux's callback at each boundary; `scheduler`: builds the LR scheduler
    given to the Trainer (optimizers=) from its AdamW."""
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from gmux.job.frameworks import huggingface
    monkeypatch.setattr(frameworks, "_runs", 0)
    job = Job(TrackedState(), device="cpu")
    x = torch.randn(64, 4)
    data = points([{"x": x[i], "labels": x[i].sum()} for i in range(64)])
    out = tempfile.TemporaryDirectory(prefix="hf-out-")        # (checkpoints, where it saves)
    args = TrainingArguments(output_dir=out.name, per_device_train_batch_size=8,
                             report_to="none", use_cpu=True, disable_tqdm=True,
                             **{"max_steps": 8, "save_strategy": "no", **arguments})
    evaluated_on = evaluated_on or (lambda points: points[:16])
    model = Regressor()
    given = {}
    if scheduler is not None:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        given["optimizers"] = (opt, scheduler(opt))
    trainer = Trainer(model=model, args=args, **given, train_dataset=data, eval_dataset=evaluated_on(data),
                      data_collator=lambda items: {k: torch.stack([torch.as_tensor(it[k]) for it in items])
                                                   for k in items[0]}, callbacks=list(callbacks))
    marks = []
    events = [] if events is None else events
    monkeypatch.setattr(job, "boundary", lambda: marks.append(trainer.state.global_step) or
                        events.append(("boundary", trainer.state.global_step)) or
                        (at_boundary and at_boundary(callback)))
    frameworks.started()
    callback = huggingface._callback_class(TrainerCallback)(trainer, job)
    trainer.add_callback(callback)
    callback.after_step_work = huggingface._after_step_work(trainer, callback)     # (as the patched train() does)
    with out:
        trainer.train()
    logged = [entry["step"] for entry in trainer.state.log_history if "loss" in entry]
    return marks, logged


def test_a_trainer_logging_every_step_gets_a_boundary_after_each_log(monkeypatch):
    """Before: logging_steps=1 (common in fine-tuning recipes) gave no boundary at all, so the job could be
    neither suspended at a step nor moved."""
    marks, logged = _boundaries(monkeypatch, logging_steps=1)
    assert logged == list(range(1, 9))
    assert marks == list(range(1, 8))        # the last step ends training: none after it


def test_steps_that_evaluate_get_theirs_once_the_evaluation_is_over(monkeypatch):
    """Before: a step followed by an evaluation got no boundary, so a recipe evaluating every step
    (eval_steps=1) could be neither suspended at a step nor moved."""
    evaluated = []
    seen = type("Seen", (__import__("transformers").TrainerCallback,),
                {"on_evaluate": lambda self, args, state, control, **k: evaluated.append(state.global_step)})
    marks, logged = _boundaries(monkeypatch, callbacks=[seen()], logging_steps=3, eval_strategy="steps",
                                eval_steps=2, per_device_eval_batch_size=8)
    assert logged == [3, 6] and evaluated == [2, 4, 6, 8] and marks == list(range(1, 8))
    marks, _ = _boundaries(monkeypatch, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
    assert marks == list(range(1, 8))


def test_a_step_the_trainer_saves_after_gets_its_boundary_once_the_checkpoint_is_written(monkeypatch):
    saved = []
    seen = type("Seen", (__import__("transformers").TrainerCallback,),
                {"on_save": lambda self, args, state, control, **k: saved.append(state.global_step)})
    marks, _ = _boundaries(monkeypatch, callbacks=[seen()], save_strategy="steps", save_steps=1)
    assert saved == list(range(1, 9)) and marks == list(range(1, 8))
    marks, _ = _boundaries(monkeypatch, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=8,
                           save_strategy="steps", save_steps=4)
    assert marks == list(range(1, 8))


def test_the_boundary_follows_every_evaluation_of_the_step_and_the_best_metrics_comparison(monkeypatch):
    """Before (a boundary at the first on_evaluate): with a dict of eval datasets, the others were evaluated
    after it (a restored process would skip them, and each eval loader's seed draw); a best metric was compared
    after it. Now the boundary follows the Trainer's whole work after the step."""
    from transformers import TrainerCallback
    events = []
    seen = type("Seen", (TrainerCallback,), {
        "on_evaluate": lambda self, args, state, control, **k: events.append(("evaluate", state.global_step)),
        "on_save": lambda self, args, state, control, **k: events.append(("save", state.global_step))})
    marks, _ = _boundaries(monkeypatch, callbacks=[seen()], events=events, eval_strategy="steps", eval_steps=2,
                           per_device_eval_batch_size=8, evaluated_on=lambda p: {"a": p[:16], "b": p[16:24]},
                           metric_for_best_model="a_loss", save_strategy="best")
    assert marks == list(range(1, 8))
    for step in (2, 4, 6):
        at = [kind for kind, s in events if s == step]
        assert at[:2] == ["evaluate", "evaluate"] and at[-1] == "boundary", events


def test_no_boundary_where_a_callback_stops_the_training_in_its_log(monkeypatch):
    """A loss threshold acting on the log (set after the step's end): the training ends there, and a process
    restored at that step would train on."""
    from transformers import TrainerCallback
    stop = type("StopAt4", (TrainerCallback,), {"on_log": lambda self, args, state, control, **k: setattr(
        control, "should_training_stop", state.global_step >= 4) or control})
    marks, logged = _boundaries(monkeypatch, callbacks=[stop()], logging_steps=1)
    assert logged == [1, 2, 3, 4] and marks == [1, 2, 3]


def test_an_epochs_last_step_gets_none_where_the_trainer_logs_by_epoch(monkeypatch):
    marks, _ = _boundaries(monkeypatch, logging_strategy="epoch", num_train_epochs=2, max_steps=-1)
    assert marks == [1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15], marks


def test_an_epochs_last_step_gets_none_where_the_trainer_or_a_callback_acts_at_its_end(monkeypatch):
    """Before: a move at an epoch's last step skipped the evaluation the Trainer (eval_strategy="epoch") or a
    callback of the script's (its own evaluation in on_epoch_end) ran after it, whose loader drew from torch's
    random stream: 4/4 tensors differed. Two epochs of 64 items in batches of 8: the first ends at step 8."""
    from transformers import TrainerCallback
    inside = [1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15]        # not 8, nor 16 (training ends)
    marks, _ = _boundaries(monkeypatch, eval_strategy="epoch", per_device_eval_batch_size=8, num_train_epochs=2,
                           max_steps=-1)
    assert marks == inside, marks
    own = type("EvaluateOnTrain", (TrainerCallback,), {"on_epoch_end": lambda self, *a, **k: None})
    marks, _ = _boundaries(monkeypatch, callbacks=[own()], num_train_epochs=2, max_steps=-1)
    assert marks == inside, marks
    marks, _ = _boundaries(monkeypatch, num_train_epochs=2, max_steps=-1)
    assert marks == inside[:7] + [8] + inside[7:], marks          # nothing acts there: a boundary


def test_evaluating_on_a_subset_of_the_training_dataset_leaves_the_training_fetchs_random_states_alone(monkeypatch):
    """The training dataset draws noise from torch's stream; evaluation reads a Subset of it, whose fetches pass
    through the same dataset. The random states a checkpoint keeps for the next training batch (`fetch_rng`) must
    be those that batch was fetched under, not an evaluation batch's: a restored process would draw other noise.
    Before: the evaluation's fetch overwrote them at every step that evaluated."""
    from torch.utils.data import Subset
    evaluating, training_fetch_states = [False], []

    class Noisy(list):
        def __getitem__(self, i):
            if not evaluating[0]:
                training_fetch_states.append(torch.get_rng_state())
            item = super().__getitem__(i)
            return {"x": item["x"] + 0.01 * torch.randn(4), "labels": item["labels"]}

    class Evaluated(Subset):
        def __getitems__(self, indices):
            evaluating[0] = True
            try:
                return super().__getitems__(indices)
            finally:
                evaluating[0] = False

    kept = []
    marks, _ = _boundaries(monkeypatch, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8,
                           points=Noisy, evaluated_on=lambda data: Evaluated(data, range(16)),
                           at_boundary=lambda callback: kept.append(callback.fetches.before["torch"]))
    assert marks == list(range(1, 8)) and len(kept) == 7
    assert all(any(torch.equal(state, seen) for seen in training_fetch_states) for state in kept)


def test_a_scheduler_given_to_the_trainer_that_is_not_torchs_is_the_jobs(monkeypatch):
    """A scheduler not torch's given to the Trainer (optimizers=) was left out of the job's state, which a move then
    lost, while the job said it was movable."""
    from gmux_testkit import OwnCosine
    held = []
    _boundaries(monkeypatch, scheduler=OwnCosine, logging_steps=1,
                at_boundary=lambda callback: held.append([type(s).__name__ for s in callback.job.tracked.schedulers]))
    assert held and all(names == ["OwnCosine"] for names in held), held


def _patched_train(monkeypatch, tmp_path) -> str:
    """Trainer.train patched as gmux-launch patches it, undone after the test; the path for the checkpoint."""
    import transformers.trainer
    from transformers import Trainer
    from gmux.job.frameworks import huggingface
    monkeypatch.setattr(Trainer, "train", Trainer.train)
    monkeypatch.setattr(Trainer, "_gmux_patched", False, raising=False)
    huggingface.patch(transformers.trainer)
    return str(tmp_path / "moved.ckpt")


def _moved_or_not(monkeypatch, tmp_path, ckpt: str, restore, callback, at_boundary, **arguments):
    """Trains a Regressor (40 steps at most) with `callback`; unrestored, a checkpoint is taken at the first
    boundary `at_boundary(trainer)` is true at (what a move carries), and the run goes on as if unmoved. Returns
    the trainer."""
    from transformers import Trainer, TrainingArguments
    monkeypatch.setattr(frameworks, "_runs", 0)
    job = Job(TrackedState(), device="cpu")
    monkeypatch.setattr(frameworks, "_job", job)
    monkeypatch.setattr(frameworks, "_restore", restore)
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = [{"x": x[i], "labels": x[i].sum()} for i in range(64)]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, report_to="none",
                             use_cpu=True, disable_tqdm=True, max_steps=40, seed=0, save_strategy="no", **arguments)
    trainer = Trainer(model=Regressor(), args=args, train_dataset=data, eval_dataset=data[:16],
                      data_collator=lambda items: {k: torch.stack([torch.as_tensor(it[k]) for it in items])
                                                   for k in items[0]}, callbacks=[callback])

    def boundary():
        if restore is None and at_boundary(trainer) and not os.path.exists(ckpt):
            job._discover(job)          # (as before any command)
            job.checkpoint(ckpt)
    monkeypatch.setattr(job, "boundary", boundary)
    trainer.train()
    return trainer


def test_a_moved_run_keeps_its_stateful_callbacks_state_early_stopping_stops_where_unmoved(monkeypatch, tmp_path):
    """EarlyStoppingCallback's patience counter is in TrainerState's stateful callbacks, which the Trainer's resume
    puts back only under restore_callback_states_from_checkpoint (False by default). Before: a run moved while
    the counter was above 0 counted its patience from 0 again, and trained on past the step the unmoved run
    stopped at (a silent divergence). Now the moved process's callback continues the count, and stops where the
    unmoved one does, with the same weights."""
    from transformers import EarlyStoppingCallback
    ckpt = _patched_train(monkeypatch, tmp_path)

    def run(restore=None):
        stopper, counted = EarlyStoppingCallback(early_stopping_patience=3), []

        def at_boundary(trainer):
            counted.append(stopper.early_stopping_patience_counter)
            return stopper.early_stopping_patience_counter == 2
        trainer = _moved_or_not(monkeypatch, tmp_path, ckpt, restore, stopper, at_boundary, learning_rate=0.3,
                                eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=16,
                                metric_for_best_model="eval_loss")
        return trainer.state.global_step, [p.detach().clone() for p in trainer.model.parameters()], counted

    step, weights, counted = run()
    assert os.path.exists(ckpt) and step < 40, (step, counted)        # it stopped early, and was moved before
    moved_step, moved_weights, moved_counted = run(restore=ckpt)
    # (before: its count started again, [1, 2], and it stopped 2 steps later)
    assert moved_step == step, (step, counted, moved_step, moved_counted)
    assert all(torch.equal(a, b) for a, b in zip(weights, moved_weights))


def test_a_moved_run_keeps_what_the_scripts_own_callbacks_counted(monkeypatch, tmp_path):
    """A callback of the script's own counting in an attribute (here: it ends the training after 12 steps it saw,
    reset at the run's start) was built anew by the moved process and counted from 0 again: the moved run trained
    6 steps past where the unmoved one stopped. Its plain attributes are carried now, put back after the new
    process's on_train_begin and on_epoch_begin, and a crafted value is refused before the run starts."""
    from transformers import TrainerCallback
    from gmux.job.checkpoint import CheckpointError
    from gmux.job.frameworks import huggingface
    ckpt = _patched_train(monkeypatch, tmp_path)

    class StopAfter(TrainerCallback):
        def __init__(self, steps):
            self.steps, self.seen, self.history = steps, 0, None

        def on_train_begin(self, args, state, control, **kwargs):
            self.seen, self.history = 0, []

        def on_step_end(self, args, state, control, **kwargs):
            self.seen += 1
            self.history.append(state.global_step)
            control.should_training_stop = self.seen >= self.steps

    def run(restore=None):
        stop = StopAfter(12)
        trainer = _moved_or_not(monkeypatch, tmp_path, ckpt, restore, stop, lambda t: t.state.global_step == 6,
                                learning_rate=0.1)
        return trainer.state.global_step, [p.detach().clone() for p in trainer.model.parameters()], stop

    step, weights, stop = run()
    assert step == 12 and os.path.exists(ckpt)
    moved_step, moved_weights, moved_stop = run(restore=ckpt)
    assert (moved_step, moved_stop.seen, moved_stop.history) == (12, 12, stop.history), (moved_step, moved_stop.seen)
    assert all(torch.equal(a, b) for a, b in zip(weights, moved_weights))

    carried = frameworks.saved_state(ckpt, huggingface.FRAMEWORK)["callback_attributes"]
    assert list(carried) == ["0:test_a_moved_run_keeps_what_the_scripts_own_callbacks_counted.<locals>.StopAfter"]
    for bad, named in (({"seen": "6"}, "'seen' is '6'"), ({"seen": [object]}, r"'seen' is \"\[<class 'object'>\]\""),
                       ({"steps": "12"}, "'steps' is '12'")):
        with pytest.raises(CheckpointError, match=r"c.ckpt: state 'callback_attributes' of the script's callback "
                                                  r"StopAfter: " + named):
            huggingface.callback_attributes.check({key: StopAfter(12) for key in carried},
                                                  {key: {**v, **bad} for key, v in carried.items()}, "c.ckpt")


def test_callback_attributes_are_checked_against_what_the_new_callback_holds():
    """A tuple the script turned into a list, a tensor it replaced by a number, an attribute made in a hook: what the
    moved process held there, taken. A method, a special name, or another kind of plain value: refused, nothing set."""
    from gmux.job.checkpoint import CheckpointError
    from gmux.job.frameworks import callback_attributes

    class Own:
        def __init__(self):
            self.seen, self.order, self.best, self.name = 0, (), torch.tensor(1.0), "own"

        def act(self):
            return "acted"
    cb = Own()
    callbacks = callback_attributes.own([cb], lambda cb: False)
    saved = {key: {"seen": 3, "order": [1, 2], "best": 0.5, "made_later": {"k": [1.5]}} for key in callbacks}
    callback_attributes.put_back(callbacks, callback_attributes.check(callbacks, saved, "c.ckpt"), None)
    assert (cb.seen, cb.order, cb.best, cb.made_later) == (3, [1, 2], 0.5, {"k": [1.5]})
    # (a number made a tensor of one value by the moved process: taken; a tensor of several is not a number's)
    callback_attributes.put_back(callbacks, callback_attributes.check(
        callbacks, {key: {"seen": torch.tensor(4.0)} for key in callbacks}, "c.ckpt"), None)
    assert torch.equal(cb.seen, torch.tensor(4.0))
    cb.seen = 3
    for bad in ({"act": 1}, {"__class__": None}, {"name": 3}, {"seen": "3"}, {"name": "x" * 5000},
                {"order": [[[[[[1]]]]]]}, {"seen": torch.zeros(2)}, {"__gmux_host__": ["nothing"]},
                {"best": torch.zeros(1, requires_grad=True)}):
        with pytest.raises(CheckpointError, match="c.ckpt: state 'callback_attributes' of the script's callback Own"):
            callback_attributes.check(callbacks, {key: {"seen": 9, **bad} for key in callbacks}, "c.ckpt")
    with pytest.raises(CheckpointError, match=r"c.ckpt: state 'callback_attributes': \['0:x'\], the script's own"):
        callback_attributes.check(callbacks, {"0:x": {}}, "c.ckpt")
    assert cb.seen == 3 and cb.act() == "acted"


def test_a_callback_that_made_an_object_behind_a_flag_is_not_carried_without_it():
    """A callback that makes its writer at its first step behind an "initialized" flag: carried alone, the flag told
    the new process's callback that its writer (None there) was made. It is carried whole or not at all."""
    from gmux.job.frameworks import callback_attributes

    class Writes:
        def __init__(self):
            self.initialized, self.writer, self.lines = False, None, 0

        def step(self):
            if not self.initialized:
                self.writer, self.initialized = object(), True
            self.lines += 1

    class Counts:
        def __init__(self):
            self.count = 0
    writes, counts = Writes(), Counts()
    callbacks = callback_attributes.own([writes, counts], lambda cb: False)
    callback_attributes.remember(callbacks)
    writes.step()
    counts.count += 2
    assert list(callback_attributes.capture(callbacks).values()) == [{}, {"count": 2}]


@pytest.mark.parametrize("kind, named", [(lambda v: frozenset((v,)), "frozenset"),
                                         (lambda v: __import__("numpy").float64(v), None),
                                         (torch.tensor, None), (float, None)])
def test_a_callback_counting_in_numbers_gmux_does_not_carry_keeps_the_job_where_it_is(monkeypatch, tmp_path,
                                                                                       kind, named):
    """A callback of the script's own keeping its best loss in a (frozen) set, and the count of its logs beside it (it ends
    the training at 12): gmux does not carry a set, and left such a callback out whole. Before, the job said it was
    movable, and a moved run's callback counted from 0 again: it trained to step 18 where the unmoved one stopped at
    12. Now a move is refused, naming the attribute; with a plain float, a NumPy float (np.mean of its logs) or a
    tensor (its best made one by min() from inf), it moves, exactly."""
    from transformers import TrainerCallback
    from gmux.job import movability
    ckpt = _patched_train(monkeypatch, tmp_path)

    class StopAfterLogs(TrainerCallback):
        def __init__(self):
            self.best, self.seen = float("inf"), 0

        def on_log(self, args, state, control, logs=None, **kwargs):
            if "loss" in logs:
                loss = kind(logs["loss"])
                self.best = loss if type(loss) is frozenset else min(self.best, loss)
                self.seen += 1
                control.should_training_stop = self.seen >= 12

    def run(restore=None):
        problems = []

        def at_boundary(trainer):
            if trainer.state.global_step == 6:
                frameworks._job._discover(frameworks._job)      # (as before any command)
                problems.append(movability.problem(frameworks._job, fresh=True))
                return True
        trainer = _moved_or_not(monkeypatch, tmp_path, ckpt, restore, StopAfterLogs(), at_boundary,
                                learning_rate=0.1, logging_steps=1)
        return trainer.state.global_step, problems, [p.detach().clone() for p in trainer.model.parameters()]

    step, problems, weights = run()
    assert step == 12 and len(problems) == 1
    if named is not None:
        assert problems[0].startswith(f"its callback StopAfterLogs's attribute 'best' (a {named}) changed"), problems
        return
    assert problems == [None]
    moved_step, _, moved_weights = run(restore=ckpt)
    assert moved_step == step and all(torch.equal(a, b) for a, b in zip(weights, moved_weights))


def test_numbers_a_move_does_not_carry_are_named_and_objects_a_callback_makes_again_are_not():
    """A set grown in place (the same object: seen by its length), a NumPy string inside a list: named. A writer
    made at the first step, a method, and plain data, a deque and a NumPy number among it: not (the new process's
    callback makes its writer; the rest is carried)."""
    import collections
    import numpy as np
    from gmux.job import plain_values

    class Own:
        def __init__(self):
            self.steps, self.recent, self.history, self.writer, self.count = set(), collections.deque(), [], None, 0
    for change, named in ((lambda cb: cb.steps.add(3), "'steps' (a set)"),
                          (lambda cb: cb.recent.append(0.5), None),
                          (lambda cb: cb.history.append(np.str_("0.5")), "'history' (a str_)"),
                          (lambda cb: cb.history.append(np.float32(0.5)), None),
                          (lambda cb: setattr(cb, "writer", object()), None),
                          (lambda cb: setattr(cb, "act", cb.__init__), None),
                          (lambda cb: cb.history.append(0.5) or setattr(cb, "count", 2), None)):
        cb = Own()
        plain_values.remember(cb)
        assert plain_values.unkept_numbers(cb) is None
        change(cb)
        assert plain_values.unkept_numbers(cb) == named


def test_a_callbacks_tensors_are_carried_to_the_models_device_and_one_of_the_graph_is_named():
    """A callback's tensors are carried and put back on the model's device, but those the script kept on the host
    (meta stands for a GPU here); one of the step's graph (a loss kept undetached) is named, even alone: no forward
    makes a callback's again."""
    from gmux.job.frameworks import callback_attributes

    class Own:
        def __init__(self):
            self.best, self.history, self.last = float("inf"), [], None
    cb = Own()
    callbacks = callback_attributes.own([cb], lambda cb: False)
    callback_attributes.remember(callbacks)
    cb.best, cb.history = torch.tensor(0.5), [torch.tensor(1.0), torch.tensor(2.0)]
    [kept] = callback_attributes.capture(callbacks).values()
    assert kept["__gmux_host__"] == ["best", "history"] and callback_attributes.not_carried(callbacks) is None
    kept["__gmux_host__"] = ["history"]        # (as a GPU's `best` is captured)
    restored = Own()
    again = callback_attributes.own([restored], lambda cb: False)
    callback_attributes.put_back(again, callback_attributes.check(again, {k: kept for k in again}, "c.ckpt"), "meta")
    assert restored.best.device.type == "meta" and [t.device.type for t in restored.history] == ["cpu", "cpu"]
    assert not hasattr(restored, "__gmux_host__")
    cb.last = torch.ones(1, requires_grad=True) * 2
    assert callback_attributes.capture(callbacks) == {k: {} for k in callbacks}
    assert callback_attributes.not_carried(callbacks).startswith(
        "its callback Own's attribute 'last' holds a tensor of the step's graph")


def test_a_deque_or_set_changed_in_place_at_its_length_is_named():
    """A window of the last values made full at its maxlen keeps its length as it changes (so does a set an item is
    swapped in): seen by its length alone, it was taken for unchanged, neither carried nor named, and a module's
    forward that reads it went on from its first values in a new process while the job said movable. The deque is
    carried now, the set named."""
    import collections
    from gmux.job import plain_values

    class Own:
        def __init__(self):
            self.window, self.ids = collections.deque([1.0] * 4, maxlen=4), {1, 2}
    for change, named, carried in ((lambda cb: cb.window.append(0.5), None, ["window"]),
                                   (lambda cb: cb.ids.discard(1) or cb.ids.add(3), "'ids' (a set)", [])):
        cb = Own()
        plain_values.remember(cb)
        change(cb)
        assert plain_values.unkept_numbers(cb) == named and list(plain_values.changed(cb)) == carried


def test_a_numpy_array_counted_into_in_place_is_named():
    """`self.seen[y] += 1` keeps the same array: seen by identity alone, it was taken for unchanged, neither carried
    nor named, and a module whose loss weights it set was reported movable. A large one is looked at by a sample.
    (Seen changed, it is carried now.)"""
    import numpy as np
    from gmux.job import plain_values

    class Own:
        def __init__(self):
            self.seen, self.big = np.ones(3), np.zeros(1 << 20)
    for change, carried in ((lambda cb: cb.seen.__setitem__(1, 5.0), "seen"),
                            (lambda cb: cb.big.__iadd__(1.0), "big")):
        cb = Own()
        plain_values.remember(cb)
        assert plain_values.changed(cb) == {}
        change(cb)
        assert list(plain_values.changed(cb)) == [carried] and plain_values.unkept_numbers(cb) is None
