"""A move names the variables of the script's own that its loops carry from one step to the next (gmux.job.loop_carried):
a new process sets them again as the script does before its loop, and before, nothing said so."""
import pytest
import torch
from torch import nn

import gmux.job as gj


class _Warmup:
    """A learning-rate warmup of the script's own, not attached: its count starts at 0 in a new process."""

    def __init__(self, opt, steps=10):
        self.opt, self.steps, self.count = opt, steps, 0

    def step(self):
        self.count += 1
        for group in self.opt.param_groups:
            group["lr"] = 0.1 * min(1.0, self.count / self.steps)


def test_a_checkpoint_names_what_the_loops_carry_in_their_own_variables_and_not_what_the_job_keeps(tmp):
    model, head = nn.LSTM(2, 4), nn.Linear(4, 1)
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
    data = [torch.randn(3, 1, 2) for _ in range(6)]
    job = gj.attach(model, head, opt, state={"losses": []})
    losses, hidden, running, step, window = job.state["losses"], None, 0.0, 0, []
    warmup = _Warmup(opt)
    for _ in job.epochs(2):
        best = None
        for x in job.data(data):
            out, hidden = model(x, hidden)
            hidden = tuple(h.detach() for h in hidden)
            loss = head(out).pow(2).mean()
            loss.backward()
            opt.step()
            warmup.step()
            opt.zero_grad()
            losses.append(loss.item())
            running += loss.item()
            step += 1
            window.append(loss.detach())
            scaled = [v * 2 for v in window]
            if step == 4:
                move = job.controller.send("checkpoint", path=f"{tmp}/a.ckpt")
        best = min(best or float("inf"), running / len(scaled))
    warning = job.controller.result(move, timeout=5)["warning"]
    assert warning.startswith("the script's loops carry `hidden` (test_loop_carried.py:"), warning
    assert all(f"`{n}`" in warning for n in ("warmup", "running", "step", "window")), warning
    # (state='s list, an attached optimizer, the loop's own target, what each step assigns before it reads, a
    # comprehension's variable, a value the epoch's top sets again)
    assert not any(f"`{n}`" in warning for n in ("losses", "opt", "x", "out", "loss", "scaled", "v", "best")), warning


def test_a_move_says_it_in_the_jobs_log_too(tmp, capfd):
    """gmuxd moves jobs of its own accord, and nobody reads those answers: the job's stderr has the warning."""
    from gmux.job.job import JobExit
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job, count = gj.attach(model, opt), 0
    with pytest.raises(JobExit):
        for x in job.data([torch.randn(4, 2) for _ in range(5)]):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            count += 1
            if count == 2:
                job.controller.send("migrate", path=f"{tmp}/a.ckpt")
    err = capfd.readouterr().err
    assert err.count("gmux: moved to a new process: the script's loops carry `count` (test_loop_carried.py:") == 1, err


def test_a_loop_that_keeps_its_state_in_the_job_moves_without_a_warning(tmp):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, opt, state={"step": 0})
    for x in job.data([torch.randn(4, 2) for _ in range(5)]):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        job.state["step"] += 1
        if job.state["step"] == 3:
            move = job.controller.send("checkpoint", path=f"{tmp}/a.ckpt")
    reply = job.controller.result(move, timeout=5)
    assert reply["ok"] and "warning" not in reply, reply


def test_a_loop_whose_source_cannot_be_read_moves_without_a_warning(tmp):
    """Code made by exec() has no file to read: nothing is named, and the checkpoint is taken."""
    scope = {"gj": gj, "torch": torch, "nn": nn, "tmp": tmp}
    exec(compile("model = nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                 "job = gj.attach(model, opt)\nn = 0\n"
                 "for x in job.data([torch.randn(4, 2) for _ in range(5)]):\n"
                 "    model(x).sum().backward(); opt.step(); opt.zero_grad(); n += 1\n"
                 "    if n == 2: move = job.controller.send('checkpoint', path=f'{tmp}/a.ckpt')\n",
                 "<generated>", "exec"), scope)
    reply = scope["job"].controller.result(scope["move"], timeout=5)
    assert reply["ok"] and "warning" not in reply, reply


def test_an_optional_scheduler_left_none_is_not_named(tmp):
    """`sched = None` (a flag turned it off) and `if sched is not None: sched.step()` in the loop: the move's
    answer and the job's stderr named `sched` as carried from one step to the next, on every move of such a
    script, though None carries nothing. A variable only changed in place is named when it holds an object."""
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, opt, state={"step": 0})
    sched, seen = None, []
    for x in job.data([torch.randn(4, 2) for _ in range(5)]):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        seen.append(x.sum().item())
        job.state["step"] += 1
        if job.state["step"] == 3:
            move = job.controller.send("checkpoint", path=f"{tmp}/a.ckpt")
    warning = job.controller.result(move, timeout=5)["warning"]
    assert "`seen`" in warning and "`sched`" not in warning, warning
