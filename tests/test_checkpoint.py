"""Checkpoints: streamed or written atomically, and every kind of bad file refused by name, changing nothing."""
import collections
import copy
import io
import os
import pickle
import struct
import zlib

import pytest
import torch
from torch import nn

import gmux.job as gj
from gmux.job import checkpoint as ckpt
from gmux.job import module_attributes as gmux_module_attributes
from gmux.job import movability
from gmux.job import restore_check as gmux_restore_check
from gmux.job.state import StateMismatch
from gmux_testkit import OwnCosine, assert_identical


def _job(width=16, optimizer=torch.optim.Adam):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
    opt = optimizer(model.parameters(), lr=0.1)
    job = gj.attach(model, opt, state={"epoch_note": [1, 2.5, "three", (4, None)]})
    loss = model(torch.randn(8, 4)).sum()
    loss.backward()
    opt.step()
    return job, model


def _written(tmp):
    job, _ = _job()
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    return path


def test_stream_round_trip_restores_everything():
    job, model = _job()
    sink = io.BytesIO()
    job.checkpoint(sink)
    saved = [t.clone() for t in job.tracked.tensors()]
    other, _ = _job()
    with torch.no_grad():
        for p in other.tracked.modules[0].parameters():
            p.add_(1.0)
    other.restore(io.BytesIO(sink.getvalue()))
    assert_identical(saved, [t.clone() for t in other.tracked.tensors()])
    assert other.state["epoch_note"] == [1, 2.5, "three", (4, None)]


def test_atomic_write_leaves_no_partial_file(tmp):
    path = _written(tmp)
    good = open(path, "rb").read()
    job, _ = _job()
    job.tracked.state["bad"] = object()  # not storable: the write must fail before replacing the file
    with pytest.raises(gj.CheckpointError,
                       match=r"cannot store \(at state\['bad'\]\): a value of type builtins.object"):
        job.checkpoint(path)
    assert open(path, "rb").read() == good
    assert os.listdir(tmp) == ["job.ckpt"]


def _corrupt(path, offset_from_end=None, offset=None):
    data = bytearray(open(path, "rb").read())
    at = offset if offset is not None else len(data) - offset_from_end
    data[at] ^= 0xFF
    open(path, "wb").write(bytes(data))


def _refused(path, pattern):
    job, model = _job()
    before = [t.clone() for t in job.tracked.tensors()]
    with pytest.raises(gj.CheckpointError, match=pattern) as e:
        job.restore(path)
    assert repr(path) in str(e.value)
    assert_identical(before, [t.clone() for t in job.tracked.tensors()])


def test_corrupt_data_is_refused(tmp):
    path = _written(tmp)
    _corrupt(path, offset_from_end=60)
    _refused(path, "checksum mismatch in frame")


def test_truncated_file_is_refused(tmp):
    path = _written(tmp)
    data = open(path, "rb").read()
    for cut in (len(data) - 1, len(data) // 2, 12, 5):
        open(path, "wb").write(data[:cut])
        _refused(path, "truncated|not a gmux checkpoint")


def test_a_damaged_length_field_is_named_with_what_it_claims(tmp):
    """Before: a flipped high byte in frame 0's length read "truncated inside frame 0", as a cut file does."""
    path = _written(tmp)
    data = bytearray(open(path, "rb").read())
    length_at = len(ckpt.MAGIC) + 2 + 1          # after the magic, the version and frame 0's kind
    data[length_at + 2] ^= 0x01                  # +65,536 bytes claimed
    open(path, "wb").write(bytes(data))
    _refused(path, r"truncated or damaged: frame 0 says \d+ bytes follow, and only \d+ remain")


def test_wrong_version_is_refused(tmp):
    path = _written(tmp)
    data = bytearray(open(path, "rb").read())
    data[8:10] = struct.pack("<H", 99)
    open(path, "wb").write(bytes(data))
    _refused(path, "format version 99; this gmux reads versions 1, 2, 3$")


def test_not_a_checkpoint_and_missing_file(tmp):
    path = os.path.join(tmp, "notes.txt")
    open(path, "w").write("hello world, not a checkpoint")
    _refused(path, "not a gmux checkpoint")
    _refused(os.path.join(tmp, "absent.ckpt"), "no such file")


def test_wrong_model_is_refused_naming_the_parameter(tmp):
    job, _ = _job(width=32)
    path = os.path.join(tmp, "wide.ckpt")
    job.checkpoint(path)
    small, model = _job(width=16)
    before = [t.clone() for t in small.tracked.tensors()]
    with pytest.raises(gj.StateMismatch, match=r"different model: parameter or buffer '0.weight' is \(32, 4\)"):
        small.restore(path)
    assert_identical(before, [t.clone() for t in small.tracked.tensors()])


def test_wrong_optimizer_is_refused(tmp):
    path = _written(tmp)
    job, _ = _job(optimizer=torch.optim.SGD)
    with pytest.raises(gj.StateMismatch, match="optimizer 0 is Adam in the checkpoint but SGD in this job"):
        job.restore(path)


def test_a_checkpoint_cannot_run_code(tmp):
    """A forged SKEL frame with a valid checksum that would call os.system is refused, not executed."""
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + os.path.join(tmp, "pwned"),))
    skeleton = pickle.dumps({"modules": [], "x": Evil()})
    out = bytearray(ckpt.MAGIC + struct.pack("<H", ckpt.VERSION))
    for kind, payload in ((ckpt.HEAD, b"\x81\xa7tensors\x90"), (ckpt.SKEL, skeleton)):
        header = struct.pack("<BQ", kind, len(payload))
        out += header + payload + struct.pack("<I", zlib.crc32(payload, zlib.crc32(header)))
    path = os.path.join(tmp, "evil.ckpt")
    open(path, "wb").write(bytes(out))
    _refused(path, "refused: the state holds a value of type posix.system")
    assert not os.path.exists(os.path.join(tmp, "pwned"))


def test_attach_restores_a_moved_job_from_GMUX_RESTORE(tmp, monkeypatch):
    job, _ = _job()
    saved = [t.clone() for t in job.tracked.tensors()]
    path = os.path.join(tmp, "moved.ckpt")
    job.checkpoint(path)
    monkeypatch.setenv("GMUX_RESTORE", path)
    torch.manual_seed(1)  # a fresh process would build different initial weights
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    moved = gj.attach(model, opt, state={})
    assert_identical(saved, [t.clone() for t in moved.tracked.tensors()])
    assert moved.state["epoch_note"] == [1, 2.5, "three", (4, None)]


def test_data_frames_out_of_order_are_refused(tmp):
    """Each DATA frame has a valid checksum; only END's frames_crc32 tells their order (before: restored garbage)."""
    import ckpt_forge as forge
    path = _written(tmp)
    frames = forge.split(open(path, "rb").read())
    data = [i for i, (kind, _) in enumerate(frames) if kind == ckpt.DATA]
    a, b = data[0], data[1]                     # the first weight (16, 4) and its bias (16,)
    frames[a], frames[b] = frames[b], frames[a]
    open(path, "wb").write(forge.join(frames))
    _refused(path, r"tensor data is not what was written \(DATA frames missing, repeated or out of order\)")


def _as_version_1(frames: list, data_crc32: bool, swap: tuple = ()) -> bytes:
    """The same checkpoint as version 1 wrote it: END checksummed the tensor data itself (its oldest files
    did not); `swap`: two frames then exchanged."""
    import msgpack

    import ckpt_forge as forge
    end = msgpack.unpackb(frames[-1][1])
    del end["frames_crc32"]
    if data_crc32:
        end["data_crc32"] = zlib.crc32(b"".join(p for k, p in frames if k == ckpt.DATA))
    frames[-1][1] = msgpack.packb(end)
    if swap:
        a, b = swap
        frames[a], frames[b] = frames[b], frames[a]
    return forge.join(frames, prefix=ckpt.MAGIC + struct.pack("<H", 1))


def test_version_1_checkpoints_still_restore_and_their_order_check_holds(tmp):
    import ckpt_forge as forge
    job, _ = _job()
    saved = [t.clone() for t in job.tracked.tensors()]
    path = _written(tmp)
    written = open(path, "rb").read()
    for data_crc32 in (True, False):
        open(path, "wb").write(_as_version_1(forge.split(written), data_crc32))
        other, _ = _job()
        other.restore(path)
        assert_identical(saved, [t.clone() for t in other.tracked.tensors()])
    frames = forge.split(written)
    data = [i for i, (kind, _) in enumerate(frames) if kind == ckpt.DATA]
    open(path, "wb").write(_as_version_1(frames, True, swap=(data[0], data[1])))
    _refused(path, r"DATA frames missing, repeated or out of order")


def test_a_version_2_end_without_its_order_checksum_is_refused(tmp):
    import msgpack

    import ckpt_forge as forge
    path = _written(tmp)
    frames = forge.split(open(path, "rb").read())
    end = msgpack.unpackb(frames[-1][1])
    del end["frames_crc32"]
    frames[-1][1] = msgpack.packb(end)
    open(path, "wb").write(forge.join(frames))
    _refused(path, r"DATA frames missing, repeated or out of order")


class _Pipe(io.RawIOBase):
    """A stream that cannot seek (a socket, a pipe): its length is unknown until it ends."""
    def __init__(self, data: bytes):
        self._inner = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, b):
        return self._inner.readinto(b)


def test_a_stream_of_unknown_length_restores_and_bounds_what_the_job_cannot_vouch_for():
    import ckpt_forge as forge
    job, _ = _job()
    saved = [t.clone() for t in job.tracked.tensors()]
    sink = io.BytesIO()
    job.checkpoint(sink)
    other, _ = _job()
    other.restore(_Pipe(sink.getvalue()))
    assert_identical(saved, [t.clone() for t in other.tracked.tensors()])
    # a tensor in state= claiming 1 GiB, in a stream that cannot say how long it is: refused before allocating
    snap = job.snapshot()
    snap["state"]["blob"] = torch.zeros(3)
    data = forge.written(snap)
    rows = forge.table_of(data)
    rows[rows.index(["float32", [3], 12])] = ["uint8", [1 << 30], 1 << 30]
    before = [t.clone() for t in other.tracked.tensors()]
    with pytest.raises(gj.CheckpointError, match=r"\(stream\): refused: the tensor table claims \d+ bytes of tensor "
                                                 r"data the job does not hold \(at most 268435456 from a stream\)"):
        other.restore(_Pipe(forge.with_table(data, rows)))
    assert_identical(before, [t.clone() for t in other.tracked.tensors()])


@pytest.mark.parametrize("make", [lambda ps: torch.optim.Adafactor(ps, lr=0.01), lambda ps: torch.optim.LBFGS(ps)],
                         ids=["Adafactor", "LBFGS"])
def test_optimizers_with_state_unlike_their_parameters_restore_into_a_fresh_job(make, tmp):
    """Adafactor's factored statistics are shaped (rows, 1) and (1, cols), LBFGS keeps lists of past directions:
    a new process's optimizer, which has no state yet, once refused both. Restored, the next steps are the
    uninterrupted run's."""
    def build():
        torch.manual_seed(0)
        model = nn.Linear(8, 4)
        opt = make(model.parameters())
        return model, opt, gj.attach(model, opt)

    x = torch.randn(16, 8)

    def step(model, opt):
        def closure():
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            return loss
        opt.step(closure)

    model, opt, job = build()
    for _ in range(3):
        step(model, opt)
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    step(model, opt)
    moved_model, moved_opt, moved = build()
    moved.restore(path)
    step(moved_model, moved_opt)
    assert_identical(model.state_dict(), moved_model.state_dict(), "model")
    assert_identical(opt.state_dict(), moved_opt.state_dict(), "optimizer")


def _sparse_job(mode: str, seed: int = 0):
    """An Embedding(sparse=True) beside a dense head, as tests/scripts/sparse_embeddings.py trains it."""
    torch.manual_seed(seed)
    emb, head = nn.Embedding(20, 4, sparse=True), nn.Linear(4, 1)
    if mode == "sparseadam":
        opts = [torch.optim.SparseAdam(emb.parameters(), lr=0.01), torch.optim.Adam(head.parameters(), lr=0.01)]
    else:
        opts = [torch.optim.SGD([*emb.parameters(), *head.parameters()], lr=0.1,
                                momentum=0.9 if mode == "sgd-momentum" else 0.0)]
    return emb, head, opts, gj.attach(emb, head, *opts)


def _sparse_step(emb, head, opts, step: int):
    for opt in opts:        # (at the top, as most loops do: the last step's gradients are there at the boundary)
        opt.zero_grad()
    ids = torch.tensor([[step % 20, 3, 7, (5 * step) % 20, 3], [1, 3, 11, 7, step % 13]])
    head(emb(ids)).pow(2).mean().backward()
    for opt in opts:
        opt.step()


def _sparse_state(emb, head, opts) -> dict:
    return {"model": {**emb.state_dict(), **head.state_dict()}, "grads": [emb.weight.grad, head.weight.grad],
            "opts": [copy.deepcopy(o.state_dict()) for o in opts]}


@pytest.mark.parametrize("mode", ["sgd", "sgd-momentum", "sparseadam"])
@pytest.mark.parametrize("overwritten", [False, True])
def test_sparse_gradients_restore_into_a_fresh_job_and_train_on_exactly(mode, overwritten, tmp):
    """An Embedding(sparse=True) under SGD (with momentum its buffer is sparse too) or SparseAdam, zero_grad() at
    the loop's top, holds its last sparse gradient at every boundary: a checkpoint refused it ('checkpoints hold
    dense tensors only'), and no such job could move. Restored into a fresh job, the gradient comes back with its
    indices in their order, its values and its uncoalesced flag, and the next steps are the uninterrupted run's.
    (grads_overwritten: a sparse gradient is carried whole, not as zeros.)"""
    emb, head, opts, job = _sparse_job(mode)
    job.grads_overwritten = overwritten
    for step in range(3):
        _sparse_step(emb, head, opts, step)
    assert emb.weight.grad.layout == torch.sparse_coo and not emb.weight.grad.is_coalesced()
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    at_checkpoint = _sparse_state(emb, head, opts)
    moved_emb, moved_head, moved_opts, moved = _sparse_job(mode, seed=1)
    _sparse_step(moved_emb, moved_head, moved_opts, 7)     # (a fresh job's own gradients and state, replaced)
    moved.restore(path)
    restored = _sparse_state(moved_emb, moved_head, moved_opts)
    assert_identical(at_checkpoint["model"], restored["model"], "model")
    assert_identical(at_checkpoint["opts"], restored["opts"], "optimizers")
    assert_identical(at_checkpoint["grads"][0], restored["grads"][0], "sparse gradient")
    for step in (3, 4):
        _sparse_step(emb, head, opts, step)
        _sparse_step(moved_emb, moved_head, moved_opts, step)
    assert_identical(_sparse_state(emb, head, opts), _sparse_state(moved_emb, moved_head, moved_opts))


def test_a_gradient_restored_over_one_of_the_other_layout_is_taken_whole(tmp):
    """A job whose embedding's gradient is dense restored from one whose was sparse (and back): copy_() between the
    layouts raised once the weights were loaded, leaving the job half restored."""
    def job_of(sparse: bool):
        torch.manual_seed(0)
        emb = nn.Embedding(10, 3, sparse=sparse)
        emb(torch.tensor([1, 2, 1])).sum().backward()
        return emb, gj.attach(emb, torch.optim.SGD(emb.parameters(), lr=0.1))
    for saved, live in ((True, False), (False, True)):
        emb, job = job_of(saved)
        path = os.path.join(tmp, f"{saved}.ckpt")
        job.checkpoint(path)
        other, moved = job_of(live)
        moved.restore(path)
        assert_identical(emb.weight.grad, other.weight.grad)


def test_a_stream_holding_a_sparse_tensor_is_version_3_which_a_reader_of_2_refuses(tmp, monkeypatch):
    """Only a stream that holds a sparse tensor is written as version 3: a gmux that reads versions 1 and 2 reads
    any other, and refuses one it could not read by its version, not by a class its skeleton decoder never met."""
    assert open(_written(tmp), "rb").read()[8:10] == struct.pack("<H", 2)
    emb, head, opts, job = _sparse_job("sgd")
    _sparse_step(emb, head, opts, 0)
    path = os.path.join(tmp, "sparse.ckpt")
    job.checkpoint(path)
    assert open(path, "rb").read()[8:10] == struct.pack("<H", 3)
    monkeypatch.setattr(ckpt, "READS", (1, 2))
    _refused(path, "format version 3; this gmux reads versions 1, 2$")


def test_a_compressed_sparse_tensor_is_refused_by_name_and_nothing_written(tmp):
    """A checkpoint holds dense and sparse COO tensors: a CSR one (a graph's adjacency) is refused by its layout
    before a byte is written."""
    job, _ = _job()
    job.state["adjacency"] = torch.eye(3).to_sparse_csr()
    path = os.path.join(tmp, "job.ckpt")
    with pytest.raises(ckpt.CheckpointError, match="the job holds a sparse_csr tensor: checkpoints hold dense and "
                                                   "sparse COO tensors only"):
        job.checkpoint(path)
    assert os.listdir(tmp) == []


class _Graph(nn.Module):
    """A graph convolution over a fixed adjacency held as a sparse COO buffer, uncoalesced as it was built (an
    entry given twice: coalescing would sum it, and sparse.mm would round otherwise)."""
    def __init__(self):
        super().__init__()
        edges = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2, 2], [1, 2, 3, 4, 5, 0, 0, 2, 2]])
        self.register_buffer("adj", torch.sparse_coo_tensor(edges, torch.rand(9), (6, 6), check_invariants=True))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.sparse.mm(self.adj, self.lin(x))


def _graph_job(seed: int):
    torch.manual_seed(seed)
    model = _Graph()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, opt, gj.attach(model, opt)


def _graph_step(model, opt, step: int):
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(step))
    opt.zero_grad()
    model(x).pow(2).sum().backward()
    opt.step()


def test_a_sparse_buffer_is_checkpointed_as_it_is_and_the_job_trains_on_exactly(tmp):
    """A module whose buffer is a sparse COO tensor (a GCN's adjacency) could not be checkpointed at all: "Cannot
    access storage of SparseTensorImpl", from the check that every parameter is held, and then "parameter or
    buffer 'adj': a sparse tensor, the job has a tensor" at its restore; a move's look for unchanged tensors
    (holdings) failed alike."""
    from gmux.job.holdings import Unchanged
    model, opt, job = _graph_job(0)
    for step in range(3):
        _graph_step(model, opt, step)
    assert movability.problem(job) is None and Unchanged([model]).keys()
    path = os.path.join(tmp, "graph.ckpt")
    job.checkpoint(path)
    moved_model, moved_opt, moved = _graph_job(1)
    moved.restore(path)
    assert not moved_model.adj.is_coalesced() and moved_model.adj._nnz() == 9
    assert_identical(model.adj._indices(), moved_model.adj._indices(), "adjacency indices")
    assert_identical(model.adj._values(), moved_model.adj._values(), "adjacency values")
    for step in range(3, 6):
        _graph_step(model, opt, step)
        _graph_step(moved_model, moved_opt, step)
    assert_identical(model.lin.state_dict(), moved_model.lin.state_dict(), "model")
    assert_identical(opt.state_dict(), moved_opt.state_dict(), "optimizer")

    dense_model, _, dense = _graph_job(2)
    dense_model.adj = dense_model.adj.to_dense()
    before = copy.deepcopy(dense_model.state_dict())
    with pytest.raises(StateMismatch, match="parameter or buffer 'adj' is not sparse in this job, "
                                                "a sparse tensor in the checkpoint"):
        dense.restore(path)
    assert_identical(before, dense_model.state_dict(), "a refused restore's job")


def test_a_compressed_sparse_buffer_makes_the_job_unmovable_naming_it():
    """A CSR buffer made every move fail at its checkpoint while the job's reports said it was movable."""
    model, _, job = _graph_job(0)
    model.adj = model.adj.to_sparse_csr()
    assert movability.problem(job) == ("module 0's 'adj' is a sparse_csr tensor: checkpoints hold dense and sparse COO "
                                      "tensors only: a new process could not be given it, so the job stays where it "
                                      "is (suspend and resume still work); hold it as COO (.to_sparse()) or dense")


def test_numpy_numbers_in_state_are_kept_as_numbers():
    """state["best"] = np.mean(losses) is what scripts write; the checkpoint refused the NumPy scalar."""
    import numpy as np
    job, _ = _job()
    job.state.update(best=np.mean([1.0, 2.5]), count=np.int64(7), flag=np.bool_(True))
    buf = io.BytesIO()
    job.checkpoint(buf)
    job.state.clear()
    job.restore(io.BytesIO(buf.getvalue()))
    assert job.state["best"] == 1.75 and job.state["count"] == 7 and job.state["flag"] is True
    assert type(job.state["best"]) is float and type(job.state["count"]) is int
    job.state["lr"] = np.float32(0.1)      # computes unlike a Python float: refused, as before, by name
    with pytest.raises(ckpt.CheckpointError, match="float32"):
        job.checkpoint(io.BytesIO())


def test_a_flat_parameter_the_models_parameters_are_views_of_is_held_through_them(tmp):
    """apex/Megatron-style contiguous buffers: the optimizer steps one flat parameter; the model's parameters are
    views of it, so the model's state holds its values (and is restored into them)."""
    def build():
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        params = list(model.parameters())
        flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
        at = 0
        for p in params:
            p.data = flat.data[at:at + p.numel()].view_as(p)
            at += p.numel()
        opt = torch.optim.SGD([flat], lr=0.1, momentum=0.9)
        return model, flat, opt, gj.attach(model, opt)

    def step(model, flat, opt):
        opt.zero_grad()
        model(torch.randn(6, 4)).pow(2).mean().backward()
        flat.grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        opt.step()

    torch.manual_seed(0)
    model, flat, opt, job = build()
    step(model, flat, opt)
    path = os.path.join(tmp, "flat.ckpt")
    job.checkpoint(path)
    torch.manual_seed(5)
    model2, flat2, opt2, job2 = build()
    job2.restore(path)
    torch.manual_seed(9)
    step(model, flat, opt)
    torch.manual_seed(9)
    step(model2, flat2, opt2)
    assert torch.equal(flat, flat2)


def test_a_parameter_in_no_attached_module_is_refused_unless_in_extras(tmp):
    """A learned temperature outside every module: its optimizer state is in the checkpoint, its value was not,
    so a new process went on from its initial value. Now the checkpoint says so; in extras= it moves exactly."""
    for attach_it in (False, True):
        torch.manual_seed(0)
        model, scale = nn.Linear(4, 2), nn.Parameter(torch.ones(()))
        opt = torch.optim.Adam([*model.parameters(), scale], lr=0.1)
        job = gj.attach(model, opt, extras={"scale": scale} if attach_it else {})
        (model(torch.randn(8, 4)) * scale).sum().backward()
        opt.step()
        path = os.path.join(tmp, f"{attach_it}.ckpt")
        if not attach_it:
            with pytest.raises(gj.StateMismatch, match=r"optimizer 0's parameter 2 \(shape \(\)\) is in no attached"):
                job.checkpoint(path)
            assert not os.path.exists(path)
            continue
        job.checkpoint(path)
        torch.manual_seed(1)
        model2, scale2 = nn.Linear(4, 2), nn.Parameter(torch.ones(()))
        opt2 = torch.optim.Adam([*model2.parameters(), scale2], lr=0.1)
        gj.attach(model2, opt2, extras={"scale": scale2}).restore(path)
        assert torch.equal(scale2, scale) and scale2.item() != 1.0
        assert_identical(model.state_dict(), model2.state_dict(), "model")


def test_a_restore_refills_the_containers_the_script_holds():
    """`losses = []; attach(state={"losses": losses})` and the script appends to `losses`: after a restore it must
    go on from the restored list (it went on from its empty one, and its outputs lost the moved-from run's part)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    saved_by = gj.attach(model, torch.optim.SGD(model.parameters(), lr=0.1),
                         state={"losses": [0.5, 0.25], "metrics": {"best": 0.25, "seen": [1, 2]}, "step": 2,
                                "note": ("a", 1)})
    sink = io.BytesIO()
    saved_by.checkpoint(sink)
    losses, seen = [], []
    metrics = {"best": 9.0, "seen": seen}
    model = nn.Linear(4, 2)
    job = gj.attach(model, torch.optim.SGD(model.parameters(), lr=0.1),
                    state={"losses": losses, "metrics": metrics, "step": 0, "note": ()})
    job.restore(io.BytesIO(sink.getvalue()))
    assert losses == [0.5, 0.25] and job.state["losses"] is losses
    assert metrics == {"best": 0.25, "seen": [1, 2]} and job.state["metrics"] is metrics and metrics["seen"] is seen
    assert job.state["step"] == 2 and job.state["note"] == ("a", 1)


def test_a_replay_buffer_kept_as_a_deque_in_state_is_carried_into_the_deque_the_script_holds(tmp):
    """A DQN's replay buffer, deque(maxlen=N) of (state, action) transitions in state=: every checkpoint was refused
    ("a value of type collections.deque"), so the job could never move, though a restore can give it back exactly.
    Inside a dict too; the epoch-start copy job.epochs keeps of state= holds one (a deque with no tensor yet)."""
    def job_with(buffer, window):
        model = nn.Linear(4, 2)
        return gj.attach(model, torch.optim.SGD(model.parameters(), lr=0.1),
                         state={"buffer": buffer, "stats": {"window": window}})
    buffer, window = collections.deque(maxlen=3), collections.deque([0.5], maxlen=2)
    saved_by = job_with(buffer, window)
    for epoch in saved_by.epochs(1):
        for i in range(4):
            buffer.append((torch.full((2,), float(i)), i % 2))
        window.append(0.25)
        saved_by.checkpoint(f"{tmp}/a.ckpt")
    again, again_window = collections.deque(maxlen=3), collections.deque(maxlen=2)
    job = job_with(again, again_window)
    job.restore(f"{tmp}/a.ckpt")
    assert job.state["buffer"] is again and job.state["stats"]["window"] is again_window
    assert [a for _, a in again] == [1, 0, 1] and again.maxlen == 3
    assert_identical([t for t, _ in again], [t for t, _ in buffer], "buffer")
    assert list(again_window) == [0.5, 0.25]
    assert job.position.epoch_state["stats"]["window"] == collections.deque([0.5], 2)


def test_a_crafted_deque_in_state_stays_the_dict_the_file_holds():
    """A maxlen no deque takes (2**63) raised an OverflowError from the restore's last step, the weights already
    put back; more items than the maxlen were cut silently. Such a tag is no deque's (tagged_values.fits)."""
    from gmux.job import state_deques
    from gmux.job.tagged_values import DEQUE
    for crafted in ({DEQUE: 2 ** 63, "items": [1]}, {DEQUE: 1, "items": [1, 2, 3]}, {DEQUE: -1, "items": []}):
        assert state_deques.loaded({"buffer": crafted}) == {"buffer": crafted}


def test_a_numpy_array_in_state_is_refused_by_name():
    import numpy as np
    job, _ = _job()
    job.state["curve"] = np.arange(3.0)
    with pytest.raises(ckpt.CheckpointError, match=r"NumPy float64 array \(\[0\. 1\. 2\.\]\): store it as a tensor"):
        job.checkpoint(io.BytesIO())


class _Counting(nn.Module):
    """A layer keeping statistics of its own in buffers registered with persistent=False (not in state_dict())."""
    def __init__(self, stats=4):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("seen", torch.zeros((), dtype=torch.long), persistent=False)
        if stats:
            self.register_buffer("mean", torch.zeros(stats), persistent=False)
        self.register_buffer("unset", None, persistent=False)

    def forward(self, x):
        self.seen += x.shape[0]
        self.mean.mul_(0.9).add_(0.1 * x.detach().mean(0))
        return self.linear(x)


def test_buffers_outside_state_dict_come_back():
    """Before: a new process restored the weights and left `seen` and `mean` at zero, so its outputs drifted."""
    torch.manual_seed(0)
    model = nn.Sequential(_Counting(), nn.ReLU(), _Counting())
    job = gj.attach(model)
    for _ in range(3):
        model(torch.randn(5, 4))
    sink = io.BytesIO()
    job.checkpoint(sink)
    other_model = nn.Sequential(_Counting(), nn.ReLU(), _Counting())
    gj.attach(other_model).restore(io.BytesIO(sink.getvalue()))
    for name in ("0.seen", "0.mean", "2.seen", "2.mean"):
        assert torch.equal(model.get_buffer(name), other_model.get_buffer(name)), name
    assert int(other_model[0].seen) == 15 and other_model[0].unset is None
    # One the job does not have, or of another shape, is refused naming it, and nothing changes.
    for wrong, problem in ((nn.Sequential(_Counting(), nn.ReLU(), _Counting(None)), r"module 0 buffers not in "
                            r"state_dict: \['0.mean', '0.seen', '2.mean', '2.seen'\], the job has \['0.mean', "),
                           (nn.Sequential(_Counting(), nn.ReLU(), _Counting(2)),
                            r"module 0 buffer '2.mean': shape \(4,\), the job has \(2,\)")):
        before = [t.clone() for t in wrong.buffers()]
        with pytest.raises(ckpt.CheckpointError, match=problem):
            gj.attach(wrong).restore(io.BytesIO(sink.getvalue()))
        assert all(torch.equal(a, b) for a, b in zip(before, wrong.buffers()))


SCHEDULERS = {
    "own (timm-style)": OwnCosine,
    "MultiStepLR": lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [3, 6, 6]),     # milestones: a Counter
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, 3),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 0.5, total_steps=40),
    "CyclicLR": lambda o: torch.optim.lr_scheduler.CyclicLR(o, 0.01, 0.1, step_size_up=3),
    "CosineAnnealingWarmRestarts": lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, 4),
    "SequentialLR": lambda o: torch.optim.lr_scheduler.SequentialLR(
        o, [torch.optim.lr_scheduler.LinearLR(o), torch.optim.lr_scheduler.MultiStepLR(o, [2, 4])], [5]),
    "ChainedScheduler": lambda o: torch.optim.lr_scheduler.ChainedScheduler(
        [torch.optim.lr_scheduler.ExponentialLR(o, 0.9), torch.optim.lr_scheduler.MultiStepLR(o, [4])]),
    "ReduceLROnPlateau": lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=1),
}


def _run_and_restored(build, steps, n, tmp, check=lambda *objects: True):
    """A run of 2n steps checkpointed after n, and a fresh build restored from that checkpoint (`check`ed) that
    runs the last n: both runs' (model, optimizer, scheduler), to compare."""
    model, opt, sched, job = build()
    steps(model, opt, sched, n)
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    steps(model, opt, sched, n)
    moved_model, moved_opt, moved_sched, moved = build()
    moved.restore(path)
    assert check(moved_model, moved_opt, moved_sched)
    steps(moved_model, moved_opt, moved_sched, n)
    return (model, opt, sched), (moved_model, moved_opt, moved_sched)


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_kind_of_lr_scheduler_is_checkpointed_and_restored_exactly(name, tmp):
    """An outside tester's MultiStepLR job could not be checkpointed (its milestones are a Counter), and the
    refusal blamed the script's state=. Restored into a fresh job, the rest of the run is the uninterrupted one's."""
    x = torch.randn(16, 4)

    def build():
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = SCHEDULERS[name](opt)
        return model, opt, sched, gj.attach(model, opt, sched)

    def steps(model, opt, sched, n):
        for _ in range(n):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            sched.step(*([1.0] if name == "ReduceLROnPlateau" else []))     # (a plateau: the LR falls)

    (model, opt, sched), (moved_model, moved_opt, moved_sched) = _run_and_restored(build, steps, 7, tmp)
    assert_identical(model.state_dict(), moved_model.state_dict(), "model")
    assert_identical(opt.state_dict(), moved_opt.state_dict(), "optimizer")
    assert repr(sched.state_dict()) == repr(moved_sched.state_dict())


class _Sam(torch.optim.Optimizer):
    """SAM as published (davda54/sam): its base optimizer's state (momentum, Adam's moments) is in the base's
    own `state`, which the state_dict() it keeps from torch leaves out; the two share their parameter groups."""
    def __init__(self, params, base, relink, **kwargs):
        super().__init__(params, dict(rho=0.05, **kwargs))
        self.base_optimizer = base(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.relink = relink

    @torch.no_grad()
    def first_step(self):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["old_p"] = p.data.clone()
                p.add_(p.grad * group["rho"])
        self.zero_grad()

    @torch.no_grad()
    def second_step(self):
        for group in self.param_groups:
            for p in group["params"]:
                p.data = self.state[p]["old_p"]
        self.base_optimizer.step()
        self.zero_grad()

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        if self.relink:
            self.base_optimizer.param_groups = self.param_groups


@pytest.mark.parametrize("base,relink", [(torch.optim.SGD, True), (torch.optim.Adam, False)])
def test_an_optimizer_a_wrapper_holds_is_checkpointed_and_shares_its_groups_again(base, relink, tmp):
    """SAM attached: a move restored SAM's own state and left its base optimizer's momentum (or moments) at zero,
    while the job said it was movable; the run ended with other weights. The base's state is kept with SAM's now,
    and after a restore the two share their parameter groups again, which the scheduler driving SAM sets."""
    x = torch.randn(16, 4)
    kw = {"lr": 0.05, "momentum": 0.9} if base is torch.optim.SGD else {"lr": 0.01}

    def build():
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = _Sam(model.parameters(), base, relink, **kw)
        sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)
        return model, opt, sched, gj.attach(model, opt, sched)

    def steps(model, opt, sched, n):
        for _ in range(n):
            model(x).pow(2).mean().backward()
            opt.first_step()
            model(x).pow(2).mean().backward()
            opt.second_step()
            sched.step()

    (model, opt, sched), (moved_model, moved_opt, moved_sched) = _run_and_restored(
        build, steps, 5, tmp, check=lambda model, opt, sched: opt.base_optimizer.param_groups is opt.param_groups)
    assert_identical(model.state_dict(), moved_model.state_dict(), "model")
    assert_identical(opt.base_optimizer.state_dict(), moved_opt.base_optimizer.state_dict(), "base optimizer")


def test_parameters_unfrozen_since_the_model_was_built_stay_unfrozen_after_a_restore(tmp):
    """Fine-tuning that unfreezes its backbone once (`if epoch == 1: requires_grad_(True)`): a move in a later epoch
    restored the weights into a new process's model built frozen, which never unfroze it again and trained on
    without the backbone, ending "finished" with other weights. Which parameters require gradients is restored."""
    x = torch.randn(16, 4)

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        model[0].requires_grad_(False)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        return model, opt, gj.attach(model, opt)

    def steps(model, opt, n):
        for _ in range(n):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()

    model, opt, job = build()
    steps(model, opt, 2)
    model[0].requires_grad_(True)
    model[2].bias.requires_grad_(False)
    steps(model, opt, 2)
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    steps(model, opt, 3)
    moved_model, moved_opt, moved = build()
    moved.restore(path)
    steps(moved_model, moved_opt, 3)
    assert [p.requires_grad for p in moved_model.parameters()] == [True, True, True, False]
    assert_identical(model.state_dict(), moved_model.state_dict(), "model")
    assert_identical(opt.state_dict(), moved_opt.state_dict(), "optimizer")


def _scored(classes=3):
    """A classifier holding torchmetrics Metrics of each kind of state: tensors summed (MeanMetric), a list of
    tensors (CatMetric), and a MetricCollection whose compute groups share their states."""
    tm = pytest.importorskip("torchmetrics")

    class Scored(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 3)
            self.loss_mean = tm.MeanMetric()
            self.seen = tm.CatMetric()
            self.scores = tm.MetricCollection([tm.classification.MulticlassPrecision(classes),
                                               tm.classification.MulticlassRecall(classes)])
    return Scored()


def test_torchmetrics_counts_inside_the_model_are_checkpointed_and_restored_exactly(tmp):
    """A Metric's counts are attributes its state_dict() leaves out: a run restored mid-epoch computed its
    epoch's accuracy (and mean loss) over the batches after the restore only, and whatever monitored them (a
    ReduceLROnPlateau, early stopping) decided otherwise than the run unmoved."""
    x, y = torch.randn(16, 4), torch.arange(16) % 3

    def build():
        torch.manual_seed(0)
        model = _scored()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return model, opt, None, gj.attach(model, opt)

    def steps(model, opt, sched, n):
        for _ in range(n):
            opt.zero_grad()
            logits = model.net(x)
            loss = nn.functional.cross_entropy(logits, y)
            loss.backward()
            opt.step()
            model.loss_mean.update(loss.detach())
            model.seen.update(logits.argmax(1))
            model.scores.update(logits.detach(), y)

    (model, _, _), (moved_model, _, _) = _run_and_restored(build, steps, 4, tmp)
    computed = {"loss_mean": model.loss_mean.compute(), "seen": model.seen.compute(), **model.scores.compute()}
    moved = {"loss_mean": moved_model.loss_mean.compute(), "seen": moved_model.seen.compute(),
             **moved_model.scores.compute()}
    assert computed["seen"].shape == (8 * 16,)
    assert_identical(computed, moved, "metrics")
    assert moved_model.loss_mean.update_count == model.loss_mean.update_count == 8


def test_a_checkpoint_whose_metrics_do_not_fit_is_refused_by_name_and_nothing_changes(tmp):
    model = _scored()
    model.loss_mean.update(torch.tensor(2.0))
    job = gj.attach(model)
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    other = _scored(classes=4)
    other.loss_mean.update(torch.tensor(5.0))
    with pytest.raises(ckpt.CheckpointError, match=r"module 0 metric 'scores.MulticlassPrecision' state 'tp': "
                                                    r"shape \(3,\), the job has \(4,\)"):
        gj.attach(other).restore(path)
    assert other.loss_mean.compute().item() == 5.0 and other.loss_mean.update_count == 1
    fewer = _scored()
    del fewer.seen
    with pytest.raises(gj.StateMismatch, match=r"module 0 metrics: .*'seen'\], the job has \['loss_mean', "
                                               r"'scores.MulticlassPrecision', 'scores.MulticlassRecall'\]"):
        gj.attach(fewer).restore(path)


class _Annealed(nn.Module):
    """A module of the script's own keeping Python values: a count of its forward calls that anneals its
    temperature, and the losses it was told of (tensors in a list), none in its state_dict()."""
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.calls, self.losses, self.seen = 0, [], {"last": None}

    def forward(self, x):
        self.calls += 1
        self.seen["last"] = self.calls
        return self.linear(x) / (1.0 + 0.1 * self.calls)


def test_the_plain_attributes_of_the_scripts_modules_are_checkpointed_and_restored_exactly(tmp):
    """A new process built the module with its count at 0 and an empty list: it annealed from the start again
    and averaged the losses since the restore only, while the job said it was movable."""
    x = torch.randn(16, 4)

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(_Annealed(), nn.ReLU())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return model, opt, None, gj.attach(model, opt)

    def steps(model, opt, sched, n):
        for _ in range(n):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            model[0].losses.append(loss.detach())

    losses_held = []
    (model, _, _), (moved_model, _, _) = _run_and_restored(
        build, steps, 4, tmp, check=lambda model, opt, sched: losses_held.append(model[0].losses) or True)
    assert_identical(model.state_dict(), moved_model.state_dict(), "model")
    assert (moved_model[0].calls, moved_model[0].seen) == (8, {"last": 8})
    assert_identical(torch.stack(model[0].losses), torch.stack(moved_model[0].losses), "losses")
    assert losses_held[0] is moved_model[0].losses         # (filled in place: the script may hold the list)


def test_a_checkpoint_whose_module_attributes_do_not_fit_is_refused_and_nothing_changes(tmp):
    model = nn.Sequential(_Annealed())
    job = gj.attach(model)
    model(torch.randn(2, 4))
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    saved = ckpt.load(path)
    for bad, problem in (({"calls": "1"}, r"module 0 attributes of '0': 'calls' is '1', not plain data"),
                         ({"forward": 1}, r"'forward' is '1'"), ({"__class__": None}, r"'__class__' is 'None'"),
                         ({"losses": [object]}, r"'losses' is")):
        forged = os.path.join(tmp, "forged.ckpt")
        ckpt.save({**saved, "attributes": [{"0": {**saved["attributes"][0]["0"], **bad}}]}, forged) \
            if bad != {"losses": [object]} else None
        other = nn.Sequential(_Annealed())
        if bad == {"losses": [object]}:     # (not storable: forged in the skeleton the check reads)
            fit = gmux_restore_check.Fit(gj.attach(other), "forged")
            with pytest.raises(gj.CheckpointError, match=problem):
                gmux_module_attributes.check(fit, [{"0": {"losses": [object]}}], [other])
            continue
        with pytest.raises(gj.CheckpointError, match=problem):
            gj.attach(other).restore(forged)
        assert other[0].calls == 0 and other[0].seen == {"last": None} and other[0].losses == []


def test_a_module_attribute_that_changed_its_kind_keeps_the_job_where_it_is(tmp):
    """A count the script turned into a string (`self.calls = "done"`): the reports said movable, the move's new
    process built the module with a count, and its restore refused the string: the move ended there. Now the
    move is refused in the job, naming it, and the job runs on; back to a count, it moves."""
    from gmux.job.job import JobExit
    model = nn.Sequential(_Annealed())
    job = gj.attach(model)
    model[0].calls = "done"
    move = job.controller.send("migrate", path=os.path.join(tmp, "m.ckpt"))
    job.boundary()
    reply = job.controller.result(move, timeout=5)
    assert not reply["ok"] and "'calls' was a number at the start and is a str now" in reply["error"]
    assert not os.path.exists(os.path.join(tmp, "m.ckpt"))
    model[0].calls = 3
    job.controller.send("migrate", path=os.path.join(tmp, "m.ckpt"))
    with pytest.raises(JobExit):
        job.boundary()
    other = nn.Sequential(_Annealed())
    gj.attach(other).restore(os.path.join(tmp, "m.ckpt"))
    assert other[0].calls == 3


def test_a_module_left_out_whole_may_move_though_an_attribute_changed_its_kind(tmp):
    """A module whose other attribute became what a checkpoint does not carry (a file opened behind a flag) is left
    to the new process whole, as before gmux carried any: its restore looks at none of its attributes, so a count
    become a string beside it is no reason to refuse the move (it was refused, naming the string)."""
    from gmux.job.job import JobExit
    model = nn.Sequential(_Annealed())
    job = gj.attach(model)
    model[0].calls, model[0].log = "done", open(os.devnull, "w")
    assert gmux_module_attributes.capture(model) == {}      # (left to the new process whole)
    job.controller.send("migrate", path=os.path.join(tmp, "m.ckpt"))
    with pytest.raises(JobExit):
        job.boundary()
    model[0].log.close()
    other = nn.Sequential(_Annealed())
    gj.attach(other).restore(os.path.join(tmp, "m.ckpt"))
    assert other[0].calls == 0


def test_a_metric_made_persistent_restores_its_list_states_into_a_fresh_job(tmp):
    """metric.persistent(True) puts a CatMetric's list of the epoch's batches in state_dict() too: a new process's
    list is empty, and the restore was refused ("'seen.value': 4 items, the job has 0"), the move with it."""
    tm = pytest.importorskip("torchmetrics")

    def build():
        model = nn.Module()
        model.seen, model.mean = tm.CatMetric(), tm.MeanMetric()
        model.seen.persistent(True)
        model.mean.persistent(True)
        return model, gj.attach(model)

    model, job = build()
    for i in range(4):
        model.seen.update(torch.full((2,), float(i)))
        model.mean.update(torch.tensor(float(i)))
    sink = io.BytesIO()
    job.checkpoint(sink)
    model.seen.update(torch.ones(2))
    model.mean.update(torch.tensor(9.0))
    for fresh in (False, True):
        moved, moved_job = build()
        moved_job.restore(sink.getvalue(), fresh=fresh)
        moved.seen.update(torch.ones(2))
        moved.mean.update(torch.tensor(9.0))
        assert_identical([model.seen.compute(), model.mean.compute()], [moved.seen.compute(), moved.mean.compute()],
                         "metrics")
        assert moved.mean.update_count == model.mean.update_count


def test_a_crafted_metrics_section_is_refused_naming_its_field_and_nothing_changes(tmp):
    tm = pytest.importorskip("torchmetrics")

    def build():
        model = nn.Module()
        model.seen, model.mean = tm.CatMetric(), tm.MeanMetric()
        return model

    model = build()
    model.seen.update(torch.ones(3))
    model.mean.update(torch.tensor(2.0))
    job = gj.attach(model)
    crafts = {"a list of 1048577 items, more than the 1048576 a list state may hold":
              lambda e: e["seen"]["states"].__setitem__("value", [0] * ((1 << 20) + 1)),
              "-1, which is negative": lambda e: e["mean"].__setitem__("count", -1),
              "a float, the job has an int": lambda e: e["mean"].__setitem__("count", 2.0)}
    for problem, craft in crafts.items():
        snap = job.snapshot()
        snap["metrics"] = [{k: {"states": dict(e["states"]), "count": e["count"]}
                            for k, e in snap["metrics"][0].items()}]
        craft(snap["metrics"][0])
        path = os.path.join(tmp, "crafted.ckpt")
        ckpt.save(snap, path)
        other = build()
        other.mean.update(torch.tensor(5.0))
        with pytest.raises(ckpt.CheckpointError, match=r"module 0 metric '(seen' state 'value|mean' 'count)': "
                                                        + problem.replace("(", r"\(").replace(")", r"\)")):
            gj.attach(other).restore(path)
        assert other.mean.compute().item() == 5.0 and other.mean.update_count == 1 and other.seen.value == []


def test_a_min_max_metrics_extremes_so_far_are_restored(tmp):
    """MinMaxMetric keeps the best and worst of its computes as plain tensor attributes (no add_state state): a
    run restored after some epochs reported a best and worst over the epochs after the restore only."""
    tm = pytest.importorskip("torchmetrics")
    torch.manual_seed(0)
    batches = [(torch.randn(8, 3).softmax(1), torch.randint(0, 3, (8,))) for _ in range(6)]

    def build():
        model = nn.Module()
        model.acc = tm.wrappers.MinMaxMetric(tm.classification.MulticlassAccuracy(3))
        return model, gj.attach(model)

    def epochs(model, which):
        for x, y in (batches[i] for i in which):
            model.acc.update(x, y)
            result = model.acc.compute()
            model.acc.reset()
        return result

    model, job = build()
    epochs(model, range(3))
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    expected = epochs(model, range(3, 6))
    moved, moved_job = build()
    moved_job.restore(path)
    assert_identical(expected, epochs(moved, range(3, 6)), "MinMaxMetric")


def test_a_large_attribute_built_once_leaves_the_others_carried(tmp):
    """Plain attributes are bounded each on its own: a vocabulary built in __init__ (over the bound, left to the
    new process, which builds it alike) no longer used up the bound of the count after it, which was then lost."""
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2)
            self.vocabulary = [f"word{i}" for i in range(10_000)]
            self.calls = 0

    model = Counting()
    job = gj.attach(model)
    model.calls = 7
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    assert ckpt.load(path)["attributes"] == [{"": {"calls": 7}}]
    other = Counting()
    gj.attach(other).restore(path)
    assert other.calls == 7 and len(other.vocabulary) == 10_000


def test_module_attributes_are_carried_only_where_they_changed_and_only_with_all_that_changed(tmp, monkeypatch):
    """What the script set from its own process (a device name from LOCAL_RANK) is left to the new process; a
    count that sizes a cache made again beside it (an object of its own, not plain data) is not carried without the
    cache (a grown cache's length with the new process's short cache would index past it): the module keeps what
    the new process builds. (A cache that is a tensor is carried with its count: test_a_tensor_attribute_...)"""
    class Table:
        def __init__(self, length):
            self.values = torch.arange(float(length))

    class Rotary(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)
            self.device_name = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
            self.cached_len, self.cache = 4, Table(4)

        def forward(self, x, length):
            if length > self.cached_len:
                self.cached_len, self.cache = length, Table(length)
            return self.linear(x) + self.cache.values[:4]

    monkeypatch.setenv("LOCAL_RANK", "0")
    model = Rotary()
    job = gj.attach(model)
    model(torch.randn(2, 4), 9)
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    assert ckpt.load(path)["attributes"] == [{}]
    monkeypatch.setenv("LOCAL_RANK", "1")
    other = Rotary()
    gj.attach(other).restore(path)
    assert (other.device_name, other.cached_len, other.cache.values.shape) == ("cuda:1", 4, (4,))


def test_an_object_made_again_at_its_predecessors_address_is_seen_made_again():
    """An id is reused once its object is freed: a cache made again at the address of the one it replaced was taken
    for unchanged, and the length that sized it was carried without it (a new process's short cache indexed with
    the grown length)."""
    class Table:
        pass

    class Cached(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2)
            self.length, self.cache = 4, Table()

    model = Cached()
    gmux_module_attributes.remember(model)
    then = id(model.cache)
    model.cache = None
    model.cache, model.length = Table(), 9      # (freed first: CPython gives the new one the old one's memory)
    if id(model.cache) != then:
        pytest.skip("the new Table did not take its predecessor's address")
    assert gmux_module_attributes.capture(model) == {}


def test_a_tensor_attribute_made_anew_is_carried_with_the_rest_and_one_in_a_graph_is_not(tmp):
    """A running statistic the forward makes anew as a tensor (`self.scale = 0.9 * self.scale + ...`) was left to
    the new process, which started it again: it is carried, with the count beside it, to the module's device, or
    its host. An activation kept for a hook (in the step's graph, made again by the next forward) leaves the module
    to the new process, as before."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)
            self.scale, self.calls, self.last = torch.tensor(1.0), 0, None

        def forward(self, x, keep=False):
            self.scale = 0.9 * self.scale + 0.1 * x.detach().abs().mean()
            self.calls += 1
            out = self.linear(x / self.scale)
            self.last = out if keep else None
            return out

    model = Scaled()
    job = gj.attach(model)
    x = torch.randn(2, 4)
    model(x)
    model(x)
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    other = Scaled()
    gj.attach(other).restore(path)
    assert other.calls == 2 and other.scale.item() == model.scale.item() != 1.0
    assert_identical(other(x), model(x))
    model(x, keep=True)
    job.checkpoint(path)
    assert ckpt.load(path)["attributes"] == [{}]


def test_looking_at_a_subclass_of_a_library_module_draws_no_random_numbers():
    """Which attributes a library base sets is learnt by building it once per class: nn.Transformer() drew its 44M
    initial weights from the generator, at the first checkpoint of each process, so a move's new process drew
    what the unmoved run did not and went on another way."""
    class Translator(nn.Transformer):
        def __init__(self):
            super().__init__(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=8)
            self.calls = 3

    model = Translator()
    torch.manual_seed(0)
    before = torch.get_rng_state()
    gmux_module_attributes.remember(model)
    model.calls = 4
    assert gmux_module_attributes.capture(model) == {"": {"calls": 4}}    # (its base's d_model, nhead: not ours)
    assert torch.equal(torch.get_rng_state(), before)


def test_an_attribute_holding_tensors_a_checkpoint_cannot_hold_is_left_to_the_new_process(tmp):
    """A list of uint16 token ids or of nested tensors among a module's attributes failed every checkpoint of the
    job (tensors of dtype torch.uint16 are not supported), which had checkpointed before attributes were kept."""
    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2)
            self.ids, self.ragged, self.calls = [], [], 0

    model = Tokens()
    job = gj.attach(model)
    model.ids.append(torch.zeros(4, dtype=torch.uint16))
    model.ragged.append(torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]))
    model.calls = 5
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    other = Tokens()
    gj.attach(other).restore(path)
    # (the module is left whole to the new process: a count without the lists it counted would not be the module)
    assert other.calls == 0 and other.ids == [] and other.ragged == []


def test_an_attribute_holding_a_buffer_of_the_module_still_holds_it_after_a_restore(tmp):
    """`self.stats = [self.running]`: the list was filled with a copy of the buffer read from the checkpoint, and
    the module went on reading a value that the buffer's updates no longer reached."""
    class Running(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2)
            self.register_buffer("running", torch.zeros(2))
            self.stats, self.calls = [self.running], 0

        def forward(self, x):
            self.calls += 1
            self.running.add_(x.detach().mean(0))
            return self.linear(x) * self.stats[0]

    x = torch.randn(4, 2)
    model = Running()
    job = gj.attach(model)
    model(x)
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    other = Running()
    gj.attach(other).restore(path)
    assert other.stats[0] is other.running and other.calls == 1
    assert_identical(model(x), other(x), "output")


class _Collecting(nn.Module):
    """Keeps its steps' predictions on the host for a NumPy metric at the epoch's end, and a count."""
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.preds, self.calls = [], 0


def test_tensors_the_script_kept_on_the_host_stay_there_after_a_restore():
    """`self.preds.append(p.cpu())`: a restore moved them to the module's device, and the epoch's end mixed them
    with the host ones appended after it (torch.cat across devices, .numpy() of a CUDA tensor raised)."""
    model = _Collecting()
    gmux_module_attributes.remember(model)
    model.preds.append(torch.ones(2))
    model.calls = 1
    saved = gmux_module_attributes.capture(model)
    with torch.device("meta"):          # (a module on another device than the host)
        other = _Collecting()
    gmux_module_attributes.apply(other, saved)
    assert other.preds[0].device.type == "cpu" and other.calls == 1


def test_a_crafted_list_of_host_attributes_is_refused_and_nothing_changes(tmp):
    model = _Collecting()
    job = gj.attach(model)
    model.preds.append(torch.ones(2))
    model.calls = 1
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    saved = ckpt.load(path)
    for host, problem in ((["nope"], r"\['nope'\]"), ("preds", r"'preds'"), ([3], r"\[3\]")):
        forged = os.path.join(tmp, "forged.ckpt")
        ckpt.save({**saved, "attributes": [{"": {**saved["attributes"][0][""], "__gmux_host__": host}}]}, forged)
        other = _Collecting()
        with pytest.raises(gj.CheckpointError, match=r"module 0 attributes of 'the module': '__gmux_host__' is "
                                                     + problem + ", not names of its attributes"):
            gj.attach(other).restore(forged)
        assert other.preds == [] and other.calls == 0


def test_a_crafted_numpy_value_or_deque_among_module_attributes_is_refused_and_nothing_changes(tmp):
    """A NumPy value's data is a TensorRef when the layout is checked: a "scalar" of three values was put back as
    an array, and one of bfloat16, or a deque's maxlen of 2**63, failed the restore (a TypeError, an
    OverflowError) once the weights were loaded."""
    import collections
    import numpy as np
    model = _Collecting()
    job = gj.attach(model)
    model.calls, model.best, model.window = 1, np.float64(0.5), collections.deque([1.0], maxlen=3)
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    saved = ckpt.load(path)
    for bad in ({"best": {"__gmux_numpy__": "scalar", "data": torch.zeros(3, dtype=torch.float64)}},
                {"best": {"__gmux_numpy__": "scalar", "data": torch.zeros((), dtype=torch.bfloat16)}},
                {"window": {"__gmux_deque__": 2 ** 63, "items": [1.0]}}):
        forged = os.path.join(tmp, "forged.ckpt")
        ckpt.save({**saved, "attributes": [{"": {**saved["attributes"][0][""], **bad}}]}, forged)
        other = _Collecting()
        other.best, other.window = np.float64(np.inf), collections.deque(maxlen=3)
        with torch.no_grad():
            other.linear.weight.fill_(7.0)
        with pytest.raises(gj.CheckpointError, match=f"module 0 attributes of 'the module': '{next(iter(bad))}'"):
            gj.attach(other).restore(forged)
        assert other.calls == 0 and other.best == np.inf and not other.window and (other.linear.weight == 7).all()


def test_an_epoch_of_many_steps_outputs_is_carried(tmp):
    """The bound on an attribute's items was 4,096: a LightningModule's list of (loss, accuracy) over a longer
    epoch was silently left out, and the moved run's epoch average counted the steps after the move only."""
    model = _Collecting()
    job = gj.attach(model)
    model.preds.extend((torch.tensor(float(i)), torch.tensor(i % 3)) for i in range(10_000))
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    other = _Collecting()
    gj.attach(other).restore(path)
    assert len(other.preds) == 10_000 and other.preds[-1][0].item() == 9999.0


def test_restored_attribute_tensors_go_to_their_own_submodules_device():
    """A model split over devices: every restored tensor went to the device of the whole model's first parameter."""
    class Split(nn.Module):
        def __init__(self):
            super().__init__()
            with torch.device("meta"):      # (another device than the host's)
                self.first = _Collecting()
            self.second = _Collecting()

    other = Split()
    gmux_module_attributes.apply(other, {"second": {"preds": [torch.ones(2)]}})     # (a GPU's, in a checkpoint)
    assert other.second.preds[0].device.type == "cpu"


def test_a_module_of_the_scripts_own_that_torch_parametrized_is_still_its_own(tmp):
    """torch.nn.utils.parametrize swaps the module's class for one of torch's making over the script's class: its
    attributes were taken for a library's and silently left out."""
    from torch.nn.utils import parametrize

    class Unit(nn.Module):
        def forward(self, w):
            return w / w.norm()

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))
            self.calls = 0

    def build():
        model = Scaled()
        parametrize.register_parametrization(model, "weight", Unit())
        return model

    model = build()
    assert type(model).__module__.startswith("torch.")
    job = gj.attach(model)
    model.calls = 3
    path = os.path.join(tmp, "job.ckpt")
    job.checkpoint(path)
    other = build()
    gj.attach(other).restore(path)
    assert other.calls == 3
