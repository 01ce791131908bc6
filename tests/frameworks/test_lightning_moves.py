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


def test_a_moved_fit_steps_its_plateau_scheduler_at_the_end_of_the_epoch_it_was_moved_in(monkeypatch, tmp_path):
    """Lightning's restore leaves its fit loop "restarting" until the restored epoch ends, and skips a
    ReduceLROnPlateau's step there (it assumes the monitored metric lost), though that epoch validates in the
    restored process as it did unmoved. Before: a run moved mid-epoch missed one LR reduction and trained on with
    another LR, while it said it was movable."""
    import lightning.pytorch as pl
    import lightning.pytorch.trainer.trainer as trainer_module
    from lightning.pytorch.utilities.combined_loader import CombinedLoader
    from gmux.job.frameworks import lightning
    for owner, name in ((pl.Trainer, "fit"), (CombinedLoader, "__iter__"), (CombinedLoader, "__next__")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    monkeypatch.setattr(pl.Trainer, "_gmux_patched", False, raising=False)
    lightning.patch(trainer_module)
    ckpt = str(tmp_path / "moved.ckpt")

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 1)

        def training_step(self, batch, i):
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def validation_step(self, batch, i):
            self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            # (no epoch improves on the first by 10: the LR halves at the end of every epoch after it)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=10.0,
                                                                 threshold_mode="abs")
            return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}

    def run(restore=None):
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
            if restore is None and len(boundaries) == 17:    # epoch 2 (7 boundaries an epoch), its 3rd batch
                job._discover(job)          # (as before any command)
                job.checkpoint(ckpt)        # what a move carries; the fit goes on as if unmoved
        monkeypatch.setattr(job, "boundary", boundary)
        module = Module()
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=4, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module, DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=32))
        return trainer.optimizers[0].param_groups[0]["lr"], [p.detach().clone() for p in module.parameters()]

    lr, weights = run()
    assert os.path.exists(ckpt) and lr == 0.1 * 0.5 ** 3
    moved_lr, moved_weights = run(restore=ckpt)
    assert moved_lr == lr, (lr, moved_lr)          # (before: 0.1 * 0.5 ** 2)
    assert all(torch.equal(a, b) for a, b in zip(weights, moved_weights))
