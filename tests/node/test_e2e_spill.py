"""End to end: suspended state beyond the host-RAM budget spills to disk and comes back bit-identically.

With a budget far below one job's state, every suspended job is spilled. An explicit-mode job checkpoints from
its host buffers, its process re-executes and waits holding nothing, and on its next turn restores from the
checkpoint; an unmodified script writes its host copy to a file in its own process and reads it back at resume.
"""
import subprocess

from node_harness import PY, ROOT, TRAIN, env, paced, result, start_py, unpace


def test_spill_to_disk_and_back(node_factory, tmp_path):
    # Paced (9 ms of "input" per step, no effect on the numbers) so that the jobs are sliced, and so spilled,
    # however fast this machine is; 1,000 steps (9 s of pacing each), so that neither finishes while the other
    # starts again from its spill (at 1,200 steps of 3 ms, a loaded machine took 5 s to start one, and the other
    # ended first). Once each has come back from a spill, the rest runs unpaced, short enough to end in a turn or
    # two: each further turn is a spill, a new process (at 3,000 steps of 3 ms, two more of them after the unpace).
    pace, steps = paced(tmp_path, "0.009"), "1000"
    refs = [start_py(TRAIN, str(tmp_path / f"solo{b}.json"), steps, "--batch", b, *pace) for b in ("32", "33")]
    node = node_factory("--virtual-gpus", "1x1GiB", "--quantum", "1", "--no-pack", "--host-budget", "1KiB")
    procs = [node.launch(TRAIN, str(tmp_path / f"job{b}.json"), steps, "--batch", b, *pace, "--attach",
                         opts=["--no-hook", "--mem", "600MiB"]) for b in ("32", "33")]
    ids = [node.job_of(p.pid) for p in procs]
    node.wait_for(lambda: all(node.job(i)["migrations"] >= 1 for i in ids), 120, lambda: node.ps())
    unpace(tmp_path)
    for p in procs:
        assert p.wait(180) == 0
    for r in refs:
        assert r.wait(120) == 0
    spills = [d for d in node.call("decisions", limit=500)["decisions"] if d["kind"] == "spill"]
    assert spills and all(d["numbers"]["host_held"] > d["numbers"]["budget"] == 1024 for d in spills), spills
    for j, b in zip(ids, ("32", "33")):
        info = node.job(j)
        assert info["state"] == "exited" and info["spilled"] and info["migrations"] >= 1, info
        out = result(tmp_path / f"job{b}.json")
        assert out["restored_at"] > 0, (out, info)           # the last run continued from a spilled checkpoint
        assert out["sha256"] == result(tmp_path / f"solo{b}.json")["sha256"]


def test_transparent_job_spills_in_its_process_and_is_not_moved(node_factory, tmp_path):
    """An unmodified script cannot be restored in a new process: gmuxd refuses to migrate it so (--new-process;
    a move in its own process needs no restore), and spills it in place instead (its host copy to a file, freed,
    read back at resume); it still ends bit-identical."""
    pace = paced(tmp_path, "0.003")
    refs = [start_py(TRAIN, str(tmp_path / f"solo{b}.json"), "1500", "--batch", b, *pace) for b in ("32", "33")]
    node = node_factory("--virtual-gpus", "2x1GiB", "--quantum", "0.5", "--no-pack", "--host-budget", "1KiB")
    procs = [node.launch(TRAIN, str(tmp_path / f"job{b}.json"), "1500", "--batch", b, *pace,
                         opts=["--gpu", "0", "--mem", "600MiB"]) for b in ("32", "33")]
    ja, jb = (node.job_of(p.pid) for p in procs)
    node.wait_for(lambda: node.job(ja)["suspends"] >= 1 and node.job(jb)["suspends"] >= 1, 60, "sliced")
    out = subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", node.rt, "migrate", ja, "--gpu", "1",
                          "--new-process"], env=env(),
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "transparent mode" in out.stderr and "--no-hook" in out.stderr
    unpace(tmp_path)
    for p in procs:
        assert p.wait(180) == 0
    for r in refs:
        assert r.wait(120) == 0
    spills = [d for d in node.call("decisions", limit=1000)["decisions"] if d["kind"] == "spill"]
    assert {j for d in spills for j in d["jobs"]} == {ja, jb}, spills
    assert all("in its process" in d["text"] for d in spills), spills
    for j, b in zip((ja, jb), ("32", "33")):
        info = node.job(j)
        assert info["state"] == "exited" and info["spilled"] and info["migrations"] == 0, info
        assert result(tmp_path / f"job{b}.json")["sha256"] == result(tmp_path / f"solo{b}.json")["sha256"]
    assert not list((tmp_path / "rt" / "checkpoints").glob("*.spill"))   # each was read back and removed
