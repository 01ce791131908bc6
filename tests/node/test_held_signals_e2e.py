"""Signals a job's script handles itself, landing while gmuxd holds it or moves it to a new process: the script's
handler runs once its state is back (in the new process, after the restore), an ignored Ctrl-C stays ignored, and
a Ctrl-C as the job moves ends it in one line with a record that says where its state is."""
import os
import signal
import time

import pytest
import torch

# An attached (movable) job: step k's batch is drawn from seed k, so any step's weights can be rebuilt here.
SCRIPT = """import signal, sys, time, torch
import gmux.job
mode, saved, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def save():
    torch.save({"step": progress["step"], "model": model.state_dict()}, saved)
def save_and_leave(signum, frame):
    save()
    print("saved on", signal.Signals(signum).name, "at step", progress["step"], flush=True)
    sys.exit(143)
if mode.startswith("term"):         # (at the top, as preemption-aware scripts do)
    signal.signal(signal.SIGTERM, save_and_leave)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
progress = {"step": 0}
if mode.endswith("before-its-restore") and "GMUX_RESTORE" in __import__("os").environ:
    # (in a move's new process, its state not restored yet)
    signal.raise_signal(signal.SIGTERM if mode.startswith("term") else signal.SIGINT)
job = gmux.job.attach(model, opt, state=progress)
stop = []
if mode == "ignore":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
elif mode == "flag":
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
elif mode == "ctrl-c-as-it-moves":
    import gmux.job.launch as launch
    real = launch._exec_as_next
    def interrupted(*args):
        signal.raise_signal(signal.SIGINT)
        real(*args)
    launch._exec_as_next = interrupted
while progress["step"] < steps and not stop:
    time.sleep(0.02)
    g = torch.Generator().manual_seed(progress["step"])
    x = torch.randn(8, 4, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad(); loss.backward(); opt.step()
    progress["step"] += 1
    job.boundary()
save()
print("ended at step", progress["step"], flush=True)
"""


def _reference(steps: int) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(steps):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.state_dict()


def _held_job(node_factory, tmp_path, mode, steps=100000):
    node = node_factory("--virtual-gpus", "2x1GiB", "--deadline-floor", "20")
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    saved = tmp_path / "saved.pt"
    proc = node.launch(str(script), mode, str(saved), str(steps), opts=["--no-hook"], log_name="job.log")
    job = node.job_of(proc.pid)
    node.wait_for(lambda: node.job(job)["step"] > 3, 60, "training")
    node.call("suspend", job=job)
    node.wait_for(lambda: node.job(job)["state"] == "held", 30, "held")
    return node, proc, job, saved


def _exactly_trained(saved):
    mine = torch.load(saved)
    ref = _reference(mine["step"])
    assert mine["step"] > 3 and all(torch.equal(mine["model"][k], ref[k]) for k in ref), mine
    return mine["step"]


@pytest.mark.parametrize("moved", [False, True])
def test_a_sigterm_to_a_held_job_runs_its_handler_once_its_state_is_back(node_factory, tmp_path, moved):
    """Moved to a new process while the SIGTERM waited, the job trained to its end: the signal was dropped."""
    node, proc, job, saved = _held_job(node_factory, tmp_path, "term")
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None and not saved.exists()
    if moved:
        node.call("migrate", job=job, gpu=1, new_process=True)
    node.call("resume", job=job)
    assert proc.wait(60) == 143
    log = (tmp_path / "job.log").read_text()
    assert "gmux: SIGTERM came while gmuxd holds the job: its script's handler runs once its state is back" in log
    assert "saved on SIGTERM" in log and ("continues in a new process" in log) == moved, log
    _exactly_trained(saved)


@pytest.mark.parametrize("mode", ["ignore", "flag"])
def test_a_ctrl_c_the_script_ignores_or_handles_is_not_the_launchers_while_held(node_factory, tmp_path, mode):
    """Held, a Ctrl-C ended the job although its script ignored SIGINT, or stops on it gracefully."""
    node, proc, job, saved = _held_job(node_factory, tmp_path, mode, steps=120 if mode == "ignore" else 100000)
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    assert proc.poll() is None and node.job(job)["state"] == "held"
    node.call("resume", job=job)
    assert proc.wait(60) == 0
    assert "interrupted" not in (tmp_path / "job.log").read_text()
    step = _exactly_trained(saved)
    assert step == 120 if mode == "ignore" else step < 120


@pytest.mark.parametrize("mode", ["term", "term-before-its-restore"])
def test_a_sigterm_in_a_moved_jobs_new_process_waits_for_its_restore(node_factory, tmp_path, mode):
    """Moved while held, the job's new process waits for its turn: a SIGTERM there killed it (lost), and one that
    came as its script ran from the top, before attach() restored it, saved the untrained model."""
    node, proc, job, saved = _held_job(node_factory, tmp_path, mode)
    node.call("migrate", job=job, gpu=1, new_process=True)
    log = tmp_path / "job.log"
    node.wait_for(lambda: "continues in a new process" in log.read_text() and node.job(job)["state"] == "held", 30,
                  "the new process waiting")
    if mode == "term":
        time.sleep(0.5)         # (registered again)
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None and not saved.exists()
    node.call("resume", job=job)
    assert proc.wait(60) == 143
    assert "saved on SIGTERM" in log.read_text()
    _exactly_trained(saved)


@pytest.mark.parametrize("mode, when", [("ctrl-c-as-it-moves", "during its move to a new process"),
                                        ("ctrl-c-before-its-restore", "before its state was restored")])
def test_a_ctrl_c_as_the_job_moves_ends_it_saying_where_its_state_is(node_factory, tmp_path, mode, when):
    """Between the move's checkpoint and its exec it printed a traceback, wrote no exit record, and gmuxd called
    the job lost; in the new process, before its state was restored, it was the script's KeyboardInterrupt (a
    save there writes the untrained model)."""
    node, proc, job, saved = _held_job(node_factory, tmp_path, mode)
    node.call("migrate", job=job, gpu=1, new_process=True)
    if mode.endswith("restore"):
        node.call("resume", job=job)
    assert proc.wait(60) == 130
    log = (tmp_path / "job.log").read_text()
    assert "Traceback" not in log and f"gmux-launch: job {job} interrupted {when}: it ends (its state is kept " \
        f"in " in log, log
    node.wait_for(lambda: node.job(job)["state"] == "failed", 20, "ended")
    assert node.job(job)["detail"].startswith(f"interrupted (SIGINT) {when}; its state is kept in "), node.job(job)
