"""A real Lightning Trainer moved in this process (gmux/job/frameworks/lightning.py): a checkpoint taken at a boundary
of a fit that then runs on, and a second fit restored from it, must end alike."""
import importlib.util
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gmux.job import frameworks
from gmux.job.job import Job
from gmux.job.state import TrackedState

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                reason="lightning not installed (pip install -e .[test])")


def _patched(monkeypatch, tmp_path) -> str:
    """Trainer.fit patched as gmux-launch patches it, undone after the test; the path for the checkpoint."""
    import lightning.pytorch as pl
    import lightning.pytorch.trainer.trainer as trainer_module
    from lightning.pytorch.utilities.combined_loader import CombinedLoader
    from gmux.job.frameworks import lightning
    for owner, name in ((pl.Trainer, "fit"), (CombinedLoader, "__iter__"), (CombinedLoader, "__next__")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    monkeypatch.setattr(pl.Trainer, "_gmux_patched", False, raising=False)
    lightning.patch(trainer_module)
    return str(tmp_path / "moved.ckpt")


def _linear():
    """A LightningModule of one linear layer, to train on x -> sum(x)."""
    import lightning.pytorch as pl

    class Linear(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 1)
    return Linear


def _on_val_loss_plateau(**scheduling):
    """A module whose LR halves on a ReduceLROnPlateau monitoring its val_loss: no validation improves on the first
    by 10, so every step of the scheduler after it reduces. `scheduling`: more of Lightning's lr_scheduler dict."""
    class Module(_linear()):
        def training_step(self, batch, i):
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def validation_step(self, batch, i):
            self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=10.0,
                                                                 threshold_mode="abs")
            return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss", **scheduling}}
    return Module


def _fit(monkeypatch, module, ckpt: str, restore=None, at: int = 17, **trainer_args):
    """Fits `module` for 4 epochs of 7 boundaries (64 points, batches of 8); unrestored, a checkpoint is taken at
    boundary `at` (epoch 2's 3rd batch: what a move carries) and the fit goes on as if unmoved. Returns the
    trainer."""
    import lightning.pytorch as pl
    monkeypatch.setattr(frameworks, "_runs", 0)
    job = Job(TrackedState(), device="cpu")
    monkeypatch.setattr(frameworks, "_job", job)
    monkeypatch.setattr(frameworks, "_restore", restore)
    pl.seed_everything(0, verbose=False)
    x = torch.randn(64, 4)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    boundaries = []

    def boundary():
        boundaries.append(trainer.current_epoch)
        if restore is None and len(boundaries) == at:
            job._discover(job)          # (as before any command)
            job.checkpoint(ckpt)
    monkeypatch.setattr(job, "boundary", boundary)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=4, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, **trainer_args)
    trainer.fit(module, DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=32))
    return trainer


def test_a_moved_fit_steps_its_plateau_scheduler_at_the_end_of_the_epoch_it_was_moved_in(monkeypatch, tmp_path):
    """Lightning's restore leaves its fit loop "restarting" until the restored epoch ends, and skips a
    ReduceLROnPlateau's step there (it assumes the monitored metric lost), though that epoch validates in the
    restored process as it did unmoved. Before: a run moved mid-epoch missed one LR reduction and trained on with
    another LR, while it said it was movable."""
    ckpt = _patched(monkeypatch, tmp_path)

    Module = _on_val_loss_plateau()

    def run(restore=None):
        module = Module()
        trainer = _fit(monkeypatch, module, ckpt, restore)
        return trainer.optimizers[0].param_groups[0]["lr"], [p.detach().clone() for p in module.parameters()]

    lr, weights = run()
    assert os.path.exists(ckpt) and lr == 0.1 * 0.5 ** 3
    moved_lr, moved_weights = run(restore=ckpt)
    assert moved_lr == lr, (lr, moved_lr)          # (before: 0.1 * 0.5 ** 2)
    assert all(torch.equal(a, b) for a, b in zip(weights, moved_weights))


def _plateau(module, monitor: str) -> dict:
    """configure_optimizers: SGD whose LR halves once `monitor` stops falling by 0.05."""
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=0.05)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": monitor}}


def _moved_alike(monkeypatch, ckpt: str, Module) -> None:
    """Fits `Module` unmoved (checkpointed in epoch 2) and again restored from that checkpoint: the weights are the
    unmoved run's, and so is what the module noted in `seen` at each validation (the list is carried, and so are
    the trainer's callback_metrics, which Lightning's resume leaves out: its first validation finds the last
    training epoch's there, as unmoved)."""
    def run(restore=None):
        module = Module()
        module.seen = []
        _fit(monkeypatch, module, ckpt, restore, check_val_every_n_epoch=1)
        return module.seen, [p.detach().clone() for p in module.parameters()]

    seen, weights = run()
    assert os.path.exists(ckpt) and len(seen) == 3, seen      # (epochs 1-3: after epoch 0 the next starts)
    moved_seen, moved_weights = run(restore=ckpt)
    assert moved_seen == seen, (seen, moved_seen)       # (before callback_metrics were carried: epoch 2's missing)
    assert all(torch.equal(a, b) for a, b in zip(weights, moved_weights))


def test_a_moved_fits_epoch_metrics_count_the_batches_before_the_move(monkeypatch, tmp_path):
    """self.log(..., on_epoch=True) sums over the epoch in Lightning's result collection, which its checkpoint
    leaves out: a run moved mid-epoch logged train_loss_epoch over the batches after the move only, and a
    ReduceLROnPlateau monitoring it stepped on another value (a silent divergence). Means, sums and maxima now
    go on from what the epoch had summed, bit for bit."""
    ckpt = _patched(monkeypatch, tmp_path)

    class Module(_linear()):
        seen: list

        def training_step(self, batch, i):
            loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            self.log("worst", loss, on_step=False, on_epoch=True, reduce_fx="max")
            self.log("total", loss, on_step=False, on_epoch=True, reduce_fx="sum")
            return loss

        def on_validation_epoch_start(self):       # (after the training epoch's metrics were computed)
            if "train_loss_epoch" in self.trainer.callback_metrics:
                self.seen.append({k: self.trainer.callback_metrics[k].item()
                                  for k in ("train_loss_epoch", "worst", "total")})

        def validation_step(self, batch, i):
            pass

        def configure_optimizers(self):
            return _plateau(self, "train_loss_epoch")

    _moved_alike(monkeypatch, ckpt, Module)


def test_a_moved_fits_torchmetrics_count_the_batches_before_the_move(monkeypatch, tmp_path):
    """A torchmetrics Metric logged by object (the pattern Lightning's documentation teaches) keeps its counts in
    attributes its state_dict() leaves out: a run moved mid-epoch computed the epoch's error over the batches after
    the move only, and the ReduceLROnPlateau monitoring it stepped on another value."""
    tm = pytest.importorskip("torchmetrics")
    ckpt = _patched(monkeypatch, tmp_path)

    class Module(_linear()):
        seen: list

        def __init__(self):
            super().__init__()
            self.train_mae = tm.MeanAbsoluteError()

        def training_step(self, batch, i):
            pred = self.net(batch[0])
            self.train_mae(pred, batch[1])
            self.log("train_mae", self.train_mae, on_step=False, on_epoch=True)
            return nn.functional.mse_loss(pred, batch[1])

        def on_validation_epoch_start(self):
            if "train_mae" in self.trainer.callback_metrics:
                self.seen.append(self.trainer.callback_metrics["train_mae"].item())

        def validation_step(self, batch, i):
            pass

        def configure_optimizers(self):
            return _plateau(self, "train_mae")

    _moved_alike(monkeypatch, ckpt, Module)


def test_a_moved_fits_own_callbacks_keep_what_they_counted(monkeypatch, tmp_path):
    """A callback of the script's own with no state_dict(), counting batches in an attribute (here: it cuts the
    learning rate once it has seen 20), was built anew by the moved process, which never cut it: the run trained on
    with another LR while it said it was movable. Its plain attributes are carried now, put back after the new
    process's on_train_start (which resets the count here) and the epoch start it does again. So is a tensor: its
    worst loss, a tensor since max() took the step's output over -inf, was refused a move before."""
    import lightning.pytorch as pl
    ckpt = _patched(monkeypatch, tmp_path)

    class CutAfter(pl.Callback):
        def __init__(self):
            self.seen, self.cut_at, self.epoch_batches, self.worst = 0, None, 0, float("-inf")

        def on_train_start(self, trainer, pl_module):
            self.seen = 0

        def on_train_epoch_start(self, trainer, pl_module):
            self.epoch_batches = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.seen += 1
            self.epoch_batches += 1
            self.worst = max(self.worst, outputs["loss"])
            if self.seen == 20:
                self.cut_at = trainer.global_step
                for group in trainer.optimizers[0].param_groups:
                    group["lr"] *= 0.1

    class Module(_linear()):
        def training_step(self, batch, i):
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def run(restore=None):
        module, cut = Module(), CutAfter()
        trainer = _fit(monkeypatch, module, ckpt, restore, callbacks=[cut])
        return cut, trainer.optimizers[0].param_groups[0]["lr"], [p.detach().clone() for p in module.parameters()]

    cut, lr, weights = run()
    assert os.path.exists(ckpt) and (cut.seen, cut.cut_at, cut.epoch_batches) == (32, 20, 8) and lr == 0.1 * 0.1
    moved_cut, moved_lr, moved_weights = run(restore=ckpt)
    assert (moved_cut.seen, moved_cut.cut_at, moved_cut.epoch_batches, moved_lr) == (32, 20, 8, lr), vars(moved_cut)
    assert all(torch.equal(a, b) for a, b in zip(weights, moved_weights))
    assert type(moved_cut.worst) is torch.Tensor and torch.equal(moved_cut.worst, cut.worst)


def test_a_moved_fits_step_outputs_kept_for_the_epochs_end_count_the_steps_before_the_move(monkeypatch, tmp_path):
    """Lightning's documented way to work on a whole epoch's outputs: training_step appends to a list the module
    keeps, on_train_epoch_end averages and clears it. A run moved mid-epoch averaged the steps after the move only,
    and the ReduceLROnPlateau monitoring it stepped on another value."""
    ckpt = _patched(monkeypatch, tmp_path)

    class Module(_linear()):
        seen: list

        def __init__(self):
            super().__init__()
            self.training_step_outputs = []

        def training_step(self, batch, i):
            loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.training_step_outputs.append(loss.detach())
            return loss

        def on_train_epoch_end(self):
            average = torch.stack(self.training_step_outputs).mean()
            self.seen.append(average.item())
            self.log("epoch_average", average)
            self.training_step_outputs.clear()

        def configure_optimizers(self):
            return _plateau(self, "epoch_average")

    def run(restore=None):
        module = Module()
        module.seen = []
        trainer = _fit(monkeypatch, module, ckpt, restore, limit_val_batches=0)
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        return module.seen, lr, [p.detach().clone() for p in module.parameters()]

    seen, lr, weights = run()
    assert os.path.exists(ckpt) and len(seen) == 4, seen
    moved_seen, moved_lr, moved_weights = run(restore=ckpt)
    # (`seen`, a list the module keeps, is carried too: the epochs before the move are in it)
    assert (moved_seen, moved_lr) == (seen, lr), (seen, moved_seen, lr, moved_lr)
    assert all(torch.equal(a, b) for a, b in zip(weights, moved_weights))


def test_a_moved_fit_takes_the_step_interval_plateau_step_due_after_its_boundary(monkeypatch, tmp_path):
    """A ReduceLROnPlateau stepping by "step" is stepped by Lightning after the batch-end hooks, where gmux's
    boundary is (on_advance_end, after any validation). A process restored there resumes with the next batch:
    before, a run moved at a batch the scheduler stepped after skipped that step (its LR ended 0.1 * 0.5 ** 14,
    not ** 15) and trained on apart while it said it was movable. The step and the metric it takes are carried."""
    from gmux.job.checkpoint import CheckpointError
    from gmux.job.frameworks import lightning_state
    ckpt = _patched(monkeypatch, tmp_path)

    class Module(_linear()):
        def training_step(self, batch, i):
            loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            # (no step improves on the first by 10: the LR halves at every 2nd batch of an epoch)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=10.0,
                                                                 threshold_mode="abs")
            return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "train_loss",
                                                       "interval": "step", "frequency": 2}}

    def run(restore=None):
        module = Module()
        trainer = _fit(monkeypatch, module, ckpt, restore, at=18, limit_val_batches=0)     # (epoch 2's 4th batch)
        return trainer, [p.detach().clone() for p in module.parameters()]

    trainer, weights = run()
    assert os.path.exists(ckpt) and trainer.optimizers[0].param_groups[0]["lr"] == 0.1 * 0.5 ** 15
    moved, moved_weights = run(restore=ckpt)
    assert moved.optimizers[0].param_groups[0]["lr"] == 0.1 * 0.5 ** 15
    assert all(torch.equal(a, b) for a, b in zip(weights, moved_weights))

    due = frameworks.saved_state(ckpt, "lightning")["plateaus_due"]
    assert len(due) == 1 and due[0][0] == 0
    for bad in ([[1, due[0][1]]], [[0, "0.5"]], [[0, torch.zeros(2)]], {"0": 1}):
        with pytest.raises(CheckpointError, match="c.ckpt: state 'plateaus_due' is not"):
            lightning_state.checked_plateaus(moved, bad, "c.ckpt")


@pytest.mark.parametrize("kind, named", [(lambda v: {v}, "'best' (a set)"), (float, None),
                                         (lambda v: __import__("numpy").float32(v), None),
                                         (lambda v: __import__("collections").deque([v], maxlen=2), None)])
def test_a_module_counting_in_numbers_gmux_does_not_carry_is_refused_a_move(monkeypatch, tmp_path, kind, named):
    """A LightningModule keeping its best loss in a set beside a count of its batches (it cuts the LR at the 20th):
    gmux carries a module's plain attributes, tensors, NumPy numbers and deques, not a set, and left this module's
    out whole. Before, the job said it was movable, and a moved run's module counted from 0 again, cut the LR 17
    batches late and ended with other weights. Now a move is refused, naming the attribute; with a float, a NumPy
    float32 or a deque it moves, exactly, and its best comes back of its kind."""
    from gmux.job import movability
    ckpt = _patched(monkeypatch, tmp_path)

    class Module(_linear()):
        def __init__(self):
            super().__init__()
            self.best, self.count, self.problems = kind(1e9), 0, []

        def training_step(self, batch, i):
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def on_train_batch_end(self, outputs, batch, i):
            self.best, self.count = kind(float(outputs["loss"])), self.count + 1
            if self.count == 20:
                for group in self.trainer.optimizers[0].param_groups:
                    group["lr"] *= 0.1
            if self.trainer.global_step == 17:      # (the checkpoint's boundary, after the refresh before it)
                self.problems.append(movability.problem(frameworks._job, fresh=True))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Module()
    _fit(monkeypatch, module, ckpt)
    assert os.path.exists(ckpt) and len(module.problems) == 1
    if named is not None:
        assert module.problems[0].startswith(f"its module Module's attribute {named} changed"), module.problems
        return
    assert module.problems == [None]
    moved = Module()
    _fit(monkeypatch, moved, ckpt, restore=ckpt)
    assert (moved.count, moved.best, type(moved.best)) == (module.count, module.best, type(module.best)), \
        (moved.count, module.count, moved.best, module.best)
    assert all(torch.equal(a, b) for a, b in zip(module.parameters(), moved.parameters()))


def test_a_moved_fit_ran_the_modules_batch_end_hook_of_the_batch_it_was_moved_at(monkeypatch, tmp_path):
    """The module's on_train_batch_end runs after every callback's, gmux's among them: with the boundary at gmux's
    hook, a process moved there left before it, and the restored one resumed with the next batch. Before: an EMA
    of the weights kept in a buffer and updated in that hook (a common recipe) missed the update of the move's
    batch, and ended other than unmoved, while the job said it was movable. The boundary now follows it."""
    ckpt = _patched(monkeypatch, tmp_path)

    class Module(_linear()):
        def __init__(self):
            super().__init__()
            self.register_buffer("ema", torch.zeros(4))
            self.register_buffer("updates", torch.zeros((), dtype=torch.long))

        def training_step(self, batch, i):
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def on_train_batch_end(self, outputs, batch, i):
            self.ema.mul_(0.5).add_(self.net.weight.detach()[0], alpha=0.5)
            self.updates += 1

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module, moved = Module(), Module()
    _fit(monkeypatch, module, ckpt)
    _fit(monkeypatch, moved, ckpt, restore=ckpt)
    assert os.path.exists(ckpt) and int(module.updates) == 32
    assert int(moved.updates) == 32          # (before: 31)
    assert all(torch.equal(a, b) for a, b in zip(module.buffers(), moved.buffers()))


def test_a_moved_fit_finds_the_metrics_logged_before_the_move_in_callback_metrics(monkeypatch, tmp_path):
    """trainer.callback_metrics holds each metric's last logged value, which schedulers and callbacks read between
    logs; Lightning's checkpoint leaves it out. Before: a ReduceLROnPlateau stepping by "step" on val_loss, logged by
    validations every 3 batches (val_check_interval), found nothing in a moved run's process until its next
    validation, skipped its steps there (strict=False; strict=True raised), and the run ended with other weights
    while it said it was movable. The metrics are carried and put back."""
    ckpt = _patched(monkeypatch, tmp_path)

    Module = _on_val_loss_plateau(interval="step", strict=False)

    def run(restore=None):
        module = Module()
        trainer = _fit(monkeypatch, module, ckpt, restore, at=3, val_check_interval=3)
        return trainer.optimizers[0].param_groups[0]["lr"], [p.detach().clone() for p in module.parameters()]

    lr, weights = run()
    moved_lr, moved_weights = run(restore=ckpt)
    assert os.path.exists(ckpt) and moved_lr == lr, (lr, moved_lr)
    assert all(torch.equal(a, b) for a, b in zip(weights, moved_weights))
    from gmux.job.checkpoint import CheckpointError
    from gmux.job.frameworks import lightning_state
    assert set(frameworks.saved_state(ckpt, "lightning")["callback_metrics"]) == {"val_loss"}
    for bad in ({"val_loss": "0.5"}, {"val_loss": torch.zeros(2)}, {3: torch.zeros(())}, ["val_loss"]):
        with pytest.raises(CheckpointError, match="c.ckpt: state 'callback_metrics' is not"):
            lightning_state.checked_callback_metrics(bad, "c.ckpt")
