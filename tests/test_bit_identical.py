"""Interrupted deterministic training ends with exactly the weights of an uninterrupted run."""
import json
import os
import random

import pytest
import torch

from gmux_testkit import assert_identical, run_py

TRAIN = ["-m", "gmux.examples.train"]


def _final(path):
    return torch.load(path, weights_only=False)


@pytest.mark.parametrize("model,steps", [("cnn", 60), ("transformer", 40)])
def test_suspends_and_restores_in_new_processes_are_lossless(model, steps, tmp):
    common = [*TRAIN, "--model", model, "--steps", str(steps)]
    run_py(*common, "--out", f"{tmp}/solo.pt")

    # 24 suspend/resume cycles at random boundaries in one process.
    rng = random.Random(f"{model}-suspends")
    at = sorted(rng.sample(range(1, steps + 1), 24))
    out = run_py(*common, "--suspend-at", ",".join(map(str, at)), "--out", f"{tmp}/suspended.pt")
    assert "24 suspend/resume cycles" in out.stdout
    assert_identical(_final(f"{tmp}/solo.pt")["model"], _final(f"{tmp}/suspended.pt")["model"], "model")
    assert_identical(_final(f"{tmp}/solo.pt")["optimizer"], _final(f"{tmp}/suspended.pt")["optimizer"], "optimizer")
    # The same, each suspended in place (a cross-machine move's: nothing copied out or back).
    out = run_py(*common, "--suspend-at", ",".join(map(str, at)), "--in-place", "--out", f"{tmp}/held.pt",
                 "--report", f"{tmp}/held.json")
    assert "24 suspend/resume cycles" in out.stdout
    with open(f"{tmp}/held.json") as f:
        assert all(c["suspend"]["in_place"] and c["suspend"]["bytes"] == 0 for c in json.load(f)["cycles"])
    assert_identical(_final(f"{tmp}/solo.pt")["model"], _final(f"{tmp}/held.pt")["model"], "model")
    assert_identical(_final(f"{tmp}/solo.pt")["optimizer"], _final(f"{tmp}/held.pt")["optimizer"], "optimizer")

    # Three migrations into new processes (mid-epoch, with loader workers), with suspends in between.
    cuts = sorted(rng.sample(range(3, steps - 2), 3))
    restore = []
    for i, cut in enumerate(cuts):
        path = f"{tmp}/m{i}.ckpt"
        run_py(*common, *restore, "--migrate-at", str(cut), "--checkpoint", path,
               "--suspend-at", str(cut - 1))
        assert os.path.getsize(path) > 0
        restore = ["--restore", path]
    run_py(*common, *restore, "--out", f"{tmp}/migrated.pt")
    solo, migrated = _final(f"{tmp}/solo.pt"), _final(f"{tmp}/migrated.pt")
    assert_identical(solo["model"], migrated["model"], "model")
    assert_identical(solo["optimizer"], migrated["optimizer"], "optimizer")
    assert solo["losses"] == migrated["losses"]


@pytest.mark.parametrize("options,tier", [([], "state"), (["--pool", "64MiB", "--no-native"], "state"),
                                          (["--pool", "64MiB"], "allocator")])
def test_unmodified_script_under_the_transparent_hook(options, tier, tmp):
    from gmux.job.memory import native as allocator
    if tier == "allocator" and not allocator.available():
        pytest.skip("gmux._native is not built")
    script = "tests/scripts/plain_train.py"
    run_py(script, f"{tmp}/plain.pt")
    out = run_py("-m", "gmux.job.run", *options, "--cycle-every", "2", script, f"{tmp}/hooked.pt")
    assert f"25 suspends, {tier} tier" in out.stderr, out.stderr
    assert_identical(torch.load(f"{tmp}/plain.pt"), torch.load(f"{tmp}/hooked.pt"))


def test_a_move_keeps_the_loaders_generator_and_numpy_and_random_streams(tmp):
    """The epoch's batches fetched again after a move draw from numpy and `random` too (a dataset adding noise),
    and leave the loader's own generator where the first process had it: two moves, mid-epoch, in epochs 0
    and 1, each in a new process."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "seeded_data.py")
    run_py(script, f"{tmp}/solo.pt")
    run_py(script, f"{tmp}/x.pt", "--migrate-at", "5", "--checkpoint", f"{tmp}/a.ckpt")
    run_py(script, f"{tmp}/x.pt", "--restore", f"{tmp}/a.ckpt", "--migrate-at", "17", "--checkpoint", f"{tmp}/b.ckpt")
    run_py(script, f"{tmp}/moved.pt", "--restore", f"{tmp}/b.ckpt")
    assert not os.path.exists(f"{tmp}/x.pt")     # each move's first process ended at its move
    assert_identical(torch.load(f"{tmp}/solo.pt"), torch.load(f"{tmp}/moved.pt"), "model")


def test_a_script_that_marks_its_own_boundaries_is_moved_at_one_of_them(tmp):
    """Gradient accumulation under job.data: a restored process knows that fetches are not boundaries, so a
    move asked for at once lands after an optimizer step, not between two accumulated micro-batches."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "seeded_data.py")
    run_py(script, f"{tmp}/solo.pt", "--accum", "2")
    run_py(script, f"{tmp}/x.pt", "--accum", "2", "--migrate-at", "3", "--checkpoint", f"{tmp}/a.ckpt")
    run_py(script, f"{tmp}/x.pt", "--accum", "2", "--restore", f"{tmp}/a.ckpt", "--move-again",
           "--checkpoint", f"{tmp}/b.ckpt")
    run_py(script, f"{tmp}/moved.pt", "--accum", "2", "--restore", f"{tmp}/b.ckpt")
    assert not os.path.exists(f"{tmp}/x.pt")
    assert_identical(torch.load(f"{tmp}/solo.pt"), torch.load(f"{tmp}/moved.pt"), "model")
