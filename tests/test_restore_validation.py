"""Restore checks everything before it changes anything (issue 12, item 4).

Each test builds a checkpoint whose frames are sound (valid checksums) but whose content does not fit the job,
or is made to cost much to decode, and asserts that restoring it raises CheckpointError naming the file and
the field, and leaves the live job bit-identical: weights, gradients, optimizer, schedulers, scaler, RNG,
data position and step count.
"""
import copy
import os
import time

import pytest
import torch
from torch import nn

import gmux.job as gj
from gmux.job.data import DataPosition
from gmux_testkit import assert_identical

import ckpt_forge as forge


def small_job(seed=0, steps=1, width=8):
    """A small job: 3 linear layers (param 2 is the (4, 8) weight), Adam with state, StepLR, GradScaler."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    scaler = torch.amp.GradScaler("cpu")
    job = gj.attach(model, opt, sched, scaler, extras={"ema": torch.zeros(3)}, state={"note": [1, "two"]})
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).sum().backward()
        opt.step()
        sched.step()
    job.position = DataPosition(epoch=1, index=2, epoch_rng=torch.get_rng_state())
    job.profile.steps = steps
    return job


def frozen(job) -> dict:
    """Everything a restore could change, copied (tensors cloned), to compare bit for bit."""
    snap = job.snapshot()
    snap["optimizer_objects"] = [copy.deepcopy(o.state_dict()) for o in job.tracked.optimizers]
    snap["position"]["replay"] = job.position.replay
    return _clone(snap)


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(v) for v in obj)
    return obj


def refused(tmp, data: bytes, pattern: str, live=None):
    """Writes `data` to a file, restores it into a live job, and checks the refusal and that nothing changed."""
    path = os.path.join(tmp, "c.ckpt")
    with open(path, "wb") as f:
        f.write(data)
    job = live if live is not None else small_job(seed=1, steps=2)
    before = frozen(job)
    with pytest.raises(gj.CheckpointError, match=pattern) as e:
        job.restore(path)
    assert repr(path) in str(e.value), f"the error does not name the file: {e.value}"
    assert_identical(before, frozen(job))
    return str(e.value)


def test_a_sound_checkpoint_still_restores_into_a_fresh_job(tmp):
    """The validation refuses no checkpoint gmux wrote: one with optimizer state, into a job without any."""
    source = small_job(seed=0, steps=3)
    path = os.path.join(tmp, "ok.ckpt")
    source.checkpoint(path)
    expect = frozen(source)
    fresh = small_job(seed=5, steps=0)
    own = torch.get_rng_state()
    fresh.restore(path)
    got = frozen(fresh)
    expect["position"]["replay"] = True
    assert_identical(expect, got)
    # (a replay to come: the script runs on to its loop on its own streams, the checkpoint's wait for the replay,
    # and a snapshot meanwhile holds them)
    assert torch.equal(torch.get_rng_state(), own)


# -- the failures found by the adversarial tester ---------------------------------------------------------
def test_optimizer_state_of_the_wrong_shape_is_refused(tmp):
    """Before: restored without error; the next optimizer step crashed."""
    snap = small_job().snapshot()
    snap["optimizers"][0]["state"][2]["exp_avg"] = torch.zeros(4, 4)
    data = forge.written(snap)
    want = r"optimizer 0 state for param 2 'exp_avg': shape \(4, 4\), the job has \(4, 8\)"
    refused(tmp, data, want)
    refused(tmp, data, want, live=small_job(seed=3, steps=0))   # a fresh optimizer has no state to compare to


def test_optimizer_state_of_the_wrong_dtype_or_keys_is_refused(tmp):
    snap = small_job().snapshot()
    snap["optimizers"][0]["state"][1]["exp_avg_sq"] = snap["optimizers"][0]["state"][1]["exp_avg_sq"].double()
    refused(tmp, forge.written(snap), r"optimizer 0 state for param 1 'exp_avg_sq': dtype float64, the job has float32")
    snap = small_job().snapshot()
    del snap["optimizers"][0]["state"][0]["exp_avg"]
    refused(tmp, forge.written(snap), r"optimizer 0 state for param 0: keys")
    refused(tmp, forge.written(snap), r"optimizer 0 state for param 0: keys", live=small_job(seed=3, steps=0))
    snap = small_job().snapshot()
    snap["optimizers"][0]["param_groups"][0]["lr"] = "fast"
    refused(tmp, forge.written(snap), r"optimizer 0 param group 0 'lr': a str, the job has a float")
    # What torch refuses when the optimizer is made (a hostile tester's NaN and -1 trained on)
    for key, bad in (("lr", float("nan")), ("lr", -1.0), ("eps", float("nan"))):
        snap["optimizers"][0]["param_groups"][0] = {**small_job().snapshot()["optimizers"][0]["param_groups"][0],
                                                    key: bad}
        refused(tmp, forge.written(snap), rf"optimizer 0 param group 0 '{key}': {bad}, which no optimizer takes")


def test_a_bad_frozen_section_is_refused_before_anything_changes(tmp):
    """Which parameters require gradients comes from the file: names the model does not have, or an integer
    parameter left out (a restore would have made it require gradients, which torch refuses half-way), are refused
    first."""
    snap = small_job().snapshot()
    snap["frozen"] = [["0.weight", "9.bias"]]
    refused(tmp, forge.written(snap), r"module 0 frozen parameters: \['0.weight', '9.bias'\], not a list")
    snap["frozen"] = [["0.weight"], []]
    refused(tmp, forge.written(snap), r"'frozen': a list, the job has a list of 1")
    live = small_job(seed=1, steps=2)
    live.tracked.modules[0].register_parameter("count", nn.Parameter(torch.zeros(2, dtype=torch.int64),
                                                                     requires_grad=False))
    snap = live.snapshot()
    snap["frozen"] = [[]]
    refused(tmp, forge.written(snap), r"holding each that cannot require gradients", live=live)


def test_a_bad_eval_section_is_refused_before_anything_changes(tmp):
    """Which submodules were in eval mode comes from the file: a name the model does not have is refused first."""
    snap = small_job().snapshot()
    snap["eval"] = [["0", "9"]]
    refused(tmp, forge.written(snap), r"module 0 submodules in eval mode: \['0', '9'\], not a list")
    snap["eval"] = [[], []]
    refused(tmp, forge.written(snap), r"'eval': a list, the job has a list of 1")


def test_a_bad_rng_state_is_refused_before_the_weights_change(tmp):
    """Before: refused by torch.set_rng_state only after load_state_dict had overwritten the weights."""
    snap = small_job().snapshot()
    snap["rng"]["torch"] = torch.zeros(10, dtype=torch.uint8)
    refused(tmp, forge.written(snap), r"rng 'torch': shape \(10,\), the job has \(5056,\)")
    snap["rng"]["torch"] = torch.zeros(5056, dtype=torch.uint8)   # the right size, but no valid state
    refused(tmp, forge.written(snap), r"rng 'torch': .*Invalid mt19937 state")
    snap = small_job().snapshot()
    snap["rng"]["python"] = (3, (1, 2, 3), None)
    refused(tmp, forge.written(snap), r"rng 'python'")
    snap = small_job().snapshot()
    snap["rng"]["numpy"] = ("MT19937", torch.full((624,), -1, dtype=torch.int64), 0, 0, 0.0)
    refused(tmp, forge.written(snap), r"rng 'numpy'")
    # NumPy takes any position into its key: 1,000,000 made the job's next draw crash it (SIGSEGV)
    keys = small_job().snapshot()["rng"]["numpy"][1]
    for pos in (625, 1_000_000, -1):
        snap["rng"]["numpy"] = ("MT19937", keys, pos, 0, 0.0)
        refused(tmp, forge.written(snap), rf"rng 'numpy': position {pos} is not in 0..624")


def test_bad_epoch_start_streams_are_refused_before_anything_changes(tmp):
    """The streams job.epochs kept at the epoch's start are checked as the checkpoint's own are; a checkpoint
    written before they existed (no key) still restores."""
    job = small_job()
    job.position.epoch_streams = job.tracked.streams()
    snap = job.snapshot()
    snap["position"]["epoch_streams"]["rng"]["torch"] = torch.zeros(5056, dtype=torch.uint8)
    refused(tmp, forge.written(snap), r"position 'epoch_streams' rng 'torch': .*Invalid mt19937 state")
    snap["position"]["epoch_streams"] = {"rng": snap["rng"]}
    refused(tmp, forge.written(snap), r"position 'epoch_streams': a dict, the job has a dict of rng and generators")
    snap["position"]["epoch_streams"] = {"rng": {**snap["rng"], "python": (3, (1,), None)}, "generators": []}
    refused(tmp, forge.written(snap), r"position 'epoch_streams' rng 'python'")
    # The streams at the loader's start and the loaders read beside it are checked alike.
    job = small_job()
    job.position.data_streams = job.tracked.streams()
    snap = job.snapshot()
    snap["position"]["data_streams"]["rng"]["numpy"] = ("MT19937", torch.full((624,), -1, dtype=torch.int64), 0, 0, 0.0)
    refused(tmp, forge.written(snap), r"position 'data_streams' rng 'numpy'")
    snap = job.snapshot()
    snap["position"]["beside"] = [{"index": 1, "streams": snap["rng"]}]
    refused(tmp, forge.written(snap), r"position 'beside'\[0\]: a dict, the job has a dict of index, streams")
    snap["position"]["beside"] = [{"index": -1, "streams": {"rng": snap["rng"], "generators": []}, "generators": []}]
    refused(tmp, forge.written(snap), r"position 'beside'\[0\] 'index': -1, which is negative")
    snap["position"]["beside"] = [{"index": 1, "streams": {"rng": snap["rng"], "generators": []},
                                   "generators": [torch.zeros(3, dtype=torch.uint8)]}]
    refused(tmp, forge.written(snap), r"position 'beside'\[0\] 'generators': uint8 \(3,\), the job has a generator")
    snap["position"]["beside"] = [{"index": 1, "streams": {"rng": snap["rng"], "generators": []},
                                   "generators": [torch.zeros(16, dtype=torch.uint8)]}]
    refused(tmp, forge.written(snap), r"position 'beside'\[0\] 'generators': uint8 \(16,\), the job has a")
    snap["position"]["beside"] = [{}] * 65
    refused(tmp, forge.written(snap), r"position 'beside': a list")
    # (and state= as at the epoch's start: a dict, what state= itself holds)
    snap = job.snapshot()
    snap["position"]["epoch_state"] = [1, 2]
    refused(tmp, forge.written(snap), r"position 'epoch_state': a list, the job has a dict")
    snap = small_job().snapshot()
    for key in ("epoch_streams", "data_streams", "beside", "epoch_state"):
        del snap["position"][key]
    snap["position"]["epoch_rng"] = torch.Generator().manual_seed(5).get_state()   # (not the checkpoint's own)
    path = os.path.join(tmp, "old.ckpt")
    with open(path, "wb") as f:
        f.write(forge.written(snap))
    other = small_job(seed=1)
    other.restore(path)
    assert other.position.epoch_streams is None and other.position.index == 2
    # Its replay draws the epoch's order from its torch state, then leaves the streams as the checkpoint had them.
    restored = other.position.at_checkpoint["rng"]["torch"]
    batches = iter(other.data(torch.utils.data.DataLoader(list(range(8)), batch_size=2, shuffle=True)))
    assert len(next(batches)) == 2 and torch.equal(torch.get_rng_state(), restored)


def test_a_non_numeric_step_count_or_position_is_refused_before_anything_changes(tmp):
    """Before: int('many') failed after the weights, optimizer and RNG had been restored."""
    snap = small_job().snapshot()
    snap["steps"] = "many"
    refused(tmp, forge.written(snap), r"'steps': a str, the job has an int")
    snap = small_job().snapshot()
    snap["position"]["epoch"] = 1.5
    refused(tmp, forge.written(snap), r"position 'epoch'")
    snap = small_job().snapshot()
    snap["position"]["epoch_rng"] = None      # mid-epoch (index 2) needs the epoch's random state to replay
    refused(tmp, forge.written(snap), r"position 'epoch_rng'")
    snap = small_job().snapshot()
    snap["position"]["reused_workers"] = "yes"
    refused(tmp, forge.written(snap), r"position 'reused_workers': a str, the job has a bool")
    for loop, said in ((7, "an int"), ("x" * 301, "301 characters")):
        snap = small_job().snapshot()
        snap["position"]["own_loop"] = loop
        refused(tmp, forge.written(snap), rf"position 'own_loop': {said}, the job has a line of its script")


def test_a_shared_reference_bomb_is_refused_while_decoding(tmp):
    """Before: a few hundred bytes standing for 8**7 values were expanded (35 s and 3 GiB for a larger one)."""
    data = forge.written(small_job().snapshot())
    skel = forge.skeleton_of(data)
    skel["state"] = {"bomb": forge.SENTINEL}
    bomb = forge.with_skeleton(data, forge.spliced(skel, forge.shared_reference_bomb(levels=7, width=8)))
    assert len(forge.shared_reference_bomb(levels=7, width=8)) < 400
    t0 = time.perf_counter()
    refused(tmp, bomb, r"shared references")
    assert time.perf_counter() - t0 < 10


def test_deep_nesting_is_refused_naming_the_file(tmp):
    """Before: a raw RecursionError (a nested list) or a restore that hashed 50000 nested tuples; one of
    1,000,000 crashed the process (the C stack overflows while hashing a dict key)."""
    data = forge.written(small_job().snapshot())
    skel = forge.skeleton_of(data)
    skel["state"] = {"deep": forge.SENTINEL}
    refused(tmp, forge.with_skeleton(data, forge.spliced(skel, forge.deep_list(100000))), r"nested deeper than")
    skel["state"] = {forge.SENTINEL: 1}
    refused(tmp, forge.with_skeleton(data, forge.spliced(skel, forge.deep_tuple(50000))), r"nested deeper than")


def test_a_section_of_the_wrong_type_is_refused_naming_it(tmp):
    """Before: a raw TypeError from len() of an int."""
    snap = small_job().snapshot()
    snap["modules"] = 5
    refused(tmp, forge.written(snap), r"'modules': an int, the job has a list")
    snap = small_job().snapshot()
    snap["optimizers"][0]["state"] = [1, 2]
    refused(tmp, forge.written(snap), r"optimizer 0 'state': a list, the job has a dict")


def test_a_tensor_table_claiming_4_TiB_is_refused_before_allocating(tmp):
    """Before: torch.empty(4 TiB) was tried before any data was read."""
    snap = small_job().snapshot()
    snap["state"]["t"] = torch.zeros(7)
    data = forge.written(snap)
    rows = forge.table_of(data)
    free = rows.index(["float32", [7], 28])      # the state's tensor: the only one of that shape
    huge = [r[:] for r in rows]
    huge[free] = ["float32", [1 << 40], 4 << 40]
    refused(tmp, forge.with_table(data, huge),
            r"claims \d+ bytes of tensor data, but the file holds only \d+ more bytes")
    huge = [r[:] for r in rows]
    huge[0] = ["float32", [1 << 40, 1], 4 << 40]       # the first weight, which the job holds as (8, 4)
    refused(tmp, forge.with_table(data, huge), r"parameter or buffer '0.weight' is \(1099511627776, 1\)")


def test_unknown_sections_and_extras_are_refused(tmp):
    snap = small_job().snapshot()
    snap["extras"]["other"] = torch.zeros(5)
    refused(tmp, forge.written(snap), r"extra tensor 'other' is in the checkpoint but not in this job")
    snap = small_job().snapshot()
    snap["surprise"] = 1
    refused(tmp, forge.written(snap), r"unexpected section 'surprise'")


def test_zeros_claimed_beyond_the_tensors_they_are_gradients_of_are_refused_before_allocating(tmp):
    """An outside review: a 226-byte file whose table listed 2 GiB of zeros made the reader allocate them (the
    frameworks' restore reads with no live job to check against); 4 TiB raised a bare RuntimeError."""
    import msgpack
    from gmux.job import checkpoint as ckpt
    data = forge.written({"w": torch.ones(4), "g": ckpt.Zeros(torch.zeros(4))})
    frames = forge.split(data)
    head = msgpack.unpackb(frames[0][1])
    assert len(head["zeros"]) == 1
    path = os.path.join(tmp, "zeros.ckpt")
    for size in (2 << 30, 4 << 40):
        head["tensors"][head["zeros"][0]] = ["uint8", [size], size]
        frames[0][1] = msgpack.packb(head)
        with open(path, "wb") as f:
            f.write(forge.join(frames))
        with pytest.raises(ckpt.CheckpointError, match=rf"lists {size} bytes of zeros, more than the 16 bytes"):
            ckpt.load(path)
    head["tensors"][head["zeros"][0]] = ["float32", [4], 16]      # as written: read back
    frames[0][1] = msgpack.packb(head)
    with open(path, "wb") as f:
        f.write(forge.join(frames))
    back = ckpt.load(path)
    assert torch.equal(back["w"], torch.ones(4)) and torch.equal(back["g"], torch.zeros(4))


@pytest.mark.parametrize("wait", ["abc", "nan", "-1", "inf"])
def test_a_restore_wait_that_is_no_number_of_seconds_is_refused_naming_the_variable(wait, tmp_path, monkeypatch):
    """GMUX_RESTORE_WAIT, set by hand: 'abc' raised float()'s bare ValueError, 'nan' waited for ever for a
    checkpoint that was not coming."""
    monkeypatch.setenv("GMUX_RESTORE", str(tmp_path / "never.ckpt"))
    monkeypatch.setenv("GMUX_RESTORE_WAIT", wait)
    before = gj.current()
    with pytest.raises(ValueError, match=f"GMUX_RESTORE_WAIT='{wait}': expected the seconds"):
        gj.attach(nn.Linear(2, 2))
    assert gj.current() is before


def test_a_bad_optimizer_attributes_section_is_refused_before_anything_changes(tmp):
    """What an optimizer of the script's own keeps in its attributes comes from the file: attributes for torch's own
    Adam, which keeps none there, a value of another kind than the optimizer holds, or a list of the wrong length
    are refused first."""
    snap = small_job().snapshot()
    snap["optimizer_attributes"] = [{"t": 3}]
    refused(tmp, forge.written(snap), r"optimizer 0 attributes: its Adam is a library's, which keeps none")
    snap["optimizer_attributes"] = [{}, {}]
    refused(tmp, forge.written(snap), r"'optimizer_attributes': a list, the job has a list of 1")

    class Counting(torch.optim.Adam):
        def __init__(self, params):
            super().__init__(params, lr=0.01)
            self.t = 0
    live = small_job()
    live.tracked.optimizers[0].__class__ = Counting
    live.tracked.optimizers[0].t = 0
    snap = live.snapshot()
    snap["optimizer_attributes"] = [{"t": "three"}]
    refused(tmp, forge.written(snap), r"optimizer 0 attributes: 't' is 'three', not plain data of the kind", live=live)


# -- sparse COO tensors (format version 3: gmux.job.sparse_tensors) ------------------------------------------
def sparse_job(seed=0, steps=2):
    """An Embedding(sparse=True) under SGD with momentum, zero_grad() at the loop's top: its gradient and its
    momentum buffer are sparse (uncoalesced) at the boundary."""
    torch.manual_seed(seed)
    emb = nn.Embedding(10, 3, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)
    job = gj.attach(emb, opt)
    for step in range(steps):
        opt.zero_grad()
        emb(torch.tensor([1, 2, 1, 7 + step])).sum().backward()
        opt.step()
    return job


def _unsafe(indices, size=(10, 3), coalesced=False, values=None):
    """A sparse tensor torch would refuse (check_invariants): what a crafted file holds."""
    indices = torch.tensor(indices)
    values = torch.ones(indices.shape[1], *size[indices.shape[0]:]) if values is None else values
    return torch.sparse_coo_tensor(indices, values, size, is_coalesced=coalesced, check_invariants=False)


def test_a_sound_sparse_checkpoint_restores_and_each_crafted_sparse_entry_is_refused_naming_it(tmp):
    """A checkpoint holds sparse COO tensors as two table rows and a SparseRef: each thing a crafted file can get
    wrong about one is refused before the job changes, naming it, where torch would have taken it unchecked (an
    index outside the table, read later out of bounds; a coalesced flag on repeated or unordered indices, summed
    or looked up wrong by the next step)."""
    def grad(t):
        snap = sparse_job().snapshot()
        snap["grads"][0]["weight"] = t
        return forge.written(snap)
    live = sparse_job(seed=1)
    path = os.path.join(tmp, "ok.ckpt")
    sparse_job().checkpoint(path)
    live.restore(path)          # (the live job is the source's from here: the refusals below leave it so)
    assert_identical(frozen(sparse_job()), frozen(live))
    refused(tmp, grad(_unsafe([[1, 99, 2]])), r"corrupt: a sparse tensor of size \[10, 3\] has indices from 1 to 99 "
                                              r"in dim 0, outside its 10", live)
    refused(tmp, grad(_unsafe([[-1, 2]])), r"indices from -1 to 2 in dim 0, outside its 10", live)
    refused(tmp, grad(_unsafe([[0, 2], [1, 9]], size=(10, 3))), r"indices from 1 to 9 in dim 1, outside its 3", live)
    for unordered in ([[2, 1]], [[1, 1]]):
        refused(tmp, grad(_unsafe(unordered, coalesced=True)), r"corrupt: a sparse tensor says it is coalesced, and "
                                                               r"its indices are not in order and unique", live)
    refused(tmp, grad(_unsafe([list(range(10)) + [9]], coalesced=True)),
            r"a coalesced sparse tensor of size \[10, 3\] claims 11 entries, more than its 10 places", live)
    refused(tmp, grad(_unsafe([[1, 2]], size=(12, 3))),
            r"gradient of 'weight': a sparse tensor of size \[12, 3\], the job's is \[10, 3\]", live)
    refused(tmp, grad(_unsafe([[1, 2]], values=torch.ones(2, 3, dtype=torch.float64))),
            r"gradient of 'weight': a sparse tensor of dtype float64, the job has float32", live)
    snap = sparse_job().snapshot()
    snap["optimizers"][0]["state"][0]["momentum_buffer"] = _unsafe([[1, 2]], size=(10, 4))
    refused(tmp, forge.written(snap), r"optimizer 0 state for param 0 'momentum_buffer': a sparse tensor of size "
                                      r"\[10, 4\], the job's is \[10, 3\]", live)
    snap = sparse_job().snapshot()
    snap["modules"][0]["weight"] = snap["grads"][0]["weight"]
    snap["grads"][0]["weight"] = torch.zeros(10, 3)
    refused(tmp, forge.written(snap), r"parameter or buffer 'weight' is not sparse in this job, a sparse tensor in "
                                      r"the checkpoint", live)


def test_a_sparse_entrys_table_rows_and_fields_are_checked_before_anything_is_read(tmp):
    """The table rows a SparseRef names (checked before any buffer is allocated) and its own fields (as the
    skeleton is decoded): int64 indices shaped [sparse dims, nnz], values shaped [nnz, *dense dims]."""
    import dataclasses
    import pickle
    from gmux.job.sparse_tensors import SparseRef
    live = sparse_job(seed=1)
    data = forge.written(sparse_job().snapshot())
    rows = forge.table_of(data)
    refs = [v for v in forge.skeleton_of(data)["grads"][0].values()] + \
        [v for st in forge.skeleton_of(data)["optimizers"][0]["state"].values() for v in st.values()]
    assert all(isinstance(r, SparseRef) for r in refs) and len(refs) == 2
    indices, values = refs[0].indices.index, refs[0].values.index
    nnz = rows[indices][1][1]
    assert rows[indices] == ["int64", [1, nnz], 8 * nnz] and rows[values] == ["float32", [nnz, 3], 12 * nnz]
    crafted = [r[:] for r in rows]
    crafted[indices] = ["int32", [1, nnz], 4 * nnz]
    refused(tmp, forge.with_table(data, crafted), r"corrupt: a sparse tensor's indices are int32, not int64", live)
    crafted = [r[:] for r in rows]
    crafted[values] = ["float32", [nnz + 1, 3], 12 * (nnz + 1)]
    refused(tmp, forge.with_table(data, crafted), rf"corrupt: a sparse tensor of size \[10, 3\] has {nnz} indices and "
                                                  rf"values shaped \[{nnz + 1}, 3\], not \[{nnz}, 3\]", live)
    crafted = [r[:] for r in rows]
    crafted[indices] = ["int64", [nnz], 8 * nnz]
    refused(tmp, forge.with_table(data, crafted), r"has indices shaped \[\d+\], not \[sparse dims, nnz\]", live)
    skel = forge.skeleton_of(data)
    for change, why in ((dict(size=[10, 3]), "whose size is not a tuple"), (dict(size=(10, -3)), "whose size is not"),
                        (dict(layout="sparse_csr"), r"of layout 'sparse_csr', not one of \['sparse_coo'\]"),
                        (dict(coalesced=1), "whose coalesced flag is not a bool"),
                        (dict(indices=refs[0].indices.index), "whose indices or values are not tensor references")):
        skel["grads"][0]["weight"] = dataclasses.replace(refs[0], **change)
        refused(tmp, forge.with_skeleton(data, pickle.dumps(skel, protocol=5)),
                rf"refused: the state holds a sparse tensor reference {why}", live)
