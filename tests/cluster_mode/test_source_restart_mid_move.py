"""The source machine's gmuxd restarted in the middle of a move (killed and started again under its name, sooner
than the scheduler counts the machine lost). The new gmuxd re-attaches the job's process, held suspended if the
move had suspended it, but knows nothing of the move its predecessor's link was carrying. Mid-send, the old
gmuxd left its stream's pipe behind, which kept the new one from starting at all (the machine was counted lost);
once it could start, the move waited for the send's outcome for good, the job "migrating", held at its source.
And the source's send when its target's gmuxd is restarted instead: given up at once, not once it has waited out
every silence of the target's dead endpoint."""
import json
import os
import signal
import time

from cluster_harness import Solo, paced, spawned, unpace, wait_for

PROMPT_S = 40       # far above a move's own seconds and the take-over's wait for the old gmuxd's silence
ABORT_S = 20        # a send given up, far below the 60 s of a sender's silences toward a dead endpoint
STEPS = 100


def _big(tmp_path) -> tuple:
    """A job whose checkpoint is ~110 MB, paced (0.3 s a step: ~3 steps a second, ~15 in the few seconds of a
    move's set-up, 30 s at least for all 100, where 400 unpaced steps had ~130) until the test has seen how its
    move ended, then the rest at full speed: each step costs ~50 ms of CPU, in the job and its reference. (At
    demo_train's learning rate it diverged by step 40, and every run hashed the same NaNs.)"""
    return (str(STEPS), "--hidden", "3000", "--depth", "1", "--batch", "8", "--lr", "0.0003", *paced(tmp_path, "0.3"))


def _restart(c, m: str) -> None:
    c.daemons[m].send_signal(signal.SIGKILL)
    c.daemons[m].wait()
    c.start_daemon(m)


def _reading(pid: int, inbox: str) -> bool:
    """Whether process `pid` has a file of `inbox` open (its checkpoint, arriving)."""
    try:
        fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:              # (an fd closed between listing and reading it)
        return False
    return any(f.startswith(inbox) for f in fds)


def _decided(c, kind: str, cjob: str) -> bool:
    return any(d["kind"] == kind and d["cjob"] == cjob for d in c.ps()["decisions"])


def _moving(c, tmp_path, args, past_step):
    """A job of `args` running past `past_step`, then asked to move: (its solo run, its output file, its cluster
    id, its record before the move, the move's target, the pid of its new process there)."""
    c.wait_machines(3)
    ref = Solo(tmp_path, "ref", *args)
    out = tmp_path / "moved.json"
    cjob = c.submit(str(out), *args)
    first = wait_for(lambda: (lambda j: j["state"] == "running" and j["step"] > past_step and j)(c.job(cjob)), 120,
                     "job running")
    dst = next(m for m in ("m1", "m2", "m3") if m != first["machine"])
    c.call("c_migrate", cjob=cjob, machine=dst, gpu=0)
    return ref, out, cjob, first, dst, spawned(tmp_path, dst, cjob)


def _sending(c, tmp_path, cjob: str, dst: str, pid: int) -> None:
    """The move's source sending, stuck: the target's new process is stopped (SIGSTOP) once it reads, so the
    send cannot end first."""
    wait_for(lambda: _reading(pid, str(tmp_path / f"rt-{dst}" / "cluster-in")), 60,
             "the target's process reading the checkpoint", every=0.001)
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: _decided(c, "migrate_out", cjob), 30, "the source sending", every=0.05)
    time.sleep(1.0)
    assert not _decided(c, "migrate_sent", cjob)


def _finished_where_it_was(c, tmp_path, out, ref, cjob) -> None:
    unpace(tmp_path)
    jobs = c.wait_done([cjob], 240)
    assert jobs[cjob]["migrations"] == 0 and jobs[cjob]["restarts"] == 0
    res = json.loads(out.read_text())
    assert res["sha256"] == ref["sha256"] and res["steps"] == STEPS and res["restored_at"] == 0
    assert c.ps()["internal_errors"] == 0


def test_restarted_while_its_target_warms_the_move_goes_on(cluster_factory, tmp_path):
    """Before the source was asked to send, nothing of the move lives at the source: the new gmuxd's link is
    asked to send once the target is ready, and the move completes."""
    c = cluster_factory(policy="gandiva")
    args = ("6000", "--batch", "36", *paced(tmp_path, "0.003"), "--frozen-mib", "0.25")
    ref, out, cjob, first, dst, pid = _moving(c, tmp_path, args, 200)
    src = first["machine"]
    os.kill(pid, signal.SIGSTOP)         # not ready before the source's gmuxd is back
    # (gmuxd writes that a job has started with its measurements, every 2 s: one restarted sooner takes it back as
    # not started yet, and refuses its checkpoint, so the move fails, the job running on at its source)
    time.sleep(3)
    _restart(c, src)
    wait_for(lambda: any(m["name"] == src and m["state"] == "up" for m in c.ps()["machines"])
             and "a new gmuxd speaks for it" in (tmp_path / "scheduler.log").read_text(), 30, "the new gmuxd heard")
    os.kill(pid, signal.SIGCONT)
    moved = wait_for(lambda: (lambda j: j["state"] == "running" and j["migrations"] == 1 and j)(c.job(cjob)),
                     PROMPT_S, lambda: f"the move completed: {c.job(cjob)}")
    assert moved["machine"] == dst, moved
    unpace(tmp_path)
    jobs = c.wait_done([cjob], 240)
    assert jobs[cjob]["migrations"] == 1 and jobs[cjob]["restarts"] == 0
    res = json.loads(out.read_text())
    assert res["sha256"] == ref["sha256"] and res["steps"] == 6000 and res["restored_at"] > 0
    assert c.ps()["internal_errors"] == 0


def test_restarted_while_it_sends_the_job_runs_on_where_it_was(cluster_factory, tmp_path):
    """Mid-send (a checkpoint of ~110 MB, whose reader on the target is stopped so that the send cannot end
    first), the send dies with the old gmuxd's link and its outcome never comes. The move is given up: the
    target's new process is stopped, and the job, held suspended at its source, runs on there."""
    c = cluster_factory(policy="gandiva")
    ref, out, cjob, first, dst, pid = _moving(c, tmp_path, _big(tmp_path), 3)
    src = first["machine"]
    _sending(c, tmp_path, cjob, dst, pid)
    _restart(c, src)
    os.kill(pid, signal.SIGCONT)
    back = wait_for(lambda: (lambda j: j["state"] == "running" and j)(c.job(cjob)), PROMPT_S,
                    lambda: f"the job running again: {c.job(cjob)}")
    assert back["machine"] == src and back["local"] == first["local"], back
    assert f"{src} restarted its gmuxd" in back["detail"], back
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", 30,
             "the target's new process stopped")
    _finished_where_it_was(c, tmp_path, out, ref, cjob)


def test_target_restarted_while_it_sends_the_send_is_given_up(cluster_factory, tmp_path):
    """The move is given up at the take-over of the target's name (test_target_restart_mid_move), but the job
    ran on only once the source's send failed, and its sender, silent toward the old endpoint, gave up after 6
    connections of 10 s (60.2 s, the job suspended at its source meanwhile): the source is told to give it up."""
    c = cluster_factory(policy="gandiva")
    ref, out, cjob, first, dst, pid = _moving(c, tmp_path, _big(tmp_path), 3)
    src = first["machine"]
    _sending(c, tmp_path, cjob, dst, pid)
    _restart(c, dst)
    os.kill(pid, signal.SIGCONT)
    back = wait_for(lambda: (lambda j: j["state"] == "running" and j)(c.job(cjob)), ABORT_S,
                    lambda: f"the job running again: {c.job(cjob)}")
    assert back["machine"] == src and back["local"] == first["local"], back
    assert f"migration target {dst} restarted its gmuxd" in back["detail"], back
    assert "was given up" in [d for d in c.ps()["decisions"] if d["kind"] == "migrate_failed"][-1]["text"]
    _finished_where_it_was(c, tmp_path, out, ref, cjob)
