"""End to end faults: a job SIGKILLed while running, mid-suspend or suspended frees its share and touches no
other job; gmuxd SIGKILLed and restarted re-attaches to its jobs, which finish bit-identical."""
import os
import signal
import subprocess
import time

from gmux.rundir import RuntimeDir
from node_harness import PY, ROOT, TRAIN, env, paced, result, start_py, unpace

FINAL = ("exited", "failed", "killed", "lost")


def test_sigkill_of_jobs_at_any_moment(node_factory, tmp_path):
    ref = start_py(TRAIN, str(tmp_path / "solo.json"), "8000")
    node = node_factory("--virtual-gpus", "1x1GiB", "--quantum", "0.5", "--no-pack")
    mem = ["--no-hook", "--mem", "600MiB"]
    survivor = node.launch(f"{TRAIN}", str(tmp_path / "survivor.json"), "8000", "--attach", opts=mem)
    # Slow mini-batches (0.4 s) leave a wide window between "suspend sent" and "suspended".
    slow = node.launch(f"{TRAIN}", str(tmp_path / "slow.json"), "100000", "--sleep", "0.4", "--attach",
                       opts=mem)
    idle = node.launch(f"{TRAIN}", str(tmp_path / "idle.json"), "100000", "--attach", opts=mem)
    ids = {name: node.job_of(p.pid) for name, p in (("survivor", survivor), ("slow", slow), ("idle", idle))}
    # A submitted job is gmuxd's child: its end is known exactly (signal number).
    sub = node.call("submit", argv=[PY, f"{TRAIN}", str(tmp_path / "sub.json"), "100000", "--attach"],
                    cwd=ROOT, env={"PYTHONPATH": ROOT}, mem=600 << 20)
    ids["submitted"] = sub["job"]

    def state(name):
        return node.job(ids[name])["state"]
    node.wait_for(lambda: state("slow") == "suspending", 60, "slow job mid-suspend", every=0.02)
    os.kill(slow.pid, signal.SIGKILL)
    node.wait_for(lambda: state("idle") == "suspended", 60, "idle job suspended", every=0.05)
    os.kill(idle.pid, signal.SIGKILL)
    node.wait_for(lambda: state("submitted") == "running", 60, "submitted job running", every=0.05)
    os.kill(sub["pid"], signal.SIGKILL)
    assert survivor.wait(120) == 0
    # (the survivor may have ended already: gmuxd reaps its child at its next look, not at once)
    node.wait_for(lambda: state("submitted") in FINAL, 30, "the submitted job reaped")
    ps = {j["id"]: j for j in node.ps()["jobs"]}
    for name in ("slow", "idle"):
        j = ps[ids[name]]
        assert j["state"] == "lost" and "without an exit record" in j["detail"], j
    assert ps[ids["submitted"]]["state"] == "killed" and "signal 9 (SIGKILL)" in ps[ids["submitted"]]["detail"]
    assert ps[ids["survivor"]]["state"] == "exited"
    assert ref.wait(120) == 0
    assert result(tmp_path / "survivor.json")["sha256"] == result(tmp_path / "solo.json")["sha256"]
    gpu = node.ps()["gpus"][0]
    assert gpu["jobs"] == [] and gpu["resident"] == []        # every share freed
    out = subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", node.rt, "ps"], env=env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert "lost" in out.stdout and "SIGKILL" in out.stdout


BATCHES = ("32", "33")


def _two_sliced_jobs(node_factory, tmp_path):
    """Two jobs time-sliced on one GPU, their references started beside them. Paced (3 ms of "input" per step,
    no effect on the numbers) so that the jobs are still there to be sliced after a restart however fast this
    machine is; the pacing stops once the test has seen what it tests."""
    pace = paced(tmp_path, "0.003")
    refs = [start_py(TRAIN, str(tmp_path / f"solo{b}.json"), "4000", "--batch", b, *pace) for b in BATCHES]
    node = node_factory("--virtual-gpus", "1x1GiB", "--quantum", "1", "--no-pack")
    procs = [node.launch(f"{TRAIN}", str(tmp_path / f"job{b}.json"), "4000", "--batch", b, *pace, "--attach",
                         opts=["--no-hook", "--mem", "600MiB"]) for b in BATCHES]
    ids = [node.job_of(p.pid) for p in procs]
    node.wait_for(lambda: all(node.job(j)["suspends"] >= 1 for j in ids), 60, "both jobs sliced at least once")
    return node, refs, procs, ids


def _end_bit_identical(node, refs, procs, ids, tmp_path):
    unpace(tmp_path)
    for p in procs:                    # two sliced jobs and their two references share this busy machine
        assert p.wait(400) == 0
    for r in refs:
        assert r.wait(120) == 0
    for j, b in zip(ids, BATCHES):
        assert node.job(j)["state"] == "exited"
        assert result(tmp_path / f"job{b}.json")["sha256"] == result(tmp_path / f"solo{b}.json")["sha256"]


def test_gmuxd_killed_and_restarted_reattaches(node_factory, tmp_path):
    node, refs, procs, ids = _two_sliced_jobs(node_factory, tmp_path)
    node.kill_daemon(signal.SIGKILL)
    time.sleep(1.5)                    # the running job keeps training; the suspended one waits
    assert all(p.poll() is None for p in procs)
    node.start()
    ps = {j["id"]: j for j in node.ps()["jobs"]}
    assert all(ps[j]["state"] not in FINAL for j in ids), ps
    assert "re-attached" in node.log()
    before = {j: node.job(j)["suspends"] for j in ids}
    node.wait_for(lambda: all(node.job(j)["suspends"] > before[j] for j in ids), 60,
                  "slicing goes on after the restart")
    _end_bit_identical(node, refs, procs, ids, tmp_path)


def test_a_job_submitted_as_gmuxd_dies_runs_once_gmuxd_is_back(node_factory, tmp_path):
    """A job submitted just before gmuxd was killed was said to be "lost ... SIGKILL" by the restarted gmuxd, its
    script never run: its process, finding no gmuxd to register with, had given up."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    script, ran = tmp_path / "once.py", tmp_path / "ran"
    script.write_text("import sys\nwith open(sys.argv[1], 'a') as f:\n    f.write('ran\\n')\n")
    job = node.call("submit", argv=["python", str(script), str(ran)], cwd=str(tmp_path), env={})["job"]
    node.kill_daemon(signal.SIGKILL)
    log = RuntimeDir(node.rt).log_file(job)
    node.wait_for(lambda: "gmux-launch: gmuxd" in open(log).read(), 120, "the job's process finds no gmuxd")
    node.start()
    node.wait_for(lambda: node.job(job)["state"] in FINAL, 120, "the job ends after the restart")
    assert node.job(job)["state"] == "exited", node.job(job)
    assert ran.read_text() == "ran\n"
    # (its first registration, after the restart, is no new process back from a move)
    assert not [d for d in node.call("decisions")["decisions"] if d["kind"] == "arrived"]


def test_a_job_that_ends_while_gmuxd_is_away_shows_its_last_step(node_factory, tmp_path):
    """A job that finished while gmuxd was down (restarting) kept, once gmuxd was back, the STEP of the last
    report gmuxd had heard: its exit record now carries its last step."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    script, go = tmp_path / "steps.py", tmp_path / "go"
    script.write_text("import os, sys, time, torch\n"
                      "m = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
                      "for i in range(400):\n"
                      "    time.sleep(0.01)\n"
                      "    while i == 200 and not os.path.exists(sys.argv[1]):\n"
                      "        time.sleep(0.05)\n"
                      "    m(torch.randn(8, 4)).sum().backward()\n    opt.step()\n    opt.zero_grad()\n")
    job = node.call("submit", argv=["python", str(script), str(go)], cwd=str(tmp_path), env={})["job"]
    node.wait_for(lambda: node.job(job)["step"] > 0, 120, "the job training")
    pid = node.job(job)["pid"]
    node.kill_daemon(signal.SIGKILL)
    go.touch()
    node.wait_for(lambda: os.path.exists(RuntimeDir(node.rt).exit_file(job)), 120, "the job ending while gmuxd is away")
    node.wait_for(lambda: _gone(pid), 60, "the job's process gone (its last messages with it)")
    node.start()
    node.wait_for(lambda: node.job(job)["state"] in FINAL, 60, "the job's end seen by the new gmuxd")
    assert node.job(job)["state"] == "exited" and node.job(job)["step"] == 400, node.job(job)


def test_a_job_started_just_before_gmuxd_dies_is_known_started_by_the_next(node_factory, tmp_path):
    """That a job had started was written only with the next measurement flush (every 2 s): a gmuxd killed sooner
    left the next one thinking the job had never run, and `gmux migrate` then moved it as bookkeeping ("before
    starting") while its process trained on where it was."""
    ref = start_py(TRAIN, str(tmp_path / "solo.json"), "1500", *paced(tmp_path, "0.003"))
    node = node_factory("--virtual-gpus", "2x1GiB")
    sub = node.call("submit", argv=[PY, f"{TRAIN}", str(tmp_path / "sub.json"), "1500", *paced(tmp_path, "0.003"),
                                    "--attach"], cwd=ROOT, env={"PYTHONPATH": ROOT}, mem=300 << 20, hook=False)
    node.wait_for(lambda: node.job(sub["job"])["state"] == "running", 60, "the job started", every=0.01)
    node.kill_daemon(signal.SIGKILL)
    node.start()
    node.wait_for(lambda: node.job(sub["job"])["step"] > 5, 60, "the job back and training")
    moved = node.call("migrate", job=sub["job"], gpu=1, new_process=True)
    assert moved["path"] != "before starting", moved
    info = node.job(sub["job"])     # (until its new process registers, gmux ps says where it is going)
    assert info["state"] != "migrating" or \
        info["detail"] == "moving to GPU 1 in a new process: checkpointed, being restored", info
    unpace(tmp_path)
    node.wait_for(lambda: node.job(sub["job"])["state"] in FINAL, 300, "the job ends")
    assert node.job(sub["job"])["state"] == "exited" and ref.wait(120) == 0
    assert result(tmp_path / "sub.json")["sha256"] == result(tmp_path / "solo.json")["sha256"]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_job_no_gmuxd_takes_up_gives_up_with_its_reason(tmp_path, monkeypatch):
    """A job gmuxd accepted waits for a gmuxd to take it up (a restarted one), but not for ever: past the wait its
    process ends, and its exit record says why, so that a gmuxd started later reports it failed, not lost."""
    import pytest

    from gmux.job import launch
    from gmux.job.agent import DaemonUnavailable
    from gmux.rundir import read_exit
    monkeypatch.setattr(launch, "REGISTER_WAIT_S", 2.0)
    rundir = RuntimeDir(str(tmp_path / "rt"))
    rundir.create()
    opt = launch.LaunchOptions(argv=["train.py"], runtime_dir=rundir.root, job="j7", token="t")
    with pytest.raises(DaemonUnavailable, match="no gmuxd took it up in 2 s"):
        launch._register(rundir, opt, pid=os.getpid(), argv=["train.py"], cwd=str(tmp_path))
    record = read_exit(rundir, "j7")
    assert record["status"] == 2 and "its script never ran" in record["reason"], record


def _restart_over_a_lost_table(node) -> None:
    """gmuxd killed, its job table deleted, and started again."""
    node.kill_daemon(signal.SIGKILL)
    db = RuntimeDir(node.rt).db
    for path in (db, db + "-wal", db + "-shm"):
        if os.path.exists(path):
            os.unlink(path)
    node.start()


def test_jobs_whose_table_was_lost_are_adopted_by_the_next_gmuxd(node_factory, tmp_path):
    """gmuxd killed and its table lost (the database deleted): its jobs ran on unsupervised, their share of the
    GPU no longer counted and no command reaching them. Each is now told gmuxd does not know it, registers again
    and is taken back where it runs: sliced again, and ending bit-identical."""
    node, refs, procs, ids = _two_sliced_jobs(node_factory, tmp_path)
    _restart_over_a_lost_table(node)
    node.wait_for(lambda: {j["id"] for j in node.ps()["jobs"]} == set(ids), 30, "both jobs adopted")
    adopted = [d for d in node.call("decisions")["decisions"] if d["kind"] == "adopted"]
    assert sorted(d["jobs"][0] for d in adopted) == sorted(ids), adopted
    assert all(node.job(j)["state"] not in FINAL for j in ids)
    node.wait_for(lambda: all(node.job(j)["suspends"] >= 2 for j in ids), 60, "slicing goes on after the adoption")
    _end_bit_identical(node, refs, procs, ids, tmp_path)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        new = node.call("register", pid=sleeper.pid, argv=["sleep", "60"])["job"]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert int(new[1:]) > max(int(j[1:]) for j in ids)          # a new job never takes an adopted one's id


def test_a_submitted_job_whose_table_was_lost_is_adopted_with_its_log(node_factory, tmp_path):
    """A submitted job's output goes to gmuxd's log of it: taken back, it is again one gmux logs shows, and its end
    is seen."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    sub = node.call("submit", argv=[PY, f"{TRAIN}", str(tmp_path / "sub.json"), "3000", *paced(tmp_path, "0.003"),
                                    "--attach"], cwd=ROOT, env={"PYTHONPATH": ROOT}, mem=300 << 20)
    node.wait_for(lambda: node.job(sub["job"])["step"] > 10, 60, "the submitted job trains")
    _restart_over_a_lost_table(node)
    node.wait_for(lambda: [j for j in node.ps()["jobs"] if j["id"] == sub["job"]], 30, "the job adopted")
    node.call("logs", job=sub["job"])        # (refused for a job gmux-launch started: it has no log here)
    unpace(tmp_path)
    node.wait_for(lambda: node.job(sub["job"])["state"] in FINAL, 300, "the job ends")
    assert node.job(sub["job"])["state"] == "exited", node.job(sub["job"])


def test_a_job_moving_to_a_new_process_as_the_table_is_lost_is_taken_back_and_restores(node_factory, tmp_path):
    """A moved job's new process registered by its id alone and was refused by a gmuxd that had lost its table:
    it ended with its work in a checkpoint nobody would read. Now it is taken back, to start, and restores."""
    ref = start_py(TRAIN, str(tmp_path / "solo.json"), "3000", *paced(tmp_path, "0.003"))
    node = node_factory("--virtual-gpus", "2x1GiB")
    p = node.launch(f"{TRAIN}", str(tmp_path / "moved.json"), "3000", *paced(tmp_path, "0.003"), "--attach",
                    opts=["--no-hook"])
    job = node.job_of(p.pid)
    node.wait_for(lambda: node.job(job)["step"] > 50, 60, "job training")
    node.call("migrate", job=job, gpu=1, new_process=True)      # answered once its checkpoint is written
    _restart_over_a_lost_table(node)
    node.wait_for(lambda: [j for j in node.ps()["jobs"] if j["id"] == job], 60, "the job taken back")
    unpace(tmp_path)
    assert p.wait(300) == 0 and ref.wait(120) == 0
    assert node.job(job)["state"] == "exited"
    moved, solo = result(tmp_path / "moved.json"), result(tmp_path / "solo.json")
    assert moved["sha256"] == solo["sha256"] and moved["restored_at"] > 0, (moved, solo)   # (from the checkpoint)


def test_a_gmuxd_whose_directory_was_removed_leaves_the_next_ones_files_and_its_jobs_are_adopted(node_factory,
                                                                                                 tmp_path):
    """An outside operator removed a running gmuxd's runtime dir: gmux said no gmuxd ran, and, as advised, a second
    was started there. Stopping the first then removed the second's socket and pid file (the second ran on,
    unreachable, and gmux again invited a third onto the same table). The first now says its socket is gone,
    ends without touching the second's files, and its job is adopted by the second."""
    import shutil
    node = node_factory("--virtual-gpus", "1x1GiB")
    proc = node.launch(TRAIN, str(tmp_path / "a.json"), "100000", "--sleep", "0.01", "--attach")
    job = node.job_of(proc.pid)
    node.wait_for(lambda: node.job(job)["step"] > 5, 60, "the job trains")
    first = node.daemon
    shutil.rmtree(node.rt)
    node.start()                                      # the second gmuxd, on the directory made again
    second = RuntimeDir(node.rt).daemon_process()
    node.wait_for(lambda: "is no longer this gmuxd's socket" in node.log(), 30, "the first says its socket is gone")
    first.send_signal(signal.SIGTERM)
    first.wait(30)
    assert RuntimeDir(node.rt).daemon_process() == second and os.path.exists(RuntimeDir(node.rt).socket)
    assert node._ping()
    node.wait_for(lambda: [j for j in node.ps()["jobs"] if j["id"] == job and j["state"] not in FINAL], 60,
                  "the first one's job adopted by the second")
