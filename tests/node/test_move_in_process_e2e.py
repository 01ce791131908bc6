"""End to end: moves between virtual GPUs in the job's own process, with a real gmuxd and real jobs.

A job in explicit mode (it attached itself) and one in transparent mode (an unmodified script, which a new
process could not restore) swap GPUs: each suspends at a boundary, its seat moves, and it resumes on the other
GPU in the same process (same pid, nothing restored), its environment saying the new GPU; each ends
bit-identical to its solo run. A move onto a GPU too small is refused with the job running on where it was. A
job killed while its move waits for its boundary leaves both GPUs clean.
"""
import json
import os
import signal
import subprocess
import threading

from gmux.wire.daemon_client import GmuxError
from node_harness import PY, ROOT, TRAIN, env, paced, result, start_py, unpace

STEPS = "2500"
# Each step waits 5 ms (as if for input), so that the jobs are still training while the moves are asked for
# on a loaded machine, and until they have moved; it changes no number.
SLEEP = "0.005"


def gmux(node, *args):
    return subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", node.rt, *args], env=env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def gpu_table(node):
    return {g["index"]: (g["jobs"], g["resident"]) for g in node.ps()["gpus"]}


def test_jobs_swap_gpus_in_their_own_processes_bit_identically(node_factory, tmp_path):
    pace = paced(tmp_path, SLEEP)
    refs = {m: start_py(TRAIN, str(tmp_path / f"solo-{m}.json"), STEPS, *pace)
            for m in ("explicit", "transparent")}
    # (a 10 s deadline: a move that missed the 1 s default on a loaded machine would be given up)
    node = node_factory("--virtual-gpus", "1GiB,1GiB,64MiB", "--quantum", "600", "--deadline-floor", "10")
    pe = node.launch(TRAIN, str(tmp_path / "explicit.json"), STEPS, *pace, "--attach",
                     opts=["--no-hook", "--mem", "128MiB"])
    je = node.job_of(pe.pid, 60)
    pt = node.launch(TRAIN, str(tmp_path / "transparent.json"), STEPS, *pace, opts=["--mem", "128MiB"])
    jt = node.job_of(pt.pid, 60)
    node.wait_for(lambda: all(node.job(j)["step"] > 200 for j in (je, jt)), 120, "both jobs training")
    assert (node.job(je)["gpu"], node.job(jt)["gpu"]) == (0, 1)

    # GPU 2 is too small: refused, and the job goes on where it was, in the same process.
    out = gmux(node, "migrate", je, "--gpu", "2")
    assert out.returncode == 1 and "needs 128.0MiB, GPU 2 has 64.0MiB" in out.stderr, out.stderr
    step = node.job(je)["step"]
    node.wait_for(lambda: node.job(je)["step"] > step + 20, 60, "the refused job training on")
    info = node.job(je)
    assert (info["gpu"], info["state"], info["pid"], info["suspends"]) == (0, "running", pe.pid, 0), info
    assert gpu_table(node)[2] == ([], [])

    # The explicit job moves onto GPU 1, where the transparent one runs: it waits there for its turn, which
    # comes when the transparent one moves to GPU 0.
    out = gmux(node, "--json", "migrate", je, "--gpu", "1")
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert (reply["path"], reply["from"], reply["gpu"], reply["pid"]) == ("in process", 0, 1, pe.pid), reply
    assert gpu_table(node)[1] == (sorted([je, jt]), [jt])
    out = gmux(node, "migrate", jt, "--gpu", "0")
    assert out.returncode == 0 and f"migrated {jt} to GPU 0 (in process)" in out.stdout, out.stdout + out.stderr
    node.wait_for(lambda: node.job(je)["state"] == "running" and node.job(jt)["state"] == "running", 60,
                  "both running on their new GPUs")
    assert gpu_table(node) == {0: ([jt], [jt]), 1: ([je], [je]), 2: ([], [])}

    unpace(tmp_path)
    assert pe.wait(300) == 0 and pt.wait(300) == 0
    for m in refs:
        assert refs[m].wait(300) == 0
    for j, p, m, gpu in ((je, pe, "explicit", "1"), (jt, pt, "transparent", "0")):
        info, out, solo = node.job(j), result(tmp_path / f"{m}.json"), result(tmp_path / f"solo-{m}.json")
        assert info["state"] == "exited" and info["migrations"] == 1 and info["pid"] == p.pid, info
        assert out["pid"] == p.pid and out["restored_at"] == 0, out      # the same process, nothing restored
        assert out["devices"]["GMUX_VIRTUAL_GPU"] == gpu, out            # and it knows where it runs now
        assert out["steps"] == solo["steps"] and out["sha256"] == solo["sha256"], (m, out, solo)
    assert checkpoints(tmp_path) == []
    moved = [d for d in node.call("decisions", limit=1000)["decisions"] if d["kind"] == "moved"]
    assert [(d["jobs"], d["numbers"]["path"]) for d in moved] == [([je], "in process"), ([jt], "in process")]
    assert f"moved {je} in process from GPU 0 to GPU 1 (pid {pe.pid}" in moved[0]["text"]
    assert gpu_table(node) == {0: ([], []), 1: ([], []), 2: ([], [])}


def checkpoints(tmp_path):
    """The checkpoints in gmuxd's runtime dir: a move in process writes none."""
    folder = tmp_path / "rt" / "checkpoints"
    return sorted(os.listdir(folder)) if folder.exists() else []


def test_a_job_killed_mid_move_leaves_both_gpus_clean(node_factory, tmp_path):
    node = node_factory("--virtual-gpus", "2x1GiB", "--quantum", "600")
    # Each step waits 4 s: a move asked for waits that long for the job's boundary (within its deadline: three
    # of its mini-batches), long enough for the test to see it waiting on a loaded machine.
    p = node.launch(TRAIN, str(tmp_path / "o.json"), "100000", "--sleep", "4", "--attach", opts=["--no-hook"])
    job = node.job_of(p.pid, 60)
    node.wait_for(lambda: node.job(job)["step"] >= 2, 120, "job training")
    outcome = {}

    def ask():
        try:
            outcome["reply"] = node.call("migrate", job=job, gpu=1)
        except GmuxError as e:
            outcome["error"] = str(e)
    asker = threading.Thread(target=ask)
    asker.start()
    # (the detail is set as the move is asked for; the state once the suspend has gone out, a tick later)
    info = node.wait_for(lambda: (lambda j: j if "moving to GPU 1" in j["detail"] and j["state"] == "suspending"
                                  else None)(node.job(job)), 30, "the move asked for")
    assert gpu_table(node)[0] == ([job], [job]), info
    os.killpg(p.pid, signal.SIGKILL)
    asker.join(60)
    assert f"job {job} ended" in outcome.get("error", ""), outcome
    node.wait_for(lambda: node.job(job)["state"] in ("killed", "lost", "failed"), 30, "the job reaped")
    assert gpu_table(node) == {0: ([], []), 1: ([], [])}
    assert all(g["resident_mem"] == 0 for g in node.ps()["gpus"])
    assert not [d for d in node.call("decisions", limit=1000)["decisions"] if d["kind"] == "moved"]
