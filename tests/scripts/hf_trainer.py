"""A Hugging Face Trainer script as people write them: a small regression model with dropout, a map-style
dataset with a random transform and a collator that both add noise from torch's global random stream (as
image transforms draw crops and masking collators their masks),
TrainingArguments with gradient accumulation, a linear warm-up schedule and AdamW, then train().

usage: hf_trainer.py OUT [--epochs N] [--samples N] [--sleep S [--unpaced-when PATH]] [--wait-for FILE]
                       [--ignore-data-skip] [--workers N]
                       [--no-noise] [--eval-steps N] [--save-steps N]
Writes OUT as JSON: the sha256 of the final weights, the global step, the step this process started
training at (more than 0 when gmux restored it after a move), and the run's train_loss and total_flos. --sleep
stands for waiting on input in the collator each micro-batch; it changes no number. --wait-for holds training
back until FILE exists (a test's starting gun; no number changes). --ignore-data-skip sets the Trainer's
ignore_data_skip (a resumed run would not skip what was trained on: a setup gmux refuses to move). --workers loads the data
in N worker processes; --no-noise leaves the noise out. --eval-steps evaluates at the start and every N steps
on two sets of points of their own, drawn with the same noise (OUT's "evals": each evaluation's step and loss,
in the order logged); --save-steps saves a
checkpoint every N steps in OUT-checkpoints/ (the Trainer's output directory; its own, not gmux's).
"""
import argparse
import hashlib
import json
import os
import time

import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--samples", type=int, default=256)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--unpaced-when", metavar="PATH", help="no more --sleep once PATH exists (the numbers are the same)")
p.add_argument("--wait-for", default=None, help="train only once this file exists")
p.add_argument("--ignore-data-skip", action="store_true")
p.add_argument("--workers", type=int, default=0)
p.add_argument("--no-noise", action="store_true")
p.add_argument("--eval-steps", type=int, default=0, help="evaluate at the start and every N steps")
p.add_argument("--save-steps", type=int, default=0, help="save the Trainer's own checkpoint every N steps")
a = p.parse_args()
torch.set_num_threads(1)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 128), nn.ReLU(),
                                 nn.Linear(128, 1))

    def forward(self, x, labels=None):
        pred = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(pred, labels), "logits": pred}


class Points(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 16, generator=g)
        self.y = self.x[:, :4].sum(1) + 0.1 * torch.randn(n, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i] if a.no_noise else self.x[i] + 0.02 * torch.randn(16)
        return {"x": x, "labels": self.y[i]}


def collate(items):
    if a.sleep and not (a.unpaced_when and os.path.exists(a.unpaced_when)):
        time.sleep(a.sleep)
    batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
    if not a.no_noise:
        batch["x"] = batch["x"] + 0.05 * torch.randn_like(batch["x"])
    return batch


# The first global step this process trained: a global, not the callback's own attribute, which a move
# carries to the new process as an unmoved run would have it.
FIRST: list = []


class FirstStep(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if not FIRST:
            FIRST.append(state.global_step)


args = TrainingArguments(output_dir=a.out + "-checkpoints", per_device_train_batch_size=8,
                         gradient_accumulation_steps=2, num_train_epochs=a.epochs, learning_rate=3e-3,
                         lr_scheduler_type="linear", warmup_steps=5, weight_decay=0.01, logging_strategy="no",
                         save_strategy="steps" if a.save_steps else "no", save_steps=a.save_steps or 500,
                         report_to="none", seed=0, use_cpu=True, disable_tqdm=True,
                         dataloader_num_workers=a.workers, ignore_data_skip=a.ignore_data_skip,
                         **({"eval_strategy": "steps", "eval_steps": a.eval_steps, "per_device_eval_batch_size": 8,
                             "eval_on_start": True} if a.eval_steps else {}))
set_seed(0)
first = FirstStep()
trainer = Trainer(model=Regressor(), args=args, train_dataset=Points(a.samples), data_collator=collate,
                  eval_dataset={"near": Points(32), "far": Points(16)} if a.eval_steps else None, callbacks=[first])
while a.wait_for and not os.path.exists(a.wait_for):
    time.sleep(0.05)
run = trainer.train()
digest = hashlib.sha256()
for name, t in sorted(trainer.model.state_dict().items()):
    digest.update(name.encode() + t.detach().contiguous().numpy().tobytes())
with open(a.out, "w") as f:
    json.dump({"sha256": digest.hexdigest(), "global_step": trainer.state.global_step,
               "first_step": (FIRST or [None])[0], "pid": os.getpid(),
               "totals": [run.training_loss, trainer.state.total_flos],
               "evals": [(e["step"], k, v) for e in trainer.state.log_history for k, v in sorted(e.items())
                         if k.startswith("eval_") and k.endswith("_loss")]}, f)
