"""Unmodified training loops of every common kind, suspended and resumed at their boundaries by
`python -m gmux.job.run --cycle-every N`, end bit-identical to a plain run (each script is run both ways at
once, in new processes)."""
import re

import pytest
import torch

from gmux_testkit import assert_identical, start_py

SUMMARY = re.compile(r"gmux: (\d+) boundaries \(([a-z ]+)\), (\d+) suspends")


def _start(tmp, name, *args):
    return start_py(*args, log=f"{tmp}/{name}.out", err=f"{tmp}/{name}.err"), f"{tmp}/{name}"


def _finish(started):
    proc, name = started
    code = proc.wait(180)
    out, err = open(f"{name}.out").read(), open(f"{name}.err").read()
    assert code == 0, f"{proc.args} exited {code}\n{out}\n{err}"
    return out, err


@pytest.mark.parametrize("script,args,every,control,expected", [
    ("poly_regression.py", [], 3, "module hook", 59),        # 60 iterations: the first call has no update before it
    ("lbfgs_timeseries.py", [], 2, "optimizer hook", 8),      # 8 LBFGS steps of up to 6 closure calls each
    ("gan_pair.py", [], 3, "optimizer hook", 40),             # 40 iterations, one boundary each
    ("grad_accum.py", [], 3, "optimizer hook", 20),           # 20 updates of 4 micro-batches
    ("grad_accum.py", ["--by-hand"], 3, "module hook", 19),
    ("shared_and_sparse.py", ["shared"], 3, "optimizer hook", 60),     # torch crashed resizing shared memory
    ("shared_and_sparse.py", ["hogwild"], 3, "none yet", 0),            # the forked child trains: not the job
    ("shared_and_sparse.py", ["sparse"], 3, "optimizer hook", 60),      # a report with sparse gradients raised
    # a script that attaches itself: it was not cycled at all ("0 boundaries (none yet), 0 suspends")
    ("seeded_data.py", [], 4, "explicit", 48),
])
def test_loop_suspended_at_its_boundaries_ends_bit_identical(script, args, every, control, expected, tmp):
    path = f"tests/scripts/{script}"
    plain = _start(tmp, "plain", path, f"{tmp}/plain.pt", *args)
    hooked = _start(tmp, "hooked", "-m", "gmux.job.run", "--cycle-every", str(every), path, f"{tmp}/hooked.pt", *args)
    plain_out, _ = _finish(plain)
    hooked_out, err = _finish(hooked)
    boundaries, seen_control, suspends = SUMMARY.search(err).groups()
    assert (int(boundaries), seen_control, int(suspends)) == (expected, control, expected // every), err
    assert_identical(torch.load(f"{tmp}/plain.pt"), torch.load(f"{tmp}/hooked.pt"), script)
    assert plain_out == hooked_out
    if script == "lbfgs_timeseries.py":
        assert "closure calls that saw a boundary inside a step: 0" in hooked_out


@pytest.mark.parametrize("tier", [["--pool", "64MiB"], ["--pool", "64MiB", "--no-native"]],
                         ids=["native pool", "python pool"])
def test_shared_memory_stays_shared_on_a_virtual_gpu(tier, tmp):
    """Memory another process maps is never moved: a Hogwild child's updates reach the parent's model (a
    suspend that re-pointed the shared parameters to the pool cut them off and the run ended with other
    weights), and a model in shared memory trained in place ends as a plain run does."""
    for mode in ("hogwild", "shared"):
        path = "tests/scripts/shared_and_sparse.py"
        plain = _start(tmp, f"plain-{mode}", path, f"{tmp}/plain-{mode}.pt", mode)
        hooked = _start(tmp, f"hooked-{mode}", "-m", "gmux.job.run", "--cycle-every", "3", *tier, path,
                        f"{tmp}/hooked-{mode}.pt", mode)
        _finish(plain)
        _, err = _finish(hooked)
        assert SUMMARY.search(err).group(3) == ("0" if mode == "hogwild" else "20"), err
        assert_identical(torch.load(f"{tmp}/plain-{mode}.pt"), torch.load(f"{tmp}/hooked-{mode}.pt"), mode)
