"""A loader whose dataset or sampler draws from a random generator it holds of its own (`self.rng =
np.random.default_rng(seed)` for noise, a sampler shuffling with its own generator), moved into a new process or not.

usage: held_generators.py OUT KIND [--attach] [--migrate-at STEP --checkpoint PATH] [--restore PATH]
KIND: torch (a torch.Generator the dataset holds), numpy (np.random.default_rng), legacy (np.random.RandomState),
python (random.Random), sampler (a sampler shuffling with a NumPy generator of its own); --attach gives it to
attach()."""
import argparse
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import gmux.job

p = argparse.ArgumentParser()
p.add_argument("out"); p.add_argument("kind"); p.add_argument("--attach", action="store_true")
p.add_argument("--migrate-at", type=int); p.add_argument("--checkpoint"); p.add_argument("--restore")
a = p.parse_args()
torch.manual_seed(0)
MAKE = {"torch": lambda: torch.Generator().manual_seed(11), "numpy": lambda: np.random.default_rng(11),
        "legacy": lambda: np.random.RandomState(11), "python": lambda: random.Random(11)}


def noise(g) -> torch.Tensor:
    if isinstance(g, torch.Generator):
        return torch.randn(4, generator=g)
    if isinstance(g, random.Random):
        return torch.tensor([g.gauss(0, 1) for _ in range(4)])
    return torch.from_numpy(g.normal(size=4).astype(np.float32))


class Noisy(torch.utils.data.Dataset):
    def __init__(self, kind):
        self.x = torch.randn(24, 4)
        self.rng = MAKE[kind]() if kind in MAKE else None

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i] + (0.1 * noise(self.rng) if self.rng is not None else 0)
        return x, self.x[i].sum(0, keepdim=True)


class OwnShuffle(torch.utils.data.Sampler):
    def __init__(self, n):
        self.n, self.rng = n, np.random.default_rng(7)

    def __len__(self):
        return self.n

    def __iter__(self):
        yield from self.rng.permutation(self.n).tolist()


data = Noisy(a.kind)
sampler = OwnShuffle(len(data)) if a.kind == "sampler" else None
loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler, shuffle=sampler is None)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
own = [g for g in (data.rng, sampler and sampler.rng) if g is not None] if a.attach else []
job = gmux.job.attach(model, opt, *own, state={"step": 0})
if a.restore:
    job.restore(a.restore)
for epoch in job.epochs(3):
    for x, y in job.data(loader):
        opt.zero_grad(); F.mse_loss(model(x), y).backward(); opt.step()
        job.state["step"] += 1
        if job.state["step"] == a.migrate_at:
            job.controller.send("migrate", path=a.checkpoint)
torch.save(model.state_dict(), a.out)
