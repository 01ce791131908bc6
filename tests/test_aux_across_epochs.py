"""An auxiliary loader's pass read beside the epoch's loader and going on across an epoch's end (a multi-task loop's
iterator made again only on StopIteration): a move in the later epoch fast-forwards it (before: the new process
started that pass again from its first batch, silently inexact)."""
import os

import pytest
import torch

from gmux_testkit import assert_identical, run_py

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "aux_across_epochs.py")


# (10 main batches an epoch, 7 auxiliary a pass: the pass begun at step 8 goes on to step 14; step 16's began in
# epoch 1)
@pytest.mark.parametrize("step", [12, 16])
def test_an_auxiliary_loaders_pass_going_on_across_an_epochs_end_moves_exactly(step, tmp):
    run_py(SCRIPT, f"{tmp}/solo.pt")
    out = run_py(SCRIPT, f"{tmp}/first.pt", "--migrate-at", str(step), "--checkpoint", f"{tmp}/a.ckpt")
    assert os.path.exists(f"{tmp}/a.ckpt"), out.stderr
    run_py(SCRIPT, f"{tmp}/moved.pt", "--restore", f"{tmp}/a.ckpt")
    assert_identical(torch.load(f"{tmp}/solo.pt"), torch.load(f"{tmp}/moved.pt"), f"moved at step {step}")
