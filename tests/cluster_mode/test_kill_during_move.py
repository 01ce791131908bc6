"""A kill that arrives while the job moves between machines ends it: sent only to the move's target, it
cancelled the target's start while the source trained on, and the job stayed 'migrating' for good."""
import glob

from cluster_harness import PY, ROOT, TRAIN, paced, unpace, wait_for


def _running(marker: str) -> list:
    found = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                if marker.encode() in f.read():
                    found.append(path.split("/")[2])
        except OSError:
            pass
    return found


def test_a_kill_during_a_move_ends_the_job_on_both_machines(cluster_factory, tmp_path):
    c = cluster_factory(policy="gandiva", machines=("m1", "m2"))
    c.wait_machines(2)
    out = str(tmp_path / "long.json")
    cjob = c.call("c_submit", argv=[PY, TRAIN, out, "1000000", "--attach", "--sleep", "0.01"], cwd=ROOT,
                  env={"OMP_NUM_THREADS": "1"})["cjob"]
    job = wait_for(lambda: (lambda j: j["state"] == "running" and j["step"] > 20 and j)(c.job(cjob)), 60,
                   "job running")
    dst = next(m for m in ("m1", "m2") if m != job["machine"])
    c.call("c_migrate", cjob=cjob, machine=dst, gpu=1)
    c.call("c_kill", cjob=cjob)
    wait_for(lambda: c.job(cjob)["state"] == "killed", 60, lambda: f"killed: {c.job(cjob)}")
    wait_for(lambda: not _running(out), 30, lambda: f"its processes gone: {_running(out)}")


def test_a_kill_while_the_job_starts_is_not_undone_by_a_retried_start(cluster_factory, tmp_path):
    """Killed before its machine reported it, a job stayed 'starting', and its start was sent again 30 s later."""
    c = cluster_factory(policy="gandiva", machines=("m1",))
    c.wait_machines(1)
    out = str(tmp_path / "long.json")
    cjob = c.call("c_submit", argv=[PY, TRAIN, out, "1000000", "--attach", "--sleep", "0.01"], cwd=ROOT,
                  env={"OMP_NUM_THREADS": "1"})["cjob"]
    wait_for(lambda: c.job(cjob)["state"] == "starting", 30, "job starting")
    c.call("c_kill", cjob=cjob)
    wait_for(lambda: c.job(cjob)["state"] == "killed", 20, lambda: f"killed: {c.job(cjob)}")
    wait_for(lambda: not _running(out), 30, lambda: f"its processes gone: {_running(out)}")


def test_a_job_whose_source_is_lost_during_a_move_restarts_on_the_move_target(cluster_factory, tmp_path):
    """Its source lost mid-move, the job was placed again on the move's target, whose abandoned copy the scheduler
    killed at the same moment: that copy's end was taken for the job's, and the job ended 'failed', its work in
    an unused checkpoint (an outside operator's, 2 of 2)."""
    import json
    import signal
    c = cluster_factory(policy="gandiva", machines=("m1", "m2"), sched_args=("--lost-after", "3"))
    c.wait_machines(2)
    out = str(tmp_path / "moved.json")
    cjob = c.call("c_submit", argv=[PY, TRAIN, out, "600", "--attach", *paced(tmp_path, "0.02")], cwd=ROOT,
                  env={"OMP_NUM_THREADS": "1"}, ckpt_every=1.0)["cjob"]
    job = wait_for(lambda: (lambda j: j["state"] == "running" and j["step"] > 30 and j)(c.job(cjob)), 60,
                   "job running")
    wait_for(lambda: c.job(cjob).get("ckpt_step"), 30, "a periodic checkpoint")
    src = job["machine"]
    dst = next(m for m in ("m1", "m2") if m != src)
    c.call("c_migrate", cjob=cjob, machine=dst, gpu=0)
    c.daemons[src].send_signal(signal.SIGKILL)
    c.daemons[src].wait()
    wait_for(lambda: (lambda j: j["machine"] == dst and j["state"] == "running" and j["restarts"] >= 1)(c.job(cjob)),
             120, lambda: f"the job running again on {dst}: {c.job(cjob)}")
    unpace(tmp_path)        # (not before: the copy on the lost machine, until its lease ends, must not race ahead)
    done = wait_for(lambda: (lambda j: j["state"] in ("done", "failed", "killed") and j)(c.job(cjob)), 180,
                    lambda: f"the job's end: {c.job(cjob)}")
    assert done["state"] == "done" and done["machine"] == dst, done
    assert json.load(open(out))["steps"] == 600
