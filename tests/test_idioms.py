"""Plain-PyTorch idioms around an attached job (tests/scripts/idioms.py), moved into a new process: each ends with
the weights of an uninterrupted run, or its move is refused, naming why, and the job runs on to them."""
import os

import torch

from gmux_testkit import assert_identical, run_py

IDIOMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "idioms.py")


def _solo_and_moved(tmp, idiom, at=7):
    """idioms.py IDIOM run alone, and moved into a new process at step `at`: (the solo run's
    output, the first process; the moved run's output is moved.pt)."""
    run_py(IDIOMS, f"{tmp}/solo.pt", idiom)
    first = run_py(IDIOMS, f"{tmp}/first.pt", idiom, "--migrate-at", str(at), "--checkpoint", f"{tmp}/a.ckpt")
    if os.path.exists(f"{tmp}/a.ckpt"):
        run_py(IDIOMS, f"{tmp}/moved.pt", idiom, "--restore", f"{tmp}/a.ckpt")
    return torch.load(f"{tmp}/solo.pt"), first


def test_a_gradscaler_attached_moves_with_its_scale_and_one_not_attached_keeps_the_job_where_it_is(tmp):
    """The scaler starts too high and grows every 3 steps, so it skips steps. Attached, a move carries its scale and
    the moved run skips what the solo run skipped. Not attached, a new process would start it at its initial scale
    again (it skipped 5 steps instead of 4, the weights up to 0.31 apart): the move is refused, and the job ends
    where it is, as if never asked."""
    solo, _ = _solo_and_moved(tmp, "scaler-attached")
    moved = torch.load(f"{tmp}/moved.pt")
    assert solo["skipped"] == moved["skipped"] == 4
    assert_identical(solo, moved, "scaler-attached")

    os.remove(f"{tmp}/a.ckpt")
    solo, first = _solo_and_moved(tmp, "scaler-stray")
    assert ("gmux: move refused, the job runs on here: an AMP GradScaler attach() was not given steps an optimizer "
            "of the job (SGD)") in first.stderr, first.stderr
    assert not os.path.exists(f"{tmp}/a.ckpt")
    assert solo["skipped"] == 4
    assert_identical(solo, torch.load(f"{tmp}/first.pt"), "scaler-stray")
