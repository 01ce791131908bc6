"""A random generator the script holds in a variable of its own and draws from in its loop, not given to attach()
(gmux.job.script_generators): a new process built it anew from its seed and the moved run ended with other weights,
nothing said (a noise generator drawn at each step, moved at step 7 of 36). Such a move is refused, naming it, and
the job runs on to the weights of an unmoved run; attached, the generator moves with the job."""
import os
import random

import numpy as np
import pytest
import torch
from torch import nn

import gmux.job as gj
from gmux.job.job import JobExit


def _train(tmp, make, attach_it=False, at=5):
    """Two epochs of 4 batches drawing noise from `make()`'s generator at each step; a move asked for at step
    `at`: (the move's reply, the steps taken)."""
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    noise = make()
    loader = torch.utils.data.DataLoader(torch.randn(12, 2), batch_size=3, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
    job = gj.attach(model, opt, *([noise] if attach_it else []))
    steps, move = 0, None
    try:
        for _ in job.epochs(2):
            for x in job.data(loader):
                draw = torch.rand((), generator=noise) if isinstance(noise, torch.Generator) else noise.random()
                model(x * float(draw)).sum().backward()
                opt.step()
                opt.zero_grad()
                steps += 1
                if steps == at:
                    move = job.controller.send("migrate", path=f"{tmp}/a.ckpt")
    except JobExit:         # (moved: this process leaves)
        pass
    return job.controller.result(move, timeout=5), steps


@pytest.mark.parametrize("make,kind", [(lambda: torch.Generator().manual_seed(7), "torch.Generator"),
                                       (lambda: random.Random(7), "random.Random"),
                                       (lambda: np.random.default_rng(7), "NumPy Generator")])
def test_a_generator_of_the_scripts_that_drew_in_the_loop_refuses_a_move_naming_it(make, kind, tmp):
    reply, steps = _train(tmp, make)
    assert not reply["ok"] and reply["error"].startswith(f"the script's `noise` (a {kind}) has drawn since the "
                                                         f"job's loop began"), reply
    assert "attach(model, optimizer, noise)" in reply["error"] and not os.path.exists(f"{tmp}/a.ckpt")
    assert steps == 8


def test_one_attached_or_drawn_only_before_the_loop_leaves_the_job_movable(tmp):
    reply, _ = _train(tmp, lambda: torch.Generator().manual_seed(7), attach_it=True)
    assert reply["ok"], reply
    split = torch.Generator().manual_seed(3)      # (a random_split's, drawn while the script sets up)
    torch.utils.data.random_split(range(12), [8, 4], generator=split)
    model = nn.Linear(2, 1)
    job = gj.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for x in job.data(torch.utils.data.DataLoader(torch.randn(12, 2), batch_size=3, shuffle=True,
                                                  generator=torch.Generator().manual_seed(1))):
        assert job.report()["movable"], job.report()["unmovable"]
    assert len(job.position.script_gens.seen) == 1
