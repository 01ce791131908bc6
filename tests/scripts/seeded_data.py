"""A loop whose data is random three ways: a loader shuffled by a torch.Generator of its own, and a dataset
(no loader workers) that adds numpy and `random` noise in __getitem__. Moved into a new process mid-epoch,
it must end with the weights of an uninterrupted run (tests/test_bit_identical.py).

usage: seeded_data.py OUT [--accum N] [--own-generators [--unattached]] [--sampler KIND [--attach-sampler]]
                        [--migrate-at STEP --checkpoint PATH] [--restore PATH [--move-again]]

--accum N: an optimizer step every N batches, the script marking its boundaries (job.boundary()) after each;
--move-again: restored, it is asked to move again at once (at its next boundary, which must be its own);
--own-generators: the noise comes from generators the script holds (a NumPy Generator and RandomState, a
random.Random, a torch.Generator), attached with the model; --unattached: not attached (a move then changes it);
--sampler weighted|subset: the epoch's order comes from a WeightedRandomSampler's or SubsetRandomSampler's own
generator, not the loader's (--attach-sampler: that generator attached with the model too);
--workers N: the loader's workers (--persistent: persistent_workers=True); --quiet-data: the dataset adds no noise;
--tqdm: the loader read through a progress bar (tqdm, disabled); --map: through map(), made before job.data;
--epoch-draws: no loader: at each epoch's start the script draws an order of its list of batches (random.sample)
and the epoch's loss weight from numpy and torch, before job.data walks the list in that order;
--stream: the loader batches an IterableDataset that draws each sample from torch and `random` as it goes (its
samplers have no length).
"""
import argparse
import random
import sys

import numpy as np
import torch

import gmux.job


class Noisy(torch.utils.data.Dataset):
    def __init__(self, own: bool, quiet: bool = False):
        self.quiet = quiet
        self.x = torch.randn(96, 8)
        self.y = self.x.sum(1, keepdim=True)
        self.gens = [np.random.default_rng(1), np.random.RandomState(2), random.Random(3),
                     torch.Generator().manual_seed(4)] if own else []

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.quiet:
            return self.x[i], self.y[i]
        if self.gens:
            new, legacy, py, tg = self.gens
            noise = float(new.normal()) * 0.01 + float(legacy.normal()) * 0.01 + py.random() * 0.01
            return self.x[i] + noise + torch.rand(8, generator=tg) * 0.01, self.y[i]
        noise = float(np.random.normal()) * 0.01 + random.random() * 0.01
        return self.x[i] + noise, self.y[i]


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        for _ in range(96):
            x = torch.randn(8)
            yield x + random.random() * 0.01, x.sum(0, keepdim=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--migrate-at", type=int)
    p.add_argument("--checkpoint")
    p.add_argument("--restore")
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--move-again", action="store_true")
    p.add_argument("--own-generators", action="store_true")
    p.add_argument("--unattached", action="store_true")
    p.add_argument("--sampler", choices=["weighted", "subset"])
    p.add_argument("--attach-sampler", action="store_true")
    p.add_argument("--epoch-draws", action="store_true")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--quiet-data", action="store_true")
    p.add_argument("--tqdm", action="store_true")
    p.add_argument("--map", action="store_true")
    p.add_argument("--stream", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Noisy(a.own_generators, a.quiet_data)
    if a.stream:
        loader = torch.utils.data.DataLoader(Stream(), batch_size=8)
    elif a.sampler:
        g = torch.Generator().manual_seed(3)
        sampler = (torch.utils.data.WeightedRandomSampler(torch.rand(len(data)), len(data), generator=g)
                   if a.sampler == "weighted" else torch.utils.data.SubsetRandomSampler(range(88), generator=g))
        loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)
    else:
        loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, num_workers=a.workers,
                                             persistent_workers=a.persistent,
                                             generator=torch.Generator().manual_seed(7))
    attached = ([] if a.unattached else data.gens) + ([loader.sampler.generator] if a.attach_sampler else [])
    job = gmux.job.attach(model, optimizer, *attached, state={"step": 0})
    if a.restore:
        job.restore(a.restore)
        if a.move_again:
            job.controller.send("migrate", path=a.checkpoint)
    listed = [(data.x[k:k + 8], data.y[k:k + 8]) for k in range(0, len(data), 8)]
    for _ in job.epochs(4):
        weight = 1.0
        if a.epoch_draws:
            order = random.sample(listed, len(listed))
            weight = float(np.random.uniform(0.5, 1.5)) * float(torch.rand(()) + 0.5)
        source = order if a.epoch_draws else loader
        if a.tqdm:
            from tqdm import tqdm
            source = tqdm(source, disable=True)
        if a.map:
            source = map(lambda batch: batch, source)
        for i, (x, y) in job.enumerate(source):
            (weight * torch.nn.functional.mse_loss(model(x), y)).backward()
            if (i + 1) % a.accum:
                continue
            optimizer.step()
            optimizer.zero_grad()
            job.state["step"] += 1
            if job.state["step"] == a.migrate_at:
                job.controller.send("migrate", path=a.checkpoint)
            if a.accum > 1 or job.state["step"] == a.migrate_at:
                job.boundary()
    torch.save(model.state_dict(), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
