"""End to end: `gmux migrate --new-process` moves a running job to another virtual GPU at a boundary, by the
path a move between real GPUs takes, bit-identically (without --new-process a move between virtual GPUs is
made in the job's own process: tests/node/test_move_in_process_e2e.py).

The job checkpoints at its next boundary and ends its run; its launcher re-executes itself (same pid, so the
shell that started it still waits), re-registers with the same id and token, and restores on the new GPU.
"""
import json
import os
import subprocess

from node_harness import PY, ROOT, TRAIN, env, paced, result, start_py, unpace

STEPS = "2000"
MID_RUN = 100     # a step the job is past when it is first moved (a checkpoint from scratch would restore at 0)


def test_migrate_between_gpus_is_bit_identical(node_factory, tmp_path):
    # (paced at 20 ms until its second move is asked: at 3 ms a loaded CI machine took longer than the 3,500 steps
    # left over the first move and the waits after it, and the job had ended; 2,000 steps at 20 ms leave it as
    # long as 4,000 at 10 ms did, for half the steps of CPU in the job and its reference)
    ref = start_py(TRAIN, str(tmp_path / "solo.json"), STEPS, *paced(tmp_path, "0.02"))
    node = node_factory("--virtual-gpus", "2x1GiB", "--quantum", "1")
    p = node.launch(f"{TRAIN}", str(tmp_path / "moved.json"), STEPS, *paced(tmp_path, "0.02"), "--attach",
                    opts=["--no-hook"])
    job = node.job_of(p.pid)
    node.wait_for(lambda: node.job(job)["step"] > MID_RUN, 60, "job training")
    assert node.job(job)["gpu"] == 0
    assert node.job(job)["hook"] is False          # (ps --json said true for every launched job)
    out = subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", node.rt, "--json", "migrate", job, "--gpu", "1",
                          "--new-process"],
                         env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kind"] == "migrate" and json.loads(out.stdout)["path"] == "new process"
    # Asked again as its new process starts (on its way) or once it has (already there): refused either way, and
    # gmuxd meets no internal error (checked as the node stops; tests/node/test_move_in_process.py has the race)
    import pytest
    from gmux.wire.daemon_client import GmuxError
    with pytest.raises(GmuxError, match=f"migrate: {job} is (on its way to GPU 1 in a new process|already on GPU 1)"):
        node.call("migrate", job=job, gpu=1, new_process=True)
    node.wait_for(lambda: node.job(job)["gpu"] == 1 and node.job(job)["state"] == "running", 60, "running on GPU 1")
    step_after = node.job(job)["step"]
    # restored: the new process has no more use for its checkpoint
    ckpts = lambda: [f for _, _, files in os.walk(os.path.join(node.rt, "checkpoints")) for f in files]
    node.wait_for(lambda: ckpts() == [], 20, "checkpoint deleted once restored")
    # And back again, to show the checkpoint of a restored job restores too.
    node.call("migrate", job=job, gpu=0, new_process=True)      # (answered once its checkpoint is written)
    unpace(tmp_path)
    assert p.wait(120) == 0
    info = node.job(job)
    assert info["state"] == "exited" and info["gpu"] == 0 and info["migrations"] == 2, info
    assert info["pid"] == p.pid
    assert ref.wait(120) == 0
    moved, solo = result(tmp_path / "moved.json"), result(tmp_path / "solo.json")
    assert moved["pid"] == p.pid and moved["steps"] == solo["steps"]
    assert moved["restored_at"] >= step_after > MID_RUN     # continued from the checkpoint, not from scratch
    assert moved["sha256"] == solo["sha256"], (moved, solo, step_after)
    kinds = [d["kind"] for d in node.call("decisions")["decisions"]]
    assert kinds.count("migrate") == 2 and kinds.count("arrived") == 2
    assert ckpts() == []
    assert (tmp_path / "launch0.log").read_text().count(f"job {job} continues in a new process") == 2


def test_migrate_refusals(node_factory, tmp_path):
    node = node_factory("--virtual-gpus", "1x1GiB,1x256MiB")
    p = node.launch(f"{TRAIN}", str(tmp_path / "o.json"), "100000", "--attach",
                    opts=["--no-hook", "--mem", "512MiB"])
    job = node.job_of(p.pid)
    for gpu, needle in ((0, "already on GPU 0"), (1, "needs 512.0MiB"), (5, "no GPU 5")):
        out = subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", node.rt, "migrate", job, "--gpu", str(gpu)],
                             env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and needle in out.stderr, out.stderr


def _stuck_after_move(node, tmp_path):
    """A job moved by a new process that never gets as far as restoring (it hangs first): its checkpoint is
    the only copy of its work."""
    script = tmp_path / "hangs_on_restore.py"
    script.write_text("import os, runpy, sys, time\n"
                      "if os.environ.get('GMUX_RESTORE'):\n    time.sleep(600)\n"
                      f"sys.argv = [{str(TRAIN)!r}, {str(tmp_path / 'o.json')!r}, '100000', '--attach', "
                      "'--sleep', '0.003']\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    p = node.launch(str(script), opts=["--no-hook"])
    job = node.job_of(p.pid)
    node.wait_for(lambda: node.job(job)["step"] > 50, 60, "job training")
    node.call("migrate", job=job, gpu=1, new_process=True)
    node.wait_for(lambda: any(d["kind"] == "arrived" for d in node.call("decisions")["decisions"]), 60,
                  "the new process registered")
    ckpt = [os.path.join(d, f) for d, _, files in os.walk(os.path.join(node.rt, "checkpoints")) for f in files]
    assert len(ckpt) == 1 and ckpt[0].endswith(f"{job}.ckpt"), ckpt
    return p, job, ckpt[0]


def test_a_move_that_never_restores_keeps_its_checkpoint_and_says_where(node_factory, tmp_path):
    node = node_factory("--virtual-gpus", "2x1GiB")
    p, job, ckpt = _stuck_after_move(node, tmp_path)
    os.kill(p.pid, 9)
    node.wait_for(lambda: node.job(job)["state"] == "lost", 30, "job lost")
    assert os.path.exists(ckpt) and ckpt in node.job(job)["detail"], node.job(job)["detail"]


def test_a_killed_job_leaves_no_checkpoint(node_factory, tmp_path):
    node = node_factory("--virtual-gpus", "2x1GiB")
    p, job, ckpt = _stuck_after_move(node, tmp_path)
    node.call("kill", job=job)
    node.wait_for(lambda: node.job(job)["state"] == "killed", 30, "job killed")
    assert not os.path.exists(ckpt)


def test_a_move_of_a_job_still_starting_says_so(node_factory, tmp_path):
    """A --no-hook script that has not attached has no boundary yet: the refusal says that, not only 'busy'."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    script = tmp_path / "never_attaches.py"
    script.write_text("import time\ntime.sleep(120)\n")
    job = node.job_of(node.launch(str(script), opts=["--no-hook"]).pid)
    node.wait_for(lambda: node.job(job)["gpu"] == 0, 30, "job placed")
    out = subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", node.rt, "migrate", job, "--gpu", "1",
                          "--new-process"], env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "has not reached its first boundary" in out.stderr, out.stderr


METRICS = """import os, sys, time, torch, gmux.job
metrics = open(sys.argv[1], "a")          # buffered: 8 KiB gather before anything reaches the file
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
progress = {"step": 0}
job = gmux.job.attach(model, opt, state=progress)
while progress["step"] < int(sys.argv[2]):
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(progress["step"]))
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    progress["step"] += 1
    metrics.write(f"{progress['step']}\\n")
    if not os.path.exists(sys.argv[3]):
        time.sleep(0.003)
    job.boundary()
"""


def test_what_a_moved_job_wrote_to_its_files_is_all_there(node_factory, tmp_path):
    """A move re-executes the job's process, which drops every buffer: the lines a script had written to a file
    it appends to each step, not yet flushed, were lost at each move (python flushes them only as it exits)."""
    node = node_factory("--virtual-gpus", "2x1GiB", "--quantum", "1")
    (tmp_path / "metrics_train.py").write_text(METRICS)
    steps = 1500
    p = node.launch(str(tmp_path / "metrics_train.py"), str(tmp_path / "metrics.txt"), str(steps),
                    str(tmp_path / "unpaced"), opts=["--no-hook"])
    job = node.job_of(p.pid)
    node.wait_for(lambda: node.job(job)["step"] > 100, 60, "job training")
    node.call("migrate", job=job, gpu=1, new_process=True)
    node.wait_for(lambda: node.job(job)["gpu"] == 1 and node.job(job)["state"] == "running", 60, "running on GPU 1")
    unpace(tmp_path)
    assert p.wait(120) == 0
    assert node.job(job)["migrations"] == 1
    assert (tmp_path / "metrics.txt").read_text().split() == [str(i) for i in range(1, steps + 1)]


STAGES = """import sys, time, torch, gmux.job
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
sgd = torch.optim.SGD(model.parameters(), lr=0.1)
job = gmux.job.attach(model, sgd)
opt = sgd
for i in range(int(sys.argv[1])):
    time.sleep(0.01)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    if i == 20:
        opt = torch.optim.Adam(model.parameters())      # stage 2, never given to attach()
    job.boundary()
"""


def test_a_job_whose_later_stage_optimizer_a_new_process_would_not_build_is_refused_up_front(node_factory,
                                                                                          tmp_path):
    """gmuxd learns it from the job's reports (gmux.job.strays): `gmux migrate --new-process` is refused at once,
    naming why, gmux ps no longer offers the move, and a move in the job's own process still goes."""
    import pytest

    from gmux.wire.daemon_client import GmuxError
    (tmp_path / "stages.py").write_text(STAGES)
    node = node_factory("--virtual-gpus", "2x1GiB", "--quantum", "1")
    p = node.launch(str(tmp_path / "stages.py"), "100000", opts=["--no-hook"])
    job = node.job_of(p.pid)
    node.wait_for(lambda: (node.job(job).get("report") or {}).get("movable") is False, 60, "stage 2 reported")

    def migrate(*extra):
        return subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", node.rt, "migrate", job, "--gpu", "1",
                               *extra], env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    out = migrate("--new-process")
    assert out.returncode == 1 and f"migrate: {job} would not continue exactly in a new process: an optimizer " \
                                   f"attach() was not given (Adam) steps the job's parameters" in out.stderr, out
    assert node.job(job)["migratable"] is False and node.job(job)["gpu"] == 0
    with pytest.raises(GmuxError) as refused:      # (the scheduler's periodic checkpoint: "transparent mode", it said)
        node.call("checkpoint", job=job)
    assert f"checkpoint: {job} would not be restored exactly from one now: an optimizer attach() was not given" \
        in str(refused.value), refused.value
    ps = subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", node.rt, "ps"], env=env(), cwd=ROOT,
                        capture_output=True, text=True, timeout=60).stdout
    assert "explicit: suspend, free mem, move GPU" in ps, ps
    out = migrate()
    assert out.returncode == 0, out
    node.wait_for(lambda: node.job(job)["gpu"] == 1 and node.job(job)["state"] == "running", 60, "moved in process")
