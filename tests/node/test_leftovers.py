"""What a submitted job started ends with it: a child it forked and left, or one running when it is killed."""
import time

FORKER = """import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(float(sys.argv[2]))
print("parent done")
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_child_a_job_left_running_ends_with_it_and_with_a_kill(node_factory, tmp_path):
    """A forked child outlived its job ("exited: finished") and even gmux shutdown --kill-jobs."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "forker.py"
    script.write_text(FORKER)
    for how, linger in (("exits", "0.5"), ("killed", "600")):
        pidfile = tmp_path / f"child-{how}"
        job = node.call("submit", argv=["python", str(script), str(pidfile), linger], cwd=str(tmp_path), env={},
                        name=how)["job"]
        node.wait_for(lambda: pidfile.exists() and pidfile.read_text(), 60, "the job's child to start")
        child = int(pidfile.read_text())
        if how == "killed":
            node.call("kill", job=job)
        node.wait_for(lambda: node.job(job)["state"] in ("exited", "killed", "failed"), 60, "the job to end")
        node.wait_for(lambda: not _alive(child), 10, f"the child a {how} job left to end")
        assert node.job(job)["state"] == ("exited" if how == "exits" else "killed")


def test_a_job_that_said_bye_keeps_its_group_until_its_process_has_exited(tmp_path):
    """Finished on its bye, a job may still write its last files: its group is ended only once its process is
    gone, also for one a restarted gmuxd re-attached (not its child)."""
    import subprocess
    import sys

    from gmux.node.jobs import Job
    from gmux.node.supervisor import Supervisor
    from gmux.rundir import RuntimeDir, proc_starttime
    leader = subprocess.Popen([sys.executable, "-c", FORKER, str(tmp_path / "child"), "600"],
                              start_new_session=True)
    try:
        for _ in range(600):
            if (tmp_path / "child").exists() and (tmp_path / "child").read_text():
                break
            time.sleep(0.05)
        child = int((tmp_path / "child").read_text())
        job = Job("j1", "t", "", ["python", "forker.py"], pid=leader.pid, starttime=proc_starttime(leader.pid),
                  managed=True)
        sup = Supervisor(RuntimeDir(str(tmp_path / "rt")))
        sup.end_leftovers(job)
        sup.reap_others(set())
        time.sleep(0.3)
        assert leader.poll() is None and _alive(child)     # still finishing: nothing is signalled
        leader.kill()
        leader.wait()
        sup.reap_others(set())
        for _ in range(200):
            if not _alive(child):
                break
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        leader.kill()
        leader.wait()
