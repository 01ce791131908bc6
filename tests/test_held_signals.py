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
from gmux.job import held_signals
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


def test_a_signal_noted_while_held_says_so_and_one_the_job_leaves_with_is_kept_for_its_launcher(capfd):
    def then(ctl, seen):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.3)
        ctl.send("exit")

    held_signals.unrun.clear()
    try:
        with pytest.raises(gj.JobExit):
            _held(then)
        assert held_signals.unrun == [signal.SIGUSR1]
    finally:
        held_signals.unrun.clear()
    err = capfd.readouterr().err
    assert "gmux: SIGUSR1 came while gmuxd holds the job: its script's handler runs once its state is back" in err


def test_signals_carried_into_a_new_process_are_named_and_checked():
    assert held_signals.carried(held_signals.names([signal.SIGTERM, signal.SIGUSR1])) == \
        [signal.SIGTERM, signal.SIGUSR1]
    assert held_signals.carried("SIGKILL,SIGBOGUS,sigterm,__class__,,SIGTERM,SIGTERM") == [signal.SIGTERM]
    assert held_signals.carried(None) == []


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
