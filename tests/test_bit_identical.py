"""Interrupted deterministic training ends with exactly the weights of an uninterrupted run."""
import json
import os
import random
import re

import pytest
import torch

from gmux_testkit import assert_identical, run_py

TRAIN = ["-m", "gmux.examples.train"]


def _final(path):
    return torch.load(path, weights_only=False)


SEEDED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "seeded_data.py")


def _seeded_moved_twice(tmp, *args):
    """scripts/seeded_data.py with `args`, run alone and moved into a new process at steps 5 and 17 (epochs 0
    and 1): the final weights of each, (solo, moved)."""
    run_py(SEEDED, f"{tmp}/solo.pt", *args)
    run_py(SEEDED, f"{tmp}/x.pt", *args, "--migrate-at", "5", "--checkpoint", f"{tmp}/a.ckpt")
    run_py(SEEDED, f"{tmp}/x.pt", *args, "--restore", f"{tmp}/a.ckpt", "--migrate-at", "17",
           "--checkpoint", f"{tmp}/b.ckpt")
    run_py(SEEDED, f"{tmp}/moved.pt", *args, "--restore", f"{tmp}/b.ckpt")
    return torch.load(f"{tmp}/solo.pt"), torch.load(f"{tmp}/moved.pt")


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


@pytest.mark.parametrize("backend,options,tier,step", [("inductor", [], "state", []),
                                                       ("eager", ["--pool", "64MiB"], "allocator", []),
                                                       ("inductor", [], "state", ["--compile-step"]),
                                                       ("eager", [], "state", ["--compile-step"]),
                                                       ("eager", ["--pool", "64MiB"], "allocator", ["--compile-step"])])
def test_a_torch_compiled_script_under_the_transparent_hook(backend, options, tier, step, tmp):
    """torch.compile leaves weakref proxies about, some dead: the hook's search for the script's modules once
    crashed the script at its first command. The compiled model is found, suspended and resumed exactly
    (inductor, as scripts compile; the dynamo-only backend is the same wrapper, compiled in no time). An optimizer
    step compiled too runs gmux's step hooks inside its compiled frame: traced there, a suspend crashed the
    script (eager: a segfault) or failed every time (inductor); they run as plain Python (a graph break)."""
    from gmux.job.memory import native as allocator
    if tier == "allocator" and not allocator.available():
        pytest.skip("gmux._native is not built")
    script = "tests/scripts/plain_train.py"
    run_py(script, f"{tmp}/plain.pt", backend, *step)
    out = run_py("-m", "gmux.job.run", *options, "--cycle-every", "2", script, f"{tmp}/hooked.pt", backend, *step)
    assert f"25 suspends, {tier} tier" in out.stderr, out.stderr
    assert "global hooks" not in out.stderr          # torch's warning about gmux's own hooks is not the user's
    plain, hooked = torch.load(f"{tmp}/plain.pt"), torch.load(f"{tmp}/hooked.pt")
    assert next(iter(plain["model"])).startswith("_orig_mod.")      # the compiled wrapper's state
    assert_identical(plain, hooked)


@pytest.mark.parametrize("mode", ["accumulator-hooks", "optimizer-in-backward", "gradient-penalty", "flat-buffer",
                                  "torchscript", "sparse-csr", "inference-buffer", "tutorial-by-hand", "k-fold",
                                  "optimizer-per-epoch", "accumulate-max-norm", "inference-teacher"])
def test_loops_as_people_write_them_under_the_transparent_hook(mode, tmp):
    """Suspended at every boundary, in both tiers: hooks on the gradient accumulators keep firing (placing a
    parameter in native memory once gave it a new accumulator: DDP's all-reduce would have stopped), optimizers
    stepped inside the backward get their boundary after it, not in it, and a gradient penalty's
    torch.autograd.grad is not taken for the iteration's backward (both once suspended mid-iteration and broke the
    graph still waiting), and a flat parameter outside every module, whose views the model's parameters are, moves
    with them (it was not tracked, and the views placed in native memory stopped being updated). Each of the rest
    once failed too: a TorchScript model crashed the script (it takes no module hooks), a sparse CSR buffer
    crashed it or failed every suspend, a buffer made under inference_mode failed the allocator tier's suspends,
    PyTorch's tutorial loop (gradients cleared between forward and backward) got no boundary, and a k-fold loop's
    dropped models and optimizers were kept alive by gmux and moved at every suspend; then, once they were not,
    an optimizer made again each epoch that got a dead one's id went untracked, a forward renormalising its
    weights in place took a boundary between accumulated micro-batches, and a teacher built under inference_mode
    crashed the script (its parameters have no version counter) or its first suspend."""
    from gmux.job.memory import native as allocator
    script = "tests/scripts/hook_patterns.py"
    run_py(script, mode, f"{tmp}/plain.pt")
    plain = torch.load(f"{tmp}/plain.pt")
    tiers = [([], "state")] + ([(["--pool", "64MiB"], "allocator")] if allocator.available() else [])
    for options, tier in tiers:
        out = run_py("-m", "gmux.job.run", *options, "--cycle-every", "1", script, mode, f"{tmp}/{tier}.pt")
        source = "module" if mode in ("tutorial-by-hand", "accumulate-max-norm") else "optimizer"
        found = re.search(rf"gmux: (\d+) boundaries \({source} hook\), (\d+) suspends, {tier} tier", out.stderr)
        assert found and int(found.group(2)) >= 9, out.stderr
        if mode == "accumulate-max-norm":
            assert int(found.group(1)) <= 10, out.stderr       # one per update, none between micro-batches
        assert "suspend failed" not in out.stderr, out.stderr
        hooked = torch.load(f"{tmp}/{tier}.pt")
        assert hooked["fired"] == plain["fired"] == {"accumulator-hooks": 30 * 4, "optimizer-in-backward": 30 * 6,
                                                     }.get(mode, 0)
        assert_identical(plain, hooked)


def test_a_torch_compiled_model_attached_moves_to_a_new_process(tmp):
    common = [*TRAIN, "--model", "cnn", "--steps", "30", "--compile", "eager"]
    run_py(*common, "--out", f"{tmp}/solo.pt")
    run_py(*common, "--migrate-at", "11", "--checkpoint", f"{tmp}/m.ckpt", "--suspend-at", "5,10")
    run_py(*common, "--restore", f"{tmp}/m.ckpt", "--suspend-at", "20", "--out", f"{tmp}/moved.pt")
    solo, moved = _final(f"{tmp}/solo.pt"), _final(f"{tmp}/moved.pt")
    assert_identical(solo["model"], moved["model"], "model")
    assert_identical(solo["optimizer"], moved["optimizer"], "optimizer")
    assert solo["losses"] == moved["losses"]


@pytest.mark.parametrize("mode", ["sgd", "sparseadam"])
def test_sparse_gradients_at_the_boundary_move_to_a_new_process_exactly(mode, tmp):
    """Embedding(sparse=True) under SGD with momentum (its buffers sparse too) or SparseAdam, zero_grad() at the
    loop's top: every move was refused (a checkpoint held dense tensors only). Moved at step 9, the new process ends
    with the uninterrupted run's weights, sparse gradients (indices in their order, coalesced flag) and optimizer
    state."""
    script = os.path.join(os.path.dirname(SEEDED), "sparse_embeddings.py")
    run_py(script, f"{tmp}/solo.pt", mode)
    run_py(script, f"{tmp}/x.pt", mode, "--migrate-at", "9", "--checkpoint", f"{tmp}/m.ckpt")
    assert not os.path.exists(f"{tmp}/x.pt")       # the first process ended at its move
    run_py(script, f"{tmp}/moved.pt", mode, "--restore", f"{tmp}/m.ckpt")
    solo, moved = _final(f"{tmp}/solo.pt"), _final(f"{tmp}/moved.pt")
    assert all(g.layout == torch.sparse_coo for k, g in solo["grads"].items() if not k.startswith("head"))
    assert_identical(solo, moved)


def test_a_move_keeps_the_loaders_generator_and_numpy_and_random_streams(tmp):
    """The epoch's batches fetched again after a move draw from numpy and `random` too (a dataset adding noise),
    and leave the loader's own generator where the first process had it: two moves, mid-epoch, in epochs 0
    and 1, each in a new process."""
    solo, moved = _seeded_moved_twice(tmp)
    assert not os.path.exists(f"{tmp}/x.pt")     # each move's first process ended at its move
    assert_identical(solo, moved, "model")


def test_a_stream_without_a_length_batched_by_its_loader_moves_exactly(tmp):
    """An IterableDataset under DataLoader(batch_size=8), drawing each sample as it goes: job.data raised
    TypeError (its batch sampler has no length, and was asked for its truth); moved mid-epoch in epochs 0 and 1,
    the stream is replayed to where it was."""
    assert_identical(*_seeded_moved_twice(tmp, "--stream"), "model")


def test_a_move_replays_what_the_script_drew_at_its_epochs_start(tmp):
    """A script that draws an order of its own list of batches (random.sample) and the epoch's loss weight from
    numpy and torch at each epoch's start, before job.data: moved mid-epoch in epochs 0 and 1, the new process
    draws the same order and weight again (the streams are put back to the epoch's start when job.epochs
    re-enters it, and to the checkpoint's once the batches are replayed)."""
    assert_identical(*_seeded_moved_twice(tmp, "--epoch-draws"), "model")


def test_a_move_with_drawing_workers_started_in_an_earlier_epoch_is_refused_and_the_job_runs_on(tmp):
    """persistent_workers=True over a dataset drawing noise: workers started in epoch 0 carry their random state
    into epoch 1, which a new process cannot give them, so a move asked for in epoch 1 is refused (said on the
    job's stderr) and the job ends where it is, as if never asked; one asked for in epoch 0, where they start,
    moves exactly."""
    script = SEEDED
    args = ["--workers", "2", "--persistent"]
    run_py(script, f"{tmp}/solo.pt", *args)
    stayed = run_py(script, f"{tmp}/stayed.pt", *args, "--migrate-at", "17", "--checkpoint", f"{tmp}/a.ckpt")
    assert ("gmux: move refused, the job runs on here: its loader's persistent_workers were started in an earlier "
            "epoch and its dataset or collate function draws random numbers") in stayed.stderr
    assert not os.path.exists(f"{tmp}/a.ckpt")
    assert_identical(torch.load(f"{tmp}/solo.pt"), torch.load(f"{tmp}/stayed.pt"), "model")
    run_py(script, f"{tmp}/x.pt", *args, "--migrate-at", "5", "--checkpoint", f"{tmp}/b.ckpt")
    run_py(script, f"{tmp}/moved.pt", *args, "--restore", f"{tmp}/b.ckpt")
    assert not os.path.exists(f"{tmp}/x.pt")
    assert_identical(torch.load(f"{tmp}/solo.pt"), torch.load(f"{tmp}/moved.pt"), "model")


def test_persistent_workers_behind_a_map_made_before_job_data_are_refused_a_move_after_their_first_epoch(tmp):
    """map() over a persistent loader, made before job.data: a new process makes the loader's iterator anew when
    the script makes the map, drawing its workers' seed before the epoch's shuffle, which the first process did
    only in its first epoch. A move in epoch 1 is refused (on stderr) and the job runs on; one in epoch 0 moves."""
    script = SEEDED
    args = ["--workers", "2", "--persistent", "--quiet-data", "--map"]
    run_py(script, f"{tmp}/solo.pt", *args)
    stayed = run_py(script, f"{tmp}/stayed.pt", *args, "--migrate-at", "17", "--checkpoint", f"{tmp}/a.ckpt")
    assert "persistent workers are read through map() or a generator expression" in stayed.stderr, stayed.stderr
    assert not os.path.exists(f"{tmp}/a.ckpt")
    assert_identical(torch.load(f"{tmp}/solo.pt"), torch.load(f"{tmp}/stayed.pt"), "model")
    run_py(script, f"{tmp}/x.pt", *args, "--migrate-at", "5", "--checkpoint", f"{tmp}/b.ckpt")
    run_py(script, f"{tmp}/moved.pt", *args, "--restore", f"{tmp}/b.ckpt")
    assert_identical(torch.load(f"{tmp}/solo.pt"), torch.load(f"{tmp}/moved.pt"), "model")


@pytest.mark.parametrize("bar", [[], ["--tqdm"]])
def test_persistent_workers_that_draw_nothing_move_in_any_epoch(tmp, bar):
    """Persistent workers over a dataset that draws nothing: moved in epoch 1 and again in epoch 2, each new
    process's workers drawing their seed apart (the first process drew none after epoch 0: drawn from the loader's
    generator, it shifted the epoch's shuffle), the run ends as if never moved; read through a progress bar too,
    which makes the loader's iterator only at its first fetch."""
    script = SEEDED
    args = ["--workers", "2", "--persistent", "--quiet-data", *bar]
    run_py(script, f"{tmp}/solo.pt", *args)
    run_py(script, f"{tmp}/x.pt", *args, "--migrate-at", "17", "--checkpoint", f"{tmp}/a.ckpt")
    run_py(script, f"{tmp}/x.pt", *args, "--restore", f"{tmp}/a.ckpt", "--migrate-at", "29", "--checkpoint",
           f"{tmp}/b.ckpt")
    run_py(script, f"{tmp}/moved.pt", *args, "--restore", f"{tmp}/b.ckpt")
    assert not os.path.exists(f"{tmp}/x.pt")     # each move's first process ended at its move
    assert_identical(torch.load(f"{tmp}/solo.pt"), torch.load(f"{tmp}/moved.pt"), "model")


@pytest.mark.parametrize("mode, steps", [("validate", (5, 10)), ("made-early", (3, 7)), ("eval-inside", (3, 7)),
                                         ("zip", (2, 5)), ("zip-global", (2, 4)), ("tqdm", (3, 7)), ("map", (3, 7)),
                                         ("epoch-end", (5, 8)), ("steps", (3, 13)), ("kept", (3, 7)), ("forever", (5, 12)),
                                         ("last-batch", (5, 10)),
                                         ("stream", (5, 7, 10))])
def test_loops_beyond_one_loader_per_epoch_move_exactly(mode, steps, tmp):
    """Validation through job.data after training or inside it (or made before the loop), two loaders zipped, a
    loader inside a progress bar or map(), a boundary after the epoch's scheduler step, a loop by steps without
    job.epochs, one job.data read on across epochs or cycled by a generator of the script's own: each moved at two steps, once each, ends as the run never moved. Before: validation's position
    replaced the training loader's (the move trained the rest of the epoch again), zip crashed with StopIteration
    or drifted, the bar and map() hid the loader's generator, the epoch's tail ran twice, the numpy sampler drew
    another order; moved at an epoch's last batch, the new process replayed the whole epoch, ran none of its loop's
    body, and the script found no loss after the loop (NameError); the generator spun without end on the ended
    job.data, and a pass read on in a later epoch was replayed from its start there; what the script drew between
    attach and its loop was drawn from the checkpoint's streams, and the loop's draws after it were not."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "data_loops.py")
    run_py(script, f"{tmp}/solo.pt", "--mode", mode)
    solo = torch.load(f"{tmp}/solo.pt")
    for at in steps:
        run_py(script, f"{tmp}/x.pt", "--mode", mode, "--migrate-at", str(at), "--checkpoint", f"{tmp}/{at}.ckpt")
        assert not os.path.exists(f"{tmp}/x.pt") and os.path.exists(f"{tmp}/{at}.ckpt"), f"no move at step {at}"
        run_py(script, f"{tmp}/moved.pt", "--mode", mode, "--restore", f"{tmp}/{at}.ckpt")
        moved = torch.load(f"{tmp}/moved.pt")
        assert_identical(solo["model"], moved["model"], f"model, moved at step {at}")
        assert solo["val"] == moved["val"] and solo["lr"] == moved["lr"] and solo["probe"] == moved["probe"], at


@pytest.mark.parametrize("sampler", ["weighted", "subset"])
def test_a_move_keeps_a_samplers_own_generator(sampler, tmp):
    """The epoch's order drawn by a sampler's own torch.Generator (WeightedRandomSampler, SubsetRandomSampler):
    moved mid-epoch in epochs 0 and 1, it ends as the run never moved, the generator attached or not (the
    replay once left it where the new process had it: the epoch's order changed)."""
    for how in ([], ["--attach-sampler"]):
        assert_identical(*_seeded_moved_twice(tmp, "--sampler", sampler, *how), f"model {how}")


def test_a_scripts_own_random_generators_attached_continue_in_a_new_process(tmp):
    """A dataset drawing its noise from generators it holds (NumPy Generator and RandomState, random.Random,
    torch.Generator), attached with the model: moved twice, it ends as the run never moved. Not attached, the
    new process builds them afresh from their seeds and the run drifts: what makes this test able to fail."""
    for how in ([], ["--unattached"]):
        solo, moved = _seeded_moved_twice(tmp, "--own-generators", *how)
        if how:
            assert not torch.equal(solo["weight"], moved["weight"]), "unattached generators came back anyway"
        else:
            assert_identical(solo, moved, "model")


def test_a_checkpoint_of_other_generators_is_refused_before_anything_changes():
    """A checkpoint whose generators are not the job's (fewer, another kind, a state that is not one) is refused
    naming the generator, and the job's own generators are left as they were."""
    import io
    import random
    import numpy as np
    import gmux.job
    from gmux.job.state import StateMismatch
    from gmux.job.checkpoint import CheckpointError
    model = torch.nn.Linear(2, 1)
    writer = gmux.job.attach(model, np.random.default_rng(5), random.Random(6))
    buf = io.BytesIO()
    writer.checkpoint(buf)
    for gens, problem in (([np.random.default_rng(5)], "holds 2 random generators but this job attached 1"),
                          ([np.random.default_rng(5), torch.Generator()], "generator 1: python, the job attached "
                                                                           "a torch generator")):
        job = gmux.job.attach(torch.nn.Linear(2, 1), *gens)
        before = [g.bit_generator.state if isinstance(g, np.random.Generator) else g.get_state() for g in gens]
        with pytest.raises(StateMismatch, match=problem):
            job.restore(io.BytesIO(buf.getvalue()))
        after = [g.bit_generator.state if isinstance(g, np.random.Generator) else g.get_state() for g in gens]
        assert str(before) == str(after)
    # A NumPy state that is not one (PCG64's words in a checkpoint made for an MT19937 generator).
    job = gmux.job.attach(torch.nn.Linear(2, 1), np.random.Generator(np.random.MT19937(5)), random.Random(6))
    with pytest.raises(CheckpointError, match="generator 0: not a state of its numpy generator"):
        job.restore(io.BytesIO(buf.getvalue()))
    with pytest.raises(TypeError, match="random.SystemRandom draws from the operating system"):
        gmux.job.attach(model, random.SystemRandom())


def test_a_script_that_marks_its_own_boundaries_is_moved_at_one_of_them(tmp):
    """Gradient accumulation under job.data: a restored process knows that fetches are not boundaries, so a
    move asked for at once lands after an optimizer step, not between two accumulated micro-batches."""
    script = SEEDED
    run_py(script, f"{tmp}/solo.pt", "--accum", "2")
    run_py(script, f"{tmp}/x.pt", "--accum", "2", "--migrate-at", "3", "--checkpoint", f"{tmp}/a.ckpt")
    run_py(script, f"{tmp}/x.pt", "--accum", "2", "--restore", f"{tmp}/a.ckpt", "--move-again",
           "--checkpoint", f"{tmp}/b.ckpt")
    run_py(script, f"{tmp}/moved.pt", "--accum", "2", "--restore", f"{tmp}/b.ckpt")
    assert not os.path.exists(f"{tmp}/x.pt")
    assert_identical(torch.load(f"{tmp}/solo.pt"), torch.load(f"{tmp}/moved.pt"), "model")
