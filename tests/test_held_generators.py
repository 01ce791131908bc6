"""A loader's dataset or sampler drawing from a random generator it holds of its own: a torch one is kept with the
loader's and a move is exact; a NumPy or Python one, which no state holds, refuses a move once it has drawn, naming
it, until the script attaches it (before: every such move was taken, silently inexact)."""
import os
import random

import numpy as np
import pytest
import torch
from torch import nn

import gmux.job as gj
from gmux_testkit import assert_identical, run_py

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "held_generators.py")


@pytest.mark.parametrize("kind,options", [("torch", []), ("numpy", ["--attach"])])
def test_a_dataset_drawing_from_its_own_generator_kept_or_attached_moves_exactly(kind, options, tmp):
    run_py(SCRIPT, f"{tmp}/solo.pt", kind, *options)
    out = run_py(SCRIPT, f"{tmp}/first.pt", kind, *options, "--migrate-at", "8", "--checkpoint", f"{tmp}/a.ckpt")
    assert os.path.exists(f"{tmp}/a.ckpt"), out.stderr
    run_py(SCRIPT, f"{tmp}/moved.pt", kind, *options, "--restore", f"{tmp}/a.ckpt")
    assert_identical(torch.load(f"{tmp}/solo.pt"), torch.load(f"{tmp}/moved.pt"), kind)


class _Noisy(torch.utils.data.Dataset):
    def __init__(self, rng, draws=True):
        self.x, self.rng, self.draws = torch.randn(12, 2), rng, draws

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.draws:
            self.rng.random()
        return self.x[i]


class _Augment:
    def __init__(self):
        self.rng = random.Random(3)

    def __call__(self, batch):
        return torch.stack(batch) * self.rng.random()


@pytest.mark.parametrize("where,make", [
    ("loader.dataset.rng (a NumPy Generator", lambda: _loader(_Noisy(np.random.default_rng(1)))),
    ("loader.dataset.dataset.rng (a NumPy RandomState",
     lambda: _loader(torch.utils.data.Subset(_Noisy(np.random.RandomState(1)), range(8)))),
    ("loader.dataset.rng (a random.Random", lambda: _loader(_Noisy(random.Random(1)))),
    ("loader.collate_fn.rng (a random.Random",
     lambda: torch.utils.data.DataLoader(torch.randn(12, 2), batch_size=3, collate_fn=_Augment()))])
def test_a_generator_the_loader_holds_that_drew_refuses_a_move_naming_it_and_the_job_runs_on(where, make, tmp):
    loader = make()
    job = gj.attach(nn.Linear(2, 1))
    seen = []
    for epoch in job.epochs(2):
        for x in job.data(loader):
            seen.append(x)
            if epoch == 1 and job.position.index == 2:
                why = job.report()["unmovable"]
                assert why is not None and why.startswith(where) and "attach(model, optimizer, loader." in why, why
                move = job.controller.send("migrate", path=f"{tmp}/m.ckpt")
    reply = job.controller.result(move, timeout=5)
    assert not reply["ok"] and reply["error"] == why and not os.path.exists(f"{tmp}/m.ckpt")
    assert len(seen) == 2 * len(loader)         # and it ran on to its end


def test_a_generator_the_loader_holds_that_never_draws_or_is_attached_leaves_the_job_movable():
    quiet, drawing = _Noisy(np.random.default_rng(1), draws=False), _Noisy(random.Random(1))
    for dataset in (quiet, drawing):
        job = gj.attach(nn.Linear(2, 1), drawing.rng)
        for _ in job.epochs(2):
            for _ in job.data(_loader(dataset)):
                assert job.report()["movable"], job.report()["unmovable"]
        assert len(job.position.watched) == (dataset is quiet)


def _loader(dataset):
    return torch.utils.data.DataLoader(dataset, batch_size=3)
