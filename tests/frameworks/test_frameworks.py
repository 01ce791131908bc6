"""gmux.job.frameworks without the frameworks: what is imported when, how a Trainer module is found and
patched, and which setups are refused a move (and why). Fast: no framework is imported here; the real ones run
end to end in tests/node/test_e2e_frameworks.py."""
import sys
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from gmux.job import frameworks
from gmux.job.frameworks import huggingface, lightning, lightning_state

FRAMEWORK_ROOTS = ("transformers", "accelerate", "lightning", "pytorch_lightning")


def _loaded():
    return {m for m in sys.modules if m.split(".")[0] in FRAMEWORK_ROOTS}


@pytest.fixture
def watch(monkeypatch):
    """frameworks.install as a launcher calls it, undone afterwards (the finder leaves sys.meta_path)."""
    saved = list(sys.meta_path)
    monkeypatch.setattr(frameworks, "_job", None)
    monkeypatch.setattr(frameworks, "_restore", None)
    yield
    sys.meta_path[:] = saved


def test_gmux_imports_no_framework_for_a_plain_script(watch, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\n# transformers is mentioned in a comment\n")
    before = _loaded()
    frameworks.warm_up(str(script))
    frameworks.install(object())
    __import__("json")                     # imports go on through the finder as before
    assert _loaded() == before


def test_a_scripts_trainer_import_is_what_warm_up_imports(tmp_path, monkeypatch):
    imported = []
    monkeypatch.setattr(frameworks.importlib, "import_module", imported.append)
    monkeypatch.delenv(frameworks.WARM_ENV, raising=False)
    for name in frameworks.WATCHED:     # (a test before this one in the same worker may have imported them)
        monkeypatch.delitem(sys.modules, name, raising=False)
    for source, expected in (("from transformers import Trainer, TrainingArguments\n", "transformers.trainer"),
                             ("import lightning.pytorch as pl\n", "lightning.pytorch.trainer.trainer"),
                             ("import lightning as L\n", "lightning.pytorch.trainer.trainer"),
                             ("import pytorch_lightning as pl\n", "pytorch_lightning.trainer.trainer"),
                             ("from transformers import (\n    Trainer,\n    TrainingArguments,\n)\n",
                              "transformers.trainer"),
                             ("from transformers import AutoModel\n", None)):
        imported.clear()
        (tmp_path / "s.py").write_text(source)
        frameworks.warm_up(str(tmp_path / "s.py"))
        assert imported == ([expected] if expected else []), source


def test_a_watched_module_is_patched_once_it_has_loaded(watch, tmp_path, monkeypatch):
    pkg = tmp_path / "gmux_fake_fw"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text(
        "class TrainerCallback:\n    pass\n\n"
        "class Trainer:\n    def train(self, resume_from_checkpoint=None):\n        return 'trained'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(frameworks.WATCHED, "gmux_fake_fw.trainer", "huggingface")
    frameworks.install(None)
    try:
        from gmux_fake_fw.trainer import Trainer
        assert Trainer._gmux_patched and Trainer.train.__wrapped__ is not None
        assert Trainer().train() == "trained"          # no job (not under gmux-launch): the Trainer's own train
        import gmux_fake_fw.trainer as module
        assert module.__loader__.get_source("gmux_fake_fw.trainer").startswith("class TrainerCallback")
    finally:
        for name in ("gmux_fake_fw", "gmux_fake_fw.trainer"):
            sys.modules.pop(name, None)


# -- Hugging Face: which setups move -------------------------------------------------------------------------
class SeedableRandomSampler(torch.utils.data.RandomSampler):
    pass


def _hf(**changes):
    """why_not_movable of a Trainer as far as it reads one, its training loader a real DataLoader (`num_workers`,
    `persistent_workers`, `dataset`, `collate_fn`, `sampler` go to it; `loader` replaces it)."""
    args = dict(world_size=1, ignore_data_skip=False, train_batch_size=4)
    trainer = dict(is_deepspeed_enabled=False, is_fsdp_enabled=False, train_dataset=TensorDataset(torch.zeros(8)),
                   data_collator=None)
    seen = changes.pop("fetches_seen", False)
    made = {k: changes.pop(k) for k in ("num_workers", "persistent_workers", "dataset", "collate_fn", "sampler")
            if k in changes}
    made.setdefault("sampler", SeedableRandomSampler(range(8)))
    loader = changes.pop("loader", None) or DataLoader(made.pop("dataset", TensorDataset(torch.zeros(8))),
                                                       batch_size=4, **made)
    for k, v in changes.items():
        (args if k in args else trainer)[k] = v
    return huggingface.why_not_movable(SimpleNamespace(args=SimpleNamespace(**args), **trainer), loader, seen)


class DataCollatorForLanguageModeling:      # (transformers' class, as far as the check reads it)
    def __init__(self, mlm: bool, seed=None):
        self.mlm, self.seed = mlm, seed


class DataCollatorForWholeWordMask(DataCollatorForLanguageModeling):
    pass


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


def test_huggingface_moves_only_where_its_resume_is_exact():
    assert _hf() is None
    assert _hf(sampler=torch.utils.data.SequentialSampler(range(8))) is None
    assert _hf(num_workers=2) is None           # its workers draw nothing
    for changes, words in (({"is_deepspeed_enabled": True}, "DeepSpeed"), ({"is_fsdp_enabled": True}, "FSDP"),
                           ({"world_size": 2}, "2 processes"), ({"ignore_data_skip": True}, "ignore_data_skip"),
                           ({"train_dataset": Stream()}, "IterableDataset"),
                           ({"num_workers": 2, "collate_fn": lambda items: 1 / 0}, "worker processes may draw"),
                           ({"loader": [[1, 2]]}, "a list, not a torch DataLoader"),
                           ({"sampler": torch.utils.data.RandomSampler(range(8))}, "RandomSampler"),
                           ({"data_collator": DataCollatorForLanguageModeling(mlm=True, seed=3)}, "seed="),
                           ({"data_collator": DataCollatorForWholeWordMask(mlm=True, seed=3)},
                            "DataCollatorForWholeWordMask")):
        why = _hf(**changes)
        assert why and words in why, (changes, why)
    # masks drawn from the job's random states move exactly (tests/node/test_e2e_frameworks.py moves such a job)
    assert _hf(data_collator=DataCollatorForLanguageModeling(mlm=True)) is None
    assert _hf(data_collator=DataCollatorForWholeWordMask(mlm=True)) is None
    assert _hf(data_collator=DataCollatorForLanguageModeling(mlm=False)) is None     # causal LM: no masks


class Noisy(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((2,), float(i)) + torch.rand(2)      # a random transform, from torch's stream


def test_huggingface_tries_a_batch_to_learn_whether_its_data_draws_random_numbers():
    """Loader workers move exactly when nothing they run draws; a dataset drawing as it is indexed does not even
    without workers. A batch is tried once, and the random states are as they were after it."""
    from gmux.job.state import capture_rng
    plain, noisy = TensorDataset(torch.arange(8.0)), Noisy()
    collate = torch.utils.data.default_collate
    noise = lambda items: [t + torch.randn(t.shape) for t in collate(items)]     # noqa: E731
    torch.manual_seed(3)
    before = capture_rng()["torch"]
    assert _hf(num_workers=2, dataset=plain, collate_fn=collate) is None
    why = _hf(num_workers=2, persistent_workers=True, dataset=plain, collate_fn=collate)
    assert why and why.startswith("dataloader_persistent_workers=True"), why
    why = _hf(num_workers=2, dataset=plain, collate_fn=noise)
    assert why and "worker processes draw random numbers as its collator collates" in why, why
    why = _hf(num_workers=2, dataset=noisy, collate_fn=collate)
    assert why and "as its dataset is indexed" in why, why
    why = _hf(dataset=noisy, collate_fn=collate)
    assert why and "its dataset draws random numbers as it is indexed" in why, why
    # unless gmux sees where each fetch begins (its hook on the dataset's __getitems__): then a move is exact
    assert _hf(dataset=noisy, collate_fn=collate, fetches_seen=True) is None
    assert _hf(dataset=plain, collate_fn=noise) is None     # collated in the job's process: exact
    # a generator of the data's own (a masking collator's seed=, behind a wrapper): its state is not the job's
    own = torch.Generator().manual_seed(5)
    why = _hf(dataset=plain, collate_fn=lambda items: collate(items)[0] + torch.rand(4, generator=own))
    assert why and "a random generator of its own" in why, why
    assert torch.equal(capture_rng()["torch"], before)


# -- Lightning: which setups move ----------------------------------------------------------------------------
class SingleDeviceStrategy:
    pass


class DDPStrategy:
    pass


def _lt(strategy=SingleDeviceStrategy, loaders=None, hooks=(), reload=0, callbacks=(), carried=False):
    """why_not_movable (or, `carried`, carried_draws: why not after the persistent workers' first epoch)."""
    loaders = loaders if loaders is not None else [DataLoader(TensorDataset(torch.zeros(8)), shuffle=True)]
    trainer = SimpleNamespace(strategy=strategy(), reload_dataloaders_every_n_epochs=reload, callbacks=list(callbacks),
                              fit_loop=SimpleNamespace(_combined_loader=SimpleNamespace(flattened=loaders)))
    return lightning.carried_draws(trainer) if carried else lightning.why_not_movable(trainer, list(hooks))


def test_lightning_moves_only_where_its_resume_is_exact():
    assert _lt() is None
    data = TensorDataset(torch.zeros(8))
    for kwargs, words in (({"strategy": DDPStrategy}, "DDPStrategy"), ({"reload": 1}, "reload_dataloaders"),
                          ({"hooks": ["on_save_checkpoint"]}, "on_save_checkpoint"),
                          ({"loaders": [DataLoader(Stream())]}, "IterableDataset"),
                          ({"loaders": [[1, 2, 3]]}, "not a torch DataLoader")):
        why = _lt(**kwargs)
        assert why and words in why, (kwargs, why)
    # persistent workers that draw nothing move (tests/node/test_e2e_loader_workers.py moves such a job); ones
    # that draw move in the epoch they start in, and the reason they do not after it is ready
    quiet = [DataLoader(data, num_workers=1, persistent_workers=True)]
    assert _lt(loaders=quiet) is None and _lt(loaders=quiet, carried=True) is None
    noisy = [DataLoader(Noisy(), num_workers=1, persistent_workers=True)]
    assert _lt(loaders=noisy) is None
    why = _lt(loaders=noisy, carried=True)
    assert why and "persistent_workers=True, and its dataset or collate function draws" in why, why
    # no workers, a generator of the data's own: the new process's starts again from its seed
    own = torch.Generator().manual_seed(5)
    masked = lambda items: torch.utils.data.default_collate(items)[0] * torch.rand(1, generator=own)   # noqa: E731
    why = _lt(loaders=[DataLoader(TensorDataset(torch.ones(8)), collate_fn=masked)])
    assert why and "draws from a random generator of its own" in why, why


Callback = type("Callback", (), {"on_save_checkpoint": lambda self, *a: None,
                                 "on_load_checkpoint": lambda self, *a: None,
                                 "on_train_epoch_start": lambda self, *a: None,
                                 "__module__": "lightning.pytorch.callbacks.callback"})


def test_lightning_callbacks_with_state_of_their_own_or_epoch_start_changes_are_refused_a_move():
    """Before: Lightning's EMAWeightAveraging and ModelPruning moved and the new process crashed (KeyError
    'state_dict'; the pruned weights did not fit a fresh model), StochasticWeightAveraging's param groups were
    refused only by the new process. (A GradientAccumulationScheduler, whose step was lost mid-epoch, now moves: its
    on_train_epoch_start is done again in the new process.)"""
    lightning_own = {"__module__": "lightning.pytorch.callbacks.x"}
    progress = type("TQDMProgressBar", (Callback,), {**lightning_own, "on_train_epoch_start": lambda s, *a: None})
    checkpoint = type("ModelCheckpoint", (Callback,), {**lightning_own, "state_dict": lambda s: {}})
    accumulation = type("GradientAccumulationScheduler", (Callback,), lightning_own)
    assert _lt(callbacks=[progress(), checkpoint(), accumulation()]) is None
    ema = type("EMAWeightAveraging", (Callback,), {**lightning_own, "on_save_checkpoint": lambda s, *a: None})
    users = type("Counter", (checkpoint,), {"__module__": "train", "on_load_checkpoint": lambda s, *a: None})
    swa = type("StochasticWeightAveraging", (Callback,), lightning_own)
    finetune = type("Unfreeze", (type("BaseFinetuning", (Callback,), lightning_own),), {"__module__": "train"})
    for cb, words in ((ema, "EMAWeightAveraging callback keeps state of its own in on_save_checkpoint"),
                      (users, "Counter callback keeps state of its own in on_load_checkpoint"),
                      (swa, "StochasticWeightAveraging callback changes the training at an epoch's start"),
                      (finetune, "Unfreeze callback changes the training")):
        why = _lt(callbacks=[progress(), cb()])
        assert why and words in why, (cb, why)


def test_lightning_state_must_be_plain_data():
    import numpy as np
    t = torch.ones(2)
    assert lightning.plain({"a": [1, (2.0, "x")], "b": t, "c": np.float32(1.5), "d": None}) == \
        {"a": [1, (2.0, "x")], "b": t, "c": 1.5, "d": None}
    with pytest.raises(TypeError, match=r"state\['cb'\]\['when'\] is a object"):
        lightning.plain({"cb": {"when": object()}})


def test_only_the_users_own_lightning_hooks_count():
    Base = type("LightningModule", (), {"on_save_checkpoint": lambda self, c: None,
                                        "__module__": "lightning.pytorch.core"})
    Plain = type("Plain", (Base,), {"__module__": "train"})
    Own = type("Own", (Base,), {"__module__": "train", "on_save_checkpoint": lambda self, c: None})
    assert not lightning._overrides(Plain(), "on_save_checkpoint")
    assert lightning._overrides(Own(), "on_save_checkpoint")


def test_the_report_says_whether_the_job_can_move(monkeypatch):
    """A Trainer's job is movable once attached with an exact setup; not once its Trainer has returned, nor for a
    second Trainer run in the same process (a new process would run the first one again before it)."""
    from gmux.job.job import Job
    from gmux.job.state import TrackedState
    monkeypatch.setattr(frameworks, "_runs", 0)
    job = Job(TrackedState(), device="cpu")
    model = torch.nn.Linear(2, 2)
    frameworks.started()
    frameworks.attach(job, "huggingface", [model, torch.optim.SGD(model.parameters(), lr=0.1)], None, lambda: None)
    report = job.report()
    assert job.control == "framework" and report["control"] == "framework"
    assert report["movable"] is True and report["unmovable"] is None and len(job.tracked.tensors()) == 2
    frameworks.finished(job)
    assert job.report()["movable"] is False and "finished" in job.report()["unmovable"]
    frameworks.started()
    frameworks.attach(job, "huggingface", [model], None, lambda: None)
    assert job.report()["movable"] is False and "before" in job.report()["unmovable"]
    frameworks.attach(job, "huggingface", [model], "an IterableDataset", lambda: None)
    assert job.report()["unmovable"] == "an IterableDataset"


def test_a_trainers_object_gmux_cannot_keep_leaves_the_job_unmovable_not_failed(monkeypatch):
    """A Trainer's scheduler gmux could not take as state failed the run at its first boundary (TypeError)."""
    from gmux.job.job import Job
    from gmux.job.state import TrackedState

    class Warmup:           # (steps the LR, keeps no state a checkpoint could take)
        optimizer = None
    monkeypatch.setattr(frameworks, "_runs", 0)
    job = Job(TrackedState(), device="cpu")
    model = torch.nn.Linear(2, 2)
    frameworks.started()
    frameworks.attach(job, "lightning", [model, torch.optim.SGD(model.parameters(), lr=0.1), Warmup()], None,
                      lambda: None)
    report = job.report()
    assert report["movable"] is False and report["unmovable"].startswith("gmux cannot keep its Warmup"), report
    assert len(job.tracked.tensors()) == 2      # the rest is the job's state: suspend and resume work


def test_random_states_kept_by_a_framework_are_checked_before_use():
    """A Trainer's own random states (the batch fetched ahead, the epoch's start) sit in the checkpoint's free-form
    state; a damaged or crafted one is refused naming the field, not applied half-way."""
    from gmux.job.checkpoint import CheckpointError
    from gmux.job.generators import random_states
    from gmux.job.state import capture_rng
    good = capture_rng()
    assert random_states(good, "ckpt", "state 'fetch_rng'") is good
    for bad in (None, [1, 2], {**good, "torch": good["torch"][:100]}, {**good, "python": (3, (1, 2), None)},
                {**good, "numpy": "MT19937"}, {**good, "cuda": [torch.zeros(16)]}, {k: good[k] for k in ("torch",)}):
        with pytest.raises(CheckpointError, match="state 'fetch_rng': not the random states"):
            random_states(bad, "ckpt", "state 'fetch_rng'")


def test_a_restored_lightning_run_does_again_the_epoch_start_that_its_resume_skips():
    """The script's own callbacks' on_train_epoch_start (a freeze schedule) and a GradientAccumulationScheduler's
    run again in a restored process; not one with a state of its own, which Lightning has restored already as the
    hook had left it (run again, an epoch counter counted the epoch twice: 4/4 tensors differed)."""
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.trainer import call
    ran = []
    stateless = type("Freeze", (pl.Callback,), {"on_train_epoch_start": lambda s, t, m: ran.append("freeze")})
    counting = type("Counter", (pl.Callback,), {"on_train_epoch_start": lambda s, t, m: ran.append("counter"),
                                                "state_dict": lambda s: {"n": 1}})
    accumulation = pl.callbacks.GradientAccumulationScheduler({0: 1, 1: 2})
    trainer = SimpleNamespace(current_epoch=1, accumulate_grad_batches=1,
                              callbacks=[stateless(), counting(), accumulation])
    gmux_callback = lightning._callback_class(pl.Callback, call, "2")(trainer, None)
    gmux_callback.epoch_start_again(trainer, torch.nn.Linear(1, 1))
    assert ran == ["freeze"] and trainer.accumulate_grad_batches == 2


class LengthGroupedSampler(torch.utils.data.Sampler):       # (as transformers' draws, generator None)
    generator = None

    def __iter__(self):
        return iter(torch.randperm(8).tolist())

    def __len__(self):
        return 8


@pytest.mark.parametrize("make", [LengthGroupedSampler, lambda: torch.utils.data.RandomSampler(range(8))],
                         ids=["group_by_length", "use_seedable_sampler=False"])
def test_an_epoch_order_drawn_from_torchs_stream_is_drawn_alike_in_a_restored_process(make):
    """group_by_length's LengthGroupedSampler, and torch's RandomSampler without a generator (the Trainer's under
    use_seedable_sampler=False), draw each epoch's order from torch's stream when the epoch's first batch is
    fetched; a restored process draws it under the states the first process noted (moved without them, the
    weights differed), then goes on under its own. Unwrapped, such a sampler is refused."""
    from gmux.job.data_draws import same
    from gmux.job.state import capture_rng

    assert type(make()).__name__ in huggingface._FROM_STREAM and make().generator is None
    callback = SimpleNamespace(order_rng=None)
    torch.manual_seed(1)
    first = huggingface._EpochOrder(make(), callback)
    order, noted = list(first), first.before
    torch.manual_seed(99)                    # the restored process, its states the checkpoint's
    callback.order_rng, states = noted, capture_rng()
    again = huggingface._EpochOrder(make(), callback)
    assert list(again) == order and same(capture_rng(), states) and again.before is noted
    assert callback.order_rng is None and len(again) == 8
    assert type(make()).__name__ in _hf(sampler=make())
    assert _hf(sampler=again) is None


def test_a_checkpoints_trainer_totals_are_checked_before_use():
    """The running totals a moved Hugging Face run carries are read from a checkpoint file: anything but the
    Trainer's own numbers is refused, naming the field."""
    from gmux.job.checkpoint import CheckpointError
    from gmux.job.frameworks.huggingface import _run_totals
    assert _run_totals(None, "c.ckpt") == {}
    good = '{"_tr_loss": 0.25, "_globalstep_last_logged": 40, "current_flos": 1e9}'
    assert _run_totals(good, "c.ckpt") == {"_tr_loss": 0.25, "_globalstep_last_logged": 40, "current_flos": 1e9}
    for bad in ("[1, 2]", "{", '{"_tr_loss": NaN}', '{"_globalstep_last_logged": 4.5}', '{"__class__": 1}',
                '{"_tr_loss": "0.1"}', '{"_initial_global_step": true}', "17"):
        with pytest.raises(CheckpointError, match="c.ckpt.*run_totals"):
            _run_totals(bad, "c.ckpt")


def test_a_checkpoints_callback_states_are_checked_before_any_is_put_back():
    """A moved Hugging Face run's callbacks take the attributes its checkpoint's Trainer state holds: only plain
    data each callback has, of its kind (not a method, not a string for a count), all checked before any is set."""
    import json
    from gmux.job.checkpoint import CheckpointError

    class EarlyStoppingCallback:
        def __init__(self):
            self.early_stopping_patience_counter, self.best = 0, None

        def on_evaluate(self):
            return "evaluated"

    class Other:
        def __init__(self):
            self.seen = []
    stopper, other = EarlyStoppingCallback(), Other()
    trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[stopper, other]))

    def put_back(**stored):
        huggingface._put_back_callback_states(trainer, json.dumps({"stateful_callbacks": stored}), None, "c.ckpt")
    put_back(EarlyStoppingCallback={"args": {}, "attributes": {"early_stopping_patience_counter": 2, "best": 0.5}})
    assert (stopper.early_stopping_patience_counter, stopper.best) == (2, 0.5)
    for bad in ({"on_evaluate": 1}, {"early_stopping_patience_counter": "3"}, {"__class__": None},
                {"early_stopping_patience_counter": True}, {"nowhere": 1}):
        with pytest.raises(CheckpointError, match="c.ckpt.*EarlyStoppingCallback"):
            put_back(EarlyStoppingCallback=[{"attributes": {"best": 0.25, **bad}}])
        assert stopper.best == 0.5 and stopper.on_evaluate() == "evaluated"
    with pytest.raises(CheckpointError, match="c.ckpt.*'Other'"):      # (a later one refused: nothing was set)
        put_back(EarlyStoppingCallback={"attributes": {"best": 0.1}}, Other={"attributes": {"seen": 7}})
    assert stopper.best == 0.5 and other.seen == []
    with pytest.raises(CheckpointError, match="c.ckpt.*not a JSON object"):
        huggingface._put_back_callback_states(trainer, "[1]", None, "c.ckpt")


def test_a_checkpoints_epoch_sums_are_checked_before_use():
    """A moved Lightning run's epoch metric sums come from a checkpoint file: only numbers gmux keeps are taken,
    and a refusal names the key before anything is set."""
    from gmux.job.checkpoint import CheckpointError
    from gmux.job.frameworks.lightning_epoch_sums import carry_epoch_sums
    carry_epoch_sums(None, None, "c.ckpt")          # (a checkpoint from before gmux kept them)
    carry_epoch_sums(None, {}, "c.ckpt")
    for bad in ([1], {"k": 1.0}, {"k": {"value": "0.5", "dtype": "float32"}}, {"k": {"value": 0.5, "dtype": "int64"}},
                {"k": {"value": 0.5, "dtype": "float32", "batches": -1}}, {"k": {"value": 1, "dtype": "float32"}},
                {"k": {"value": 0.5, "dtype": "float32", "batches": True}}, {7: {"value": 0.5, "dtype": "float32"}},
                {"k": {"value": 0.5, "dtype": "float32", "__class__": 1}},
                {"x" * 600: {"value": 0.5, "dtype": "float32"}}):
        with pytest.raises(CheckpointError, match="c.ckpt.*epoch_sums"):
            carry_epoch_sums(None, bad, "c.ckpt")


def test_a_checkpoints_logger_versions_are_checked_before_use():
    """A moved Lightning run's loggers take the versions its checkpoint names, which name directories: nothing
    that leads out of the logger's own is taken."""
    from types import SimpleNamespace

    from gmux.job.checkpoint import CheckpointError
    from gmux.job.frameworks.lightning_state import continue_logs
    logger = SimpleNamespace(_version=None, save=lambda: None)
    continue_logs(SimpleNamespace(loggers=[logger]), [3], "c.ckpt")
    assert logger._version == 3
    for bad in (["../elsewhere"], ["a/b"], [".."], [""], [-1], [True], [1.5], "3", [None] * 65):
        with pytest.raises(CheckpointError, match="c.ckpt.*logs"):
            continue_logs(SimpleNamespace(loggers=[SimpleNamespace(_version=None)]), bad, "c.ckpt")


def test_a_model_checkpoints_last_save_is_carried_and_a_crafted_one_refused(tmp_path):
    """ModelCheckpoint keeps its last save outside its state_dict; a new process without it wrote last.ckpt again
    when training ended (end to end: tests/node/test_e2e_loader_workers.py). Only Lightning's own class (or a
    subclass) is read, and what a checkpoint file says is checked before it is set."""
    pl = pytest.importorskip("lightning.pytorch")
    from gmux.job.checkpoint import CheckpointError

    def callbacks():
        own = type("ModelCheckpoint", (pl.Callback,), {"_last_checkpoint_saved": "x"})()   # the script's
        mine = type("Kept", (pl.callbacks.ModelCheckpoint,), {})(dirpath=str(tmp_path), monitor="step")
        return SimpleNamespace(callbacks=[own, pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path)), mine])
    first = callbacks()
    first.callbacks[1]._last_checkpoint_saved, first.callbacks[1]._last_global_step_saved = "/c/last.ckpt", 16
    first.callbacks[2]._defer_save_until_validation = True
    saved = lightning_state.unsaved_state(first)
    assert len(saved) == 2 and saved[first.callbacks[1].state_key]["_last_global_step_saved"] == 16
    restored = callbacks()
    lightning_state.put_back_unsaved(restored, saved, "p")
    assert (restored.callbacks[1]._last_checkpoint_saved, restored.callbacks[1]._last_global_step_saved) == \
        ("/c/last.ckpt", 16) and restored.callbacks[2]._defer_save_until_validation is True
    key, other = first.callbacks[1].state_key, first.callbacks[2].state_key
    for crafted in ([], {key: {"_last_global_step_saved": "16"}}, {key: {"_last_global_step_saved": True}},
                    {key: {"__class__": "x"}}, {key: {"_last_checkpoint_saved": "x" * 5000}}, {key: 3},
                    {key: {"_last_global_step_saved": 16}, other: {"_last_global_step_saved": 1.5}}):
        fresh = callbacks()
        with pytest.raises(CheckpointError, match="unsaved"):
            lightning_state.put_back_unsaved(fresh, crafted, "p")
        assert fresh.callbacks[1]._last_global_step_saved == 0        # refused: nothing set
    lightning_state.put_back_unsaved(fresh, None, "p")                     # a checkpoint from before gmux kept it
