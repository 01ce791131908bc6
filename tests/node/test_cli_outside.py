"""Node CLI edges an outside tester of cluster mode found on the way: a gang of one rank said "ranks j1 (pids
..)", jobs killed by `gmux shutdown --kill-jobs` had no exit status where `gmux kill`'s had -9, and a move onto a
GPU held for a gang did not say whose."""
import json
import re
import subprocess

from node_harness import PY, ROOT, env


def gmux(rt, *args, timeout=60):
    return subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", rt, *args], env=env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _sleeper(tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(600)\n")
    return str(script)


def test_a_gang_of_one_rank_is_said_in_the_singular(node_factory, tmp_path):
    """`gmux submit --ranks 1` printed "ranks j1 (pids 10562); logs: gmux logs JOB"."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    script = _sleeper(tmp_path)
    out = gmux(node.rt, "submit", "--ranks", "1", "--no-hook", "--", "python", script)
    assert out.returncode == 0, out
    assert re.fullmatch(r"submitted gang gang-j1: rank j1 \(pid \d+\); logs: gmux logs j1\n", out.stdout), out.stdout
    two = gmux(node.rt, "submit", "--ranks", "2", "--no-hook", "--", "python", script)
    assert re.match(r"submitted gang \S+: ranks j2, j3 \(pids \d+, \d+\); logs: gmux logs JOB\n", two.stdout), two


def test_a_move_onto_a_gpu_held_for_a_gang_names_the_gang(node_factory, tmp_path):
    """`gmux migrate j2 --gpu 0` onto the GPU a gang holds said "GPU 0 is held (or being freed) for a multi-GPU
    job or gang", naming neither, though the GPU table's HELD BY column names it to every caller."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    script = _sleeper(tmp_path)
    gang = json.loads(gmux(node.rt, "--json", "submit", "--ranks", "1", "--no-hook", "--", "python", script).stdout)
    node.wait_for(lambda: node.job("j1")["state"] == "running", 60, lambda: node.ps()["jobs"])
    alone = json.loads(gmux(node.rt, "--json", "submit", "--no-hook", "--", "python", script).stdout)
    assert (gang["jobs"], alone["gpu"]) == (["j1"], 1), (gang, alone)
    node.wait_for(lambda: node.job(alone["job"])["state"] == "running", 60, lambda: node.ps()["jobs"])
    moved = gmux(node.rt, "migrate", alone["job"], "--gpu", "0")
    assert moved.returncode == 1, moved
    assert "GPU 0 is held by j1 (rank 0 of gang gang-j1) to itself" in moved.stderr, moved.stderr


def test_jobs_killed_at_shutdown_have_the_exit_status_of_jobs_gmux_kill_killed(node_factory, tmp_path):
    """`gmux ps --json` after `gmux shutdown --kill-jobs` listed its jobs killed with exit_status null, where a job
    `gmux kill` killed had -9 (SIGKILL, as each was sent)."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    script = _sleeper(tmp_path)
    jobs = [json.loads(gmux(node.rt, "--json", "submit", "--no-hook", "--", "python", script).stdout)["job"]
            for _ in range(2)]
    node.wait_for(lambda: all(node.job(j)["state"] == "running" for j in jobs), 60, lambda: node.ps()["jobs"])
    assert gmux(node.rt, "kill", jobs[0]).returncode == 0
    assert gmux(node.rt, "shutdown", "--kill-jobs").returncode == 0
    node.daemon.wait(30)
    node.start()
    ended = {j["id"]: j for j in node.ps()["jobs"]}
    assert [(ended[j]["state"], ended[j]["exit_status"]) for j in jobs] == [("killed", -9)] * 2, ended
    assert ended[jobs[1]]["detail"] == "killed at daemon shutdown", ended[jobs[1]]


def test_a_gmux_launch_job_gmux_kill_killed_has_its_exit_status(node_factory, tmp_path):
    """A job gmuxd did not start (gmux-launch's; a cluster job's, which its link starts so) killed by `gmux kill`
    (or through the cluster) ended without an exit record, and was listed killed with exit_status null, where a
    `gmux submit` job gmuxd reaps had -9."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    launched = node.launch(_sleeper(tmp_path))
    job = node.job_of(launched.pid)
    assert gmux(node.rt, "kill", job).returncode == 0
    launched.wait(30)
    node.wait_for(lambda: node.job(job)["state"] == "killed", 30, lambda: node.job(job))
    assert (node.job(job)["exit_status"], node.job(job)["detail"]) == (-9, "killed by gmux kill"), node.job(job)
