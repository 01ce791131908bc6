"""End to end: a Hugging Face Trainer script and a Lightning script, unmodified under gmux-launch, become
framework-controlled jobs (gmux/job/frameworks): time-sliced on one virtual GPU with a third job at a short
quantum, spilled by exit when their suspended state is over the host budget, migrated to another GPU mid-run,
and each ends bit-identical to its solo run.

One gmuxd serves the whole scenario (the frameworks' imports cost seconds per process, and each spill or move
starts the job's process again); each framework's outcome is its own test. The frameworks are test
dependencies (`pip install .[test]`); without them these tests are skipped.
"""
import importlib.util
import io
import os
import subprocess
import time

import pytest
from rich.console import Console

from gmux.cli.tables import jobs_table
from gmux.wire.daemon_client import GmuxError
from node_harness import PY, ROOT, TRAIN, Node, env, result

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
FRAMEWORKS = {"hf": ("transformers", os.path.join(SCRIPTS, "hf_trainer.py")),
              "lightning": ("lightning", os.path.join(SCRIPTS, "lightning_train.py"))}
# 6 epochs of 32 batches of 8, two per optimizer step; each batch waits 10 ms in its collate function (as if for
# input), so the jobs train long enough to be sliced, spilled and moved on a fast machine; no number changes.
ARGS = ["--epochs", "6", "--samples", "256", "--sleep", "0.01"]
QUANTUM = "0.5"
# Each framework job holds ~0.3 MiB suspended (weights, grads, Adam), the third job ~30 KiB: over the budget
# exactly when a framework job is suspended, which then spills by exit (the largest holder goes first).
BUDGET = "64KiB"
MISSING = [m for m, _ in FRAMEWORKS.values() if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"{', '.join(MISSING)} not installed (pip install -e .[test])")


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frameworks")
    solo = {n: subprocess.Popen([PY, script, str(tmp / f"solo_{n}.json"), *ARGS], env=env(), cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=open(tmp / f"solo_{n}.log", "wb"))
            for n, (_, script) in FRAMEWORKS.items()}
    node = Node(tmp, "--virtual-gpus", "2x1GiB", "--quantum", QUANTUM, "--no-pack", "--host-budget", BUDGET)
    out = {"tmp": tmp, "node": node, "solo": solo, "ids": {}, "procs": {}}
    try:
        opts = ["--gpu", "0", "--mem", "300MiB"]
        third = node.launch(TRAIN, str(tmp / "third.json"), "1000000", "--sleep", "0.003", opts=opts)
        for n, (_, script) in FRAMEWORKS.items():
            out["procs"][n] = node.launch(script, str(tmp / f"{n}.json"), *ARGS, opts=opts, log_name=f"{n}.log")
        out["ids"] = {n: node.job_of(p.pid, 60) for n, p in out["procs"].items()}
        out["ids"]["third"] = node.job_of(third.pid)
        _run(node, out)
    finally:
        node.close()
        for p in solo.values():
            if p.poll() is None:
                p.kill()
    return out


def _run(node: Node, out: dict) -> None:
    ids = out["ids"]
    fw = [ids["hf"], ids["lightning"]]

    def framework_ready():
        jobs = {j["id"]: j for j in node.ps()["jobs"]}
        return all((jobs[i].get("report") or {}).get("control") == "framework" and jobs[i]["migratable"]
                   and jobs[i]["suspends"] >= 1 for i in fw) and jobs
    jobs = node.wait_for(framework_ready, 240, lambda: node.ps())
    out["table"] = _render(jobs.values())
    # GPU 0's wall time against the GPU-seconds accounted to its three jobs, over a window of slicing and spills
    before, t0 = {j["id"]: j for j in node.ps()["jobs"]}, time.monotonic()
    time.sleep(3.0)
    after, t1 = {j["id"]: j for j in node.ps()["jobs"]}, time.monotonic()
    out["accounted"] = sum(after[i]["gpu_seconds"] - before[i]["gpu_seconds"] for i in ids.values()) / (t1 - t0)
    # Each framework job, once it has been spilled by exit, is moved to GPU 1 during one of its turns.
    for n in ("hf", "lightning"):
        job = ids[n]
        node.wait_for(lambda: node.job(job)["spilled"] and node.job(job)["migrations"] >= 1, 240,
                      lambda: node.ps())
        deadline = time.monotonic() + 240
        while True:
            info = node.job(job)
            assert info["state"] not in ("exited", "failed"), f"{n} ended before it could be moved: {info}"
            if info["state"] == "running" and info["migratable"] and info["gpu"] == 0:
                try:
                    node.call("migrate", job=job, gpu=1)   # answered once the job has left for GPU 1
                    break
                except GmuxError:
                    pass     # its turn ended meanwhile (busy with a suspend): at its next turn
            assert time.monotonic() < deadline, f"{n} was never moved: {node.ps()}"
            time.sleep(0.05)
    for n in ("hf", "lightning"):
        assert out["procs"][n].wait(300) == 0, (out["tmp"] / f"{n}.log").read_text()[-3000:]
    for p in out["solo"].values():
        assert p.wait(300) == 0
    out["jobs"] = {j["id"]: j for j in node.ps()["jobs"]}
    out["decisions"] = node.call("decisions", limit=2000)["decisions"]
    node.call("kill", job=ids["third"])


def _render(jobs) -> str:
    buf = io.StringIO()
    Console(file=buf, width=400, color_system=None).print(jobs_table({"jobs": list(jobs)}))
    return buf.getvalue()


@pytest.mark.parametrize("name", ["hf", "lightning"])
def test_framework_job_is_sliced_spilled_moved_and_bit_identical(scenario, name):
    job = scenario["ids"][name]
    info = scenario["jobs"][job]
    print(f"{name}: {info['suspends']} suspends, {info['migrations']} migrations, GPU-seconds accounted / wall "
          f"{scenario['accounted']:.3f}")
    assert info["state"] == "exited" and info["gpu"] == 1, info
    assert info["suspends"] > 0 and info["spilled"] and info["migrations"] >= 2, info
    assert 0.9 <= scenario["accounted"] <= 1.1, scenario["accounted"]
    kinds = {d["kind"] for d in scenario["decisions"] if job in d["jobs"]}
    assert {"spill", "migrate"} <= kinds, kinds
    moved, solo = result(scenario["tmp"] / f"{name}.json"), result(scenario["tmp"] / f"solo_{name}.json")
    assert moved["first_step"] > 0, moved          # its last process continued from a checkpoint
    assert moved["global_step"] == solo["global_step"] == 96
    assert moved["sha256"] == solo["sha256"], (moved, solo)
    row = [ln for ln in scenario["table"].splitlines() if job in ln][0]
    assert "framework: suspend, free mem, move" in row, row
