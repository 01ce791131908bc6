"""A Lightning script as people write them: a LightningModule with dropout, a shuffled DataLoader whose collate
function adds noise from torch's global random stream (an augmentation), Adam with a per-step LR schedule,
gradient accumulation, then Trainer.fit().

usage: lightning_train.py OUT [--epochs N] [--samples N] [--sleep S [--unpaced-when PATH]] [--wait-for FILE]
                           [--workers N] [--persistent] [--no-noise] [--freeze-from-epoch N] [--logs DIR]
                           [--own-scheduler]
Writes OUT as JSON: the sha256 of the final weights, the global step, and the step this process started
training at (more than 0 when gmux restored it after a move). --sleep stands for waiting on input in the
collate function each batch; it changes no number. --wait-for holds training back until FILE exists (a
test's starting gun; no number changes). --workers loads the data in N worker processes (--persistent: kept
across epochs); --no-noise leaves the collate function's noise out; --freeze-from-epoch N: the LightningModule's
on_train_epoch_start freezes its first layer from epoch N on (a fine-tuning schedule). --logs DIR logs the
training loss at every step (so a move leaves at a logged step) and its mean over each epoch with a CSVLogger
under DIR and keeps the 2 best and the last checkpoints by it (ModelCheckpoint, every 10 steps, in the logger's
directory); OUT then also says what DIR holds: the version directories, the rows of each metrics.csv, the best
checkpoint and the top 2, and the last checkpoint's name and step, of these and of a second ModelCheckpoint
(DIR/earliest) that keeps its first.
--own-scheduler: the per-step schedule is a scheduler of the script's own, not torch's, as timm's are (the
LightningModule steps it in lr_scheduler_step, as Lightning asks of such a scheduler).
"""
import argparse
import hashlib
import json
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate
import lightning.pytorch as pl

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--samples", type=int, default=256)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--unpaced-when", metavar="PATH", help="no more --sleep once PATH exists (the numbers are the same)")
p.add_argument("--wait-for", default=None, help="train only once this file exists")
p.add_argument("--workers", type=int, default=0)
p.add_argument("--persistent", action="store_true")
p.add_argument("--no-noise", action="store_true")
p.add_argument("--freeze-from-epoch", type=int, default=None)
p.add_argument("--logs", default=None)
p.add_argument("--own-scheduler", action="store_true")
a = p.parse_args()
torch.set_num_threads(1)


def collate(items):
    if a.sleep and not (a.unpaced_when and os.path.exists(a.unpaced_when)):
        time.sleep(a.sleep)
    x, y = default_collate(items)
    return (x, y) if a.no_noise else (x + 0.05 * torch.randn_like(x), y)


class StepDecay:
    """timm's schedulers are like this: not torch's, their state in their attributes."""

    def __init__(self, optimizer, every=7, gamma=0.8):
        self.optimizer, self.every, self.gamma, self.updates = optimizer, every, gamma, 0
        self.base = [group["lr"] for group in optimizer.param_groups]

    def step_update(self, num_updates):
        self.updates = num_updates
        for group, base in zip(self.optimizer.param_groups, self.base):
            group["lr"] = base * self.gamma ** (num_updates // self.every)

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state):
        self.__dict__.update(state)


class Regressor(pl.LightningModule):
    def __init__(self, samples):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 128), nn.ReLU(),
                                 nn.Linear(128, 1))
        x = torch.randn(samples, 16)
        self.data = TensorDataset(x, x[:, :4].sum(1, keepdim=True) + 0.1 * torch.randn(samples, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        if a.logs:
            self.log("train_loss", loss)
            self.log("epoch_loss", loss, on_step=False, on_epoch=True)      # (a mean over the epoch's batches)
        return loss

    def on_train_epoch_start(self):
        if a.freeze_from_epoch is not None:
            for p in self.net[0].parameters():
                p.requires_grad_(self.current_epoch < a.freeze_from_epoch)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=3e-3)
        sched = StepDecay(opt) if a.own_scheduler else torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.8)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def lr_scheduler_step(self, scheduler, metric):
        if isinstance(scheduler, StepDecay):
            scheduler.step_update(scheduler.updates + 1)
        else:
            super().lr_scheduler_step(scheduler, metric)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=8, shuffle=True, collate_fn=collate, num_workers=a.workers,
                          persistent_workers=a.persistent)


# The first global step this process trained: a global, not the callback's own attribute, which a move
# carries to the new process as an unmoved run would have it.
FIRST: list = []


class FirstStep(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not FIRST:
            FIRST.append(trainer.global_step)


pl.seed_everything(0, verbose=False)
model = Regressor(a.samples)
first = FirstStep()
kept = pl.callbacks.ModelCheckpoint(monitor="train_loss", save_top_k=2, save_last=True, every_n_train_steps=10)
# at each epoch's end, keeps its first (the smallest step) and a last.ckpt beside it, which it writes only with a
# kept checkpoint or, if it has written none in the process, when training ends
earliest = pl.callbacks.ModelCheckpoint(dirpath=os.path.join(a.logs or ".", "earliest"), monitor="step", mode="min",
                                        save_top_k=1, save_last=True)
trainer = pl.Trainer(max_epochs=a.epochs, accelerator="cpu", devices=1, accumulate_grad_batches=2,
                     logger=pl.loggers.CSVLogger(a.logs) if a.logs else False, log_every_n_steps=1,
                     enable_checkpointing=bool(a.logs), enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[first] + ([kept, earliest] if a.logs else []))
while a.wait_for and not os.path.exists(a.wait_for):
    time.sleep(0.05)
trainer.fit(model)
digest = hashlib.sha256()
for name, t in sorted(model.state_dict().items()):
    digest.update(name.encode() + t.detach().contiguous().numpy().tobytes())
with open(a.out, "w") as f:
    logs = None
    if a.logs:
        root = os.path.join(a.logs, "lightning_logs")
        versions = sorted(os.listdir(root))
        logs = {"versions": versions, "best": os.path.basename(kept.best_model_path),
                "last": [[os.path.basename(k.last_model_path), torch.load(k.last_model_path, weights_only=False)["global_step"]]
                         for k in (kept, earliest)],
                "top": sorted(os.path.basename(k) for k in kept.best_k_models),
                "rows": [open(f).read().splitlines() if os.path.isfile(f) else []
                         for f in (os.path.join(root, v, "metrics.csv") for v in versions)]}
    json.dump({"sha256": digest.hexdigest(), "global_step": trainer.global_step, "first_step": (FIRST or [None])[0],
               "pid": os.getpid(), "logs": logs}, f)
