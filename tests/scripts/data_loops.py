"""Data loops as scripts write them beyond one loader per epoch. Moved into a new process, each must end with the
weights of an uninterrupted run (tests/test_bit_identical.py).

usage: data_loops.py OUT --mode MODE [--migrate-at STEP --checkpoint PATH] [--restore PATH]

modes:
  validate     each epoch's validation through job.data too, after training (dropout on), then job.boundary();
               the move is asked for during the validation after STEP (it waits for the next epoch's boundary);
  made-early   the validation's job.data made before the training loop, read after it;
  eval-inside  an evaluation through job.data every 3 steps, inside the training loop;
  zip          zip(job.data(a), job.data(b)), each loader with its own generator;
  zip-global   the same, both loaders shuffled from torch's stream;
  tqdm         job.data(tqdm(loader)), the loader with its own generator (the bar hides it);
  map          job.data(map(to_device, loader)), the same (map has made the loader's iterator already);
  epoch-end    StepLR stepped after each epoch's loop, then job.boundary(): the move is asked for there (it waits
               for the next epoch's first boundary);
  steps        no job.epochs: job.data made again whenever it ends, a sampler shuffling with numpy, a step budget;
  kept         one job.data made before job.epochs and read in each, three batches an epoch (a step budget): a pass
               goes on in the next epoch, and once it ends the next is read;
  forever      no job.epochs: one job.data, cycled by a generator of the script's own (read again once ended, it
               reads its loader again), next() to a step budget;
  last-batch   the loop's last loss kept after each epoch's loop (a loop variable the script reads after the loop):
               a move asked for at an epoch's last batch waits for the next epoch's first fetch;
  stream       the same over an IterableDataset with no length that draws noise as it is read: no boundary says
               which batch is last, so every move waits for the next fetch, and is taken before that batch is given.
"""
import argparse
import sys

import numpy as np
import torch
from torch import nn

import gmux.job


class NumpyShuffled(torch.utils.data.Sampler):
    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(np.random.permutation(self.n).tolist())


class Noisy(torch.utils.data.IterableDataset):
    """Five batches' rows with noise drawn from torch's stream as they are read; no __len__."""
    def __init__(self, data):
        self.data = data

    def __iter__(self):
        for x, y in self.data:
            yield x + 0.01 * torch.randn(6), y


def loader(seed: int, n: int = 40, shuffle: bool = True, **kw):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    if "sampler" in kw or not shuffle:
        return torch.utils.data.DataLoader(data, batch_size=8, **kw)
    return torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(seed))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--mode", required=True,
                   choices=["validate", "made-early", "eval-inside", "zip", "zip-global", "tqdm", "map", "epoch-end",
                            "steps", "kept", "forever", "last-batch", "stream"])
    p.add_argument("--migrate-at", type=int)
    p.add_argument("--checkpoint")
    p.add_argument("--restore")
    a = p.parse_args()
    torch.manual_seed(0)
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    # (a validation loader shuffled by a generator of its own would need it attached: gmux sees its state only
    # while it is read)
    train, other = loader(1), loader(2, 24, shuffle=a.mode == "zip")
    if a.mode == "stream":
        train = torch.utils.data.DataLoader(Noisy(train.dataset), batch_size=8)
    if a.mode == "zip-global":
        data = train.dataset
        train = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
        other = torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(24)), batch_size=8, shuffle=True)
    job = gmux.job.attach(model, opt, sched, state={"step": 0, "val": [], "asked": False})
    if a.restore:
        job.restore(a.restore)
    # Drawn between attach and the loop (a probe, a fixed noise), from each stream: a restored process draws it as
    # the first process did, and the loop's draws after the move are the checkpoint's.
    probe = [torch.rand(2).tolist(), np.random.rand(2).tolist()]

    def ask(where: str):
        asked_here = {"validate": "validate", "epoch-end": "epoch-end"}.get(a.mode, "step")
        if where == asked_here and a.migrate_at is not None and job.state["step"] >= a.migrate_at \
                and not job.state["asked"]:
            job.state["asked"] = True
            job.controller.send("migrate", path=a.checkpoint)

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        job.state["step"] += 1
        ask("step")
        return loss

    def evaluate(batches=None):
        with torch.no_grad():       # dropout stays on: evaluation draws from torch's stream too
            losses = []
            for x, y in batches if batches is not None else job.data(other):
                losses.append(float(nn.functional.mse_loss(model(x), y)))
                ask(a.mode)
            job.state["val"].append(sum(losses))

    if a.mode == "steps":
        train = loader(1, sampler=NumpyShuffled(40))
        while job.state["step"] < 17:
            for x, y in job.data(train):
                step(x, y)
                if job.state["step"] == 17:
                    break
    if a.mode == "forever":
        def forever(batches):
            while True:
                yield from batches
        endless = forever(job.data(train))
        while job.state["step"] < 17:
            step(*next(endless))
    kept = job.data(train) if a.mode == "kept" else None
    for epoch in job.epochs(0 if a.mode in ("steps", "forever") else 3):
        early = job.data(other) if a.mode == "made-early" else None
        if a.mode == "kept":
            for x, y in kept:
                step(x, y)
                if job.state["step"] == 3 * (epoch + 1):
                    break
            continue
        if a.mode in ("zip", "zip-global"):
            for (x, y), (x2, y2) in zip(job.data(train), job.data(other)):
                step(torch.cat([x, x2]), torch.cat([y, y2]))
        elif a.mode == "tqdm":
            from tqdm import tqdm
            for x, y in job.data(tqdm(train, disable=True)):
                step(x, y)
        elif a.mode == "map":
            for x, y in job.data(map(lambda batch: [t.to("cpu") for t in batch], train)):
                step(x, y)
        else:
            for x, y in job.data(train):
                loss = step(x, y)
                if a.mode == "eval-inside" and job.state["step"] % 3 == 0:
                    evaluate()
            if a.mode in ("last-batch", "stream"):
                job.state["val"].append(float(loss))
        if a.mode == "validate":
            evaluate()
            job.boundary()
        if a.mode == "made-early":
            evaluate(early)
        if a.mode == "epoch-end":
            sched.step()
            ask("epoch-end")
            job.boundary()
    torch.save({"model": model.state_dict(), "val": job.state["val"], "lr": sched.get_last_lr(), "probe": probe},
               a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
