"""End to end: a Hugging Face Trainer script and a Lightning script, unmodified under gmux-launch, become
framework-controlled jobs (gmux/job/frameworks): each time-sliced with two plain training jobs on a virtual GPU
at a short quantum, spilled by exit when its suspended state is over the host budget, migrated to another GPU
mid-run, and each ends bit-identical to its solo run. A Trainer whose resume would not be exact (its sampler is not
seeded) is refused a move to a new process, with the reason.

One gmuxd serves the whole scenario (the frameworks' imports cost seconds per process, and each spill or move
starts the job's process again); each framework's outcome is its own test. The frameworks are test
dependencies (`pip install .[test]`); without them these tests are skipped.
"""
import importlib.util
import io
import os
import time

import pytest
from rich.console import Console

from gmux.cli.tables import jobs_table
from gmux.wire.daemon_client import GmuxError
from node_harness import ROOT, TRAIN, Node, paced, result, start_py, unpace

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
FRAMEWORKS = {"hf": ("transformers", os.path.join(SCRIPTS, "hf_trainer.py")),
              "lightning": ("lightning", os.path.join(SCRIPTS, "lightning_train.py"))}
# 6 epochs of 32 batches of 8, two per optimizer step; each batch waits 60 ms in its collate function (as if for
# input; no number changes), so that a job trains (about 12 s of GPU time) for longer than the stretches it may
# run alone while the others start again after a spill; once the scenario has shown all it shows, unpaced.
ARGS = ["--epochs", "6", "--samples", "256"]
QUANTUM = "0.5"
# Each framework job is time-sliced with two plain training jobs on a GPU of its own, then moved to another.
SHARED, TARGET = {"hf": 0, "lightning": 1}, {"hf": 2, "lightning": 3}
# Each framework job holds ~0.25 MiB suspended (weights, grads, Adam), a plain job ~26 KiB: over the budget
# exactly when a framework job is suspended, which then spills by exit (the largest holder goes first).
BUDGET = "160KiB"
MISSING = [m for m, _ in FRAMEWORKS.values() if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"{', '.join(MISSING)} not installed (pip install -e .[test])")


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frameworks")
    solo = {n: start_py(script, str(tmp / f"solo_{n}.json"), *ARGS, *paced(tmp, "0.06"), *_own(n, tmp / "solo_logs"),
                        log=str(tmp / f"solo_{n}.log")) for n, (_, script) in FRAMEWORKS.items()}
    node = Node(tmp, "--virtual-gpus", "5x1GiB", "--quantum", QUANTUM, "--no-pack", "--host-budget", BUDGET)
    out = {"tmp": tmp, "node": node, "solo": solo, "ids": {}, "procs": {}, "others": {}}
    try:
        # The framework jobs train only once their GPUs' other jobs train too: alone, one once finished before
        # the others had started, on a loaded machine (and the inexact one, alone on its GPU, before the loop
        # below had begun).
        go = tmp / "go"
        for n, (_, script) in FRAMEWORKS.items():
            opts = ["--gpu", str(SHARED[n]), "--mem", "300MiB"]
            out["procs"][n] = node.launch(script, str(tmp / f"{n}.json"), *ARGS, *paced(tmp, "0.06"),
                                          *_own(n, tmp / "logs"),
                                          "--wait-for", str(go), opts=opts, log_name=f"{n}.log")
        # (12 epochs: alone on its GPU it must still be training when the loop below, busy with the other jobs'
        # moves, first sees it under its Trainer; at 6 it once finished before, on a loaded machine)
        out["procs"]["inexact"] = node.launch(FRAMEWORKS["hf"][1], str(tmp / "inexact.json"), "--epochs", "12",
                                               "--ignore-data-skip", *paced(tmp, "0.05"), "--wait-for", str(go),
                                               opts=["--gpu", "4", "--mem", "300MiB"], log_name="inexact.log")
        out["ids"] = {n: node.job_of(p.pid, 60) for n, p in out["procs"].items()}
        # The two other jobs on each shared GPU join once the framework job is there (its imports take seconds):
        # the slicer gives no back pay, and fairness is simplest to read from a common start.
        others = {n: [node.launch(TRAIN, str(tmp / f"other_{n}{k}.json"), "1000000", "--sleep", "0.003",
                                  opts=["--gpu", str(SHARED[n]), "--mem", "300MiB"]) for k in range(2)]
                  for n in FRAMEWORKS}
        out["others"] = {n: [node.job_of(p.pid) for p in ps] for n, ps in others.items()}
        node.wait_for(lambda: all(node.job(j)["step"] > 0 for js in out["others"].values() for j in js), 120,
                      "the other jobs training")
        go.touch()
        _run(node, out)
    finally:
        node.close()
        for p in solo.values():
            if p.poll() is None:
                p.kill()
    return out


def _own(name: str, where) -> list:
    """Lightning's run keeps a CSVLogger and its best checkpoints: a moved run must leave what an unmoved one
    does (one version directory, every row, the same best checkpoint). Its LR scheduler is its own, not torch's
    (as timm's are): gmux refused to take it as the job's state, and the run failed at its first boundary."""
    return ["--logs", str(where), "--own-scheduler"] if name == "lightning" else []


def _run(node: Node, out: dict) -> None:
    """One loop watches gmux ps and acts as soon as each thing can be shown: a framework job's turns after a
    spill may be long (its restart counts as its first mini-batch, and a turn lasts two), and it may finish in one."""
    ids = out["ids"]
    sliced = {n: [ids[n], *out["others"][n]] for n in FRAMEWORKS}
    target = dict(TARGET)                   # a GPU of its own: no suspend, so no further spill (a new process)
    window = {n: [None, None] for n in FRAMEWORKS}  # (time, GPU-seconds by job) while its three are sliced
    deadline = time.monotonic() + 300
    while target or "refused" not in out:
        assert time.monotonic() < deadline, f"never moved: {sorted(target)}, {out.get('refused')}: {node.ps()}"
        t, jobs = time.monotonic(), {j["id"]: j for j in node.ps()["jobs"]}
        for n in FRAMEWORKS:
            if all(jobs[i]["gpu"] == SHARED[n] for i in sliced[n]):     # until it is moved
                window[n][0] = window[n][0] or (t, {i: jobs[i]["gpu_seconds"] for i in sliced[n]})
                window[n][1] = (t, {i: jobs[i]["gpu_seconds"] for i in sliced[n]})
            # its row in gmux ps once it runs under its Trainer, movable
            if (jobs[ids[n]].get("report") or {}).get("control") == "framework" and jobs[ids[n]]["migratable"]:
                out.setdefault("rows", {}).setdefault(n, _render([jobs[ids[n]]]))
        inexact = jobs[ids["inexact"]]
        if "refused" not in out and (inexact.get("report") or {}).get("control") == "framework":
            # (it waits 50 ms per batch, so that it is still training when a blocking migrate below returns)
            assert inexact["state"] == "running", inexact
            with pytest.raises(GmuxError) as refused:
                node.call("migrate", job=inexact["id"], gpu=0, new_process=True)   # (in its process: moves)
            out["refused"], out["inexact_table"] = str(refused.value), _render([inexact])
        for n in list(target):
            info = jobs[ids[n]]
            assert info["state"] not in ("exited", "failed"), \
                f"{n} ended before it could be moved: {info}\n{node.call('decisions', limit=100)['decisions']}"
            # once it has been suspended and spilled by exit, during one of its turns
            if (info["spilled"] and info["migrations"] >= 1 and info["state"] == "running"
                    and info["gpu"] == SHARED[n] and info["migratable"]):
                try:
                    node.call("migrate", job=ids[n], gpu=target[n])   # answered once the job has left
                    del target[n]
                except GmuxError:
                    pass     # its turn ended meanwhile (busy with a suspend): at its next turn
        time.sleep(0.05)
    out["accounted"] = {}
    for n, ((t0, before), (t1, after)) in window.items():
        out["accounted"][n] = (t1 - t0, sum(after[i] - before[i] for i in sliced[n]) / (t1 - t0))
    for n in FRAMEWORKS:            # (their part is played: the rest runs unpaced, and they would compete)
        for job in out["others"][n]:
            node.call("kill", job=job)
    unpace(out["tmp"])
    for n in ("hf", "lightning", "inexact"):
        assert out["procs"][n].wait(300) == 0, (out["tmp"] / f"{n}.log").read_text()[-3000:]
    for p in out["solo"].values():
        assert p.wait(300) == 0
    out["jobs"] = {j["id"]: j for j in node.ps()["jobs"]}
    out["decisions"] = node.call("decisions", limit=2000)["decisions"]


def _render(jobs) -> str:
    buf = io.StringIO()
    Console(file=buf, width=400, color_system=None).print(jobs_table({"jobs": list(jobs)}))
    return buf.getvalue()


@pytest.mark.parametrize("name", ["hf", "lightning"])
def test_framework_job_is_sliced_spilled_moved_and_bit_identical(scenario, name):
    job = scenario["ids"][name]
    info = scenario["jobs"][job]
    window, accounted = scenario["accounted"][name]
    print(f"{name}: {info['suspends']} suspends, {info['migrations']} migrations; GPU {SHARED[name]}: GPU-seconds "
          f"accounted / wall {accounted:.3f} over {window:.1f} s")
    assert info["state"] == "exited" and info["gpu"] == TARGET[name], info
    assert info["suspends"] > 0 and info["spilled"] and info["migrations"] >= 2, info
    assert window >= 3.0 and 0.9 <= accounted <= 1.1, (window, accounted)
    kinds = {d["kind"] for d in scenario["decisions"] if job in d["jobs"]}
    assert {"spill", "migrate"} <= kinds, kinds
    moved, solo = result(scenario["tmp"] / f"{name}.json"), result(scenario["tmp"] / f"solo_{name}.json")
    assert moved["first_step"] > 0, moved          # its last process continued from a checkpoint
    assert moved["global_step"] == solo["global_step"] == 96
    assert moved["sha256"] == solo["sha256"], (moved, solo)
    assert moved.get("totals") == solo.get("totals"), (moved, solo)    # HF's train_loss and total_flos
    if name == "lightning":
        # one version directory, the same best checkpoints, every row the same: also the one logged at the very
        # step a process left at (Lightning logs a step's metrics after its batch-end hooks, where the boundary
        # is; it was lost)
        assert moved["logs"] == solo["logs"], (moved, solo)
        assert len(solo["logs"]["rows"][0]) > 10, solo
    row = [ln for ln in scenario["rows"][name].splitlines() if job in ln][0]
    assert "framework: suspend, free mem, move" in row, row


def test_a_trainer_whose_resume_is_not_exact_is_refused_a_move(scenario):
    job = scenario["ids"]["inexact"]
    info = scenario["jobs"][job]
    assert "not moved" in scenario["refused"] and "ignore_data_skip" in scenario["refused"], scenario["refused"]
    row = [ln for ln in scenario["inexact_table"].splitlines() if job in ln][0]
    # (it moves to another GPU in its own process, as every job between virtual GPUs; not into a new one)
    assert "framework: suspend, free mem, move GPU │" in row, row
    assert info["state"] == "exited" and info["gpu"] == 4 and info["migrations"] == 0 and not info["migratable"]
