"""End to end: --mem is a hard limit. Two jobs on one virtual GPU, each declared 64 MiB of a 1 GiB GPU; one
(submitted: it learns its limit from gmuxd's registration reply) asks for 200 MiB after a few steps, which the
GPU has but the job was not promised. Its allocation fails with torch's out-of-memory error naming the job,
its limit and how to raise it; the job ends failed with that reason; its neighbour, running all along,
ends bit-identical to a run of the same script without gmux. `gmux ps` shows each job's limit, memory in use
and peak while it runs. On the code before the limit the 200 MiB were simply taken (the hog exited 0).
"""
import os

from rich.console import Console

from gmux.cli.tables import jobs_table
from node_harness import PY, ROOT, TRAIN, result, start_py

HOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memhog_job.py")
MiB = 1 << 20
STEPS = "1500"


def test_a_job_past_its_limit_gets_an_oom_error_and_its_neighbour_is_untouched(node_factory, tmp_path):
    ref = start_py(TRAIN, str(tmp_path / "solo.json"), STEPS)
    node = node_factory("--virtual-gpus", "1x1GiB", "--quantum", "0.5")
    neighbour = node.launch(TRAIN, str(tmp_path / "neighbour.json"), STEPS, opts=["--mem", "64MiB",
                                                                                    "--name", "neighbour"])
    nid = node.job_of(neighbour.pid)
    hog = node.call("submit", argv=[PY, HOG, str(tmp_path / "hog.json"), "30", "200"], cwd=ROOT,
                    env={"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}, name="hog", mem=64 * MiB)
    hid = hog["job"]

    def reported():
        r = node.job(nid).get("report") or {}
        return r if r.get("mem_in_use") else None
    seen = node.wait_for(reported, 60, lambda: f"the neighbour's memory figures: {node.job(nid)}")
    assert seen["mem_limit"] == 64 * MiB and not seen["mem_limit_soft"] and seen["mem_enforced"] == "enforced"
    assert 0 < seen["mem_in_use"] <= 64 * MiB and 0 < seen["mem_peak"] <= 64 * MiB, seen
    table = Console(width=250, record=True)
    table.print(jobs_table(node.ps()))
    rows = [line for line in table.export_text().splitlines() if line.startswith("│")]
    row = next(line for line in rows if line.split("│")[1].strip() == nid)
    assert "/64.0MiB" in row, row      # what it uses / its peak / its limit

    node.wait_for(lambda: node.job(hid)["state"] in ("exited", "failed", "killed", "lost"), 60,
                  lambda: f"the hog to end: {node.job(hid)}")
    info = node.job(hid)
    print("hog:", info["state"], info["detail"])
    assert info["state"] == "failed", info
    for words in ("OutOfMemoryError", f"job {hid} (hog)", "memory limit of 64.0MiB", "tried to allocate 200.0MiB",
                  "gmux-launch --mem"):
        assert words in info["detail"], (words, info["detail"])
    caught = result(tmp_path / "hog.json")           # what the script's `except torch.OutOfMemoryError` saw
    assert caught["type"] == "OutOfMemoryError" and "memory limit of 64.0MiB" in caught["refused"], caught
    assert "over its GPU memory limit" in node.call("logs", job=hid)["text"]

    assert neighbour.wait(120) == 0 and ref.wait(120) == 0
    assert node.job(nid)["state"] == "exited"
    assert result(tmp_path / "neighbour.json")["sha256"] == result(tmp_path / "solo.json")["sha256"]
