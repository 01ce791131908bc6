"""Unmodified loops of the kinds that have no optimizer step to hook, or whose steps are long, under gmuxd: a
hand-written update, LBFGS with a closure (each step longer than the quantum) and a two-model GAN loop, all three
time-sliced on one virtual GPU at a short quantum. Each ends bit-identical to its solo run, was suspended, and the
three jobs' GPU-seconds add up to the shared GPU's wall time."""
import os
import time

import pytest
import torch

from gmux_testkit import assert_identical
from node_harness import ROOT, start_py, unpace

SCRIPTS = os.path.join(ROOT, "tests", "scripts")

QUANTUM = "0.5"
# (script, its arguments after OUT: steps and the seconds each step, or each LBFGS closure call, also waits until
# the test has seen its window)
LOOPS = {"hand": ("poly_regression.py", "400", "0.02"),
         "lbfgs": ("lbfgs_timeseries.py", "10", "0.12"),     # up to 6 closure calls a step: ~0.7 s > the quantum
         "gan": ("gan_pair.py", "300", "0.025")}


def test_loops_without_hookable_steps_are_time_sliced_accounted_and_bit_identical(node_factory, tmp_path):
    loops = {n: (*args, str(tmp_path / "unpaced")) for n, args in LOOPS.items()}
    solos = {n: start_py(os.path.join(SCRIPTS, s), str(tmp_path / f"solo_{n}.pt"), *a) for n, (s, *a) in loops.items()}
    node = node_factory("--virtual-gpus", "1x1GiB", "--quantum", QUANTUM, "--no-pack")
    procs = {n: node.launch(os.path.join(SCRIPTS, s), str(tmp_path / f"{n}.pt"), *a, opts=["--mem", "300MiB"],
                            log_name=f"{n}.log") for n, (s, *a) in loops.items()}
    ids = {n: node.job_of(p.pid) for n, p in procs.items()}
    # A window while all three train (each has passed a boundary): every second of the GPU belongs to one of them.
    node.wait_for(lambda: all(node.job(i)["step"] >= 2 for i in ids.values()), 90, lambda: node.ps())
    before, t0 = {j["id"]: j for j in node.ps()["jobs"]}, time.monotonic()
    time.sleep(5.0)
    after, t1 = {j["id"]: j for j in node.ps()["jobs"]}, time.monotonic()
    running = all(after[i]["state"] not in ("exited", "failed", "killed", "lost") for i in ids.values())
    accounted = sum(after[i]["gpu_seconds"] - before[i]["gpu_seconds"] for i in ids.values()) / (t1 - t0)
    print(f"GPU-seconds / wall time over {t1 - t0:.1f} s: {accounted:.3f}")
    assert running, after
    assert accounted == pytest.approx(1.0, abs=0.10), (before, after)
    unpace(tmp_path)
    for n, p in procs.items():
        assert p.wait(240) == 0, (tmp_path / f"{n}.log").read_text()
    for n, p in solos.items():
        assert p.wait(120) == 0
    for n, i in ids.items():
        info = node.job(i)
        assert info["state"] == "exited" and info["suspends"] > 0, info
        assert_identical(torch.load(tmp_path / f"solo_{n}.pt"), torch.load(tmp_path / f"{n}.pt"), n)
    # LBFGS calls its closure several times a step: never a boundary inside one
    assert "saw a boundary inside a step: 0" in (tmp_path / "lbfgs.log").read_text()
