"""What a submitted job started ends with it: a child it forked and left, or one running when it is killed."""
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
