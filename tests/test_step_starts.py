"""Which of job.data's fetches are boundaries (gmux.job.step_starts): in one process, counted by the job's profile."""
import torch
from torch import nn

import gmux.job as gj
from gmux.job.step_starts import FETCHES_WITHOUT_STEP


def _job_and_loader(batches: int):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(batches, 2), torch.randn(batches, 1))
    return model, opt, gj.attach(model, opt), torch.utils.data.DataLoader(data, batch_size=1)


def _train(model, opt, x, y, step: bool):
    nn.functional.mse_loss(model(x), y).backward()
    if step:
        opt.step()
        opt.zero_grad()


def test_a_fetch_is_a_boundary_only_after_an_optimizer_step():
    """Gradient accumulation by 3 under job.data: 30 batches, 10 steps; the 10 fetches after a step are the
    boundaries (the last one finds the pass's end), where every fetch after the first was (30), and a checkpoint
    asked for between two steps is taken at the next one's start, 6 batches in."""
    model, opt, job, loader = _job_and_loader(30)
    taken = []
    for i, (x, y) in enumerate(job.data(loader)):
        if i == 4:
            job.controller.send("checkpoint", path=lambda b: taken.append(job.position.index))
        _train(model, opt, x, y, step=i % 3 == 2)
    assert job.profile.steps == 10
    assert set(taken) == {6}


def test_a_loop_whose_optimizer_does_not_step_has_every_fetch_a_boundary_after_a_few():
    """An evaluation read as the epoch's loader: no step comes, so from the FETCHES_WITHOUT_STEP-th fetch in a row
    on, every fetch is a boundary again (the 41st finds the pass's end). With no optimizer attached (updates by
    hand), every fetch after the first is one, as before."""
    model, _, job, loader = _job_and_loader(40)
    with torch.no_grad():
        for x, y in job.data(loader):
            model(x)
    assert job.profile.steps == 41 - (FETCHES_WITHOUT_STEP - 1)

    job = gj.attach(model)
    for x, y in job.data(loader):
        nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
    assert job.profile.steps == 40
