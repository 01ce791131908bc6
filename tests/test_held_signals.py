"""A script's own signal handler (a SIGTERM or SIGUSR1 that saves a checkpoint) never runs while its job is held
with its state off the device: it runs once the state is back, and a job that leaves while held says it was not
run (gmux.job.held_signals)."""
import os
import signal
import threading
import time

import pytest
import torch
from torch import nn

import gmux.job as gj
from gmux.job.control import LocalController


def _held(sends_after_suspend):
    """A job suspended at its boundary; `sends_after_suspend(ctl)` runs in a thread once the state is off the
    device. Returns the job, its model and what the SIGUSR1 handler saw (weights' size, whether suspended)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    ctl = LocalController()
    job = gj.attach(model, controller=ctl, pool=gj.DevicePool(1 << 20))
    seen = []

    def theirs(signum, _frame):
        seen.append((signal.Signals(signum).name, model.weight.numel(), job.suspended))

    def drive():
        while not job.suspended:
            time.sleep(0.005)
        sends_after_suspend(ctl, seen)

    before = signal.signal(signal.SIGUSR1, theirs)
    try:
        ctl.send("suspend")
        driver = threading.Thread(target=drive)
        driver.start()
        try:
            job.boundary()
        finally:
            driver.join(30)
        assert signal.getsignal(signal.SIGUSR1) is theirs     # (given back as it was)
    finally:
        signal.signal(signal.SIGUSR1, before)
    return job, model, seen


def test_a_scripts_handler_waits_for_the_resume_and_sees_its_state():
    while_held = []

    def then(ctl, seen):
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)        # (twice while held: it runs once, as a pending signal does)
        time.sleep(0.3)                             # (the main thread waits for gmuxd's word meanwhile)
        while_held.append(list(seen))
        ctl.send("resume")

    job, model, seen = _held(then)
    assert while_held == [[]]
    assert seen == [("SIGUSR1", 16, False)]


def test_a_job_leaving_while_held_says_the_handler_was_not_run(capfd):
    def then(ctl, seen):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.3)
        ctl.send("exit")

    with pytest.raises(gj.JobExit):
        _held(then)
    err = capfd.readouterr().err
    assert "SIGUSR1 came while the job was held, and it leaves: its script's handler was not run" in err, err


def test_signals_without_a_python_handler_are_left_as_they_are():
    kept = {}

    def then(ctl, seen):
        kept.update(term=signal.getsignal(signal.SIGTERM), pipe=signal.getsignal(signal.SIGPIPE))
        ctl.send("resume")

    before = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        _held(then)
    finally:
        signal.signal(signal.SIGPIPE, before)
    assert kept == {"term": signal.SIG_DFL, "pipe": signal.SIG_IGN}
