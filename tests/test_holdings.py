"""Incremental moves (gmux.job.holdings): a move's new process offers digests of the tensors it holds, the
source leaves out of its stream those whose bytes it holds, and the restore takes them from the target's own
tensors. Whatever the source changed, by any means, is sent; whatever the target holds otherwise is not used;
and a stream with held rows restores nowhere else."""
import io
import os
import threading

import msgpack
import pytest
import torch
from torch import nn

import gmux.job as gj
from ckpt_forge import join, split
from gmux import protocol
from gmux.job import checkpoint as ckpt, holdings
from gmux.wire.receiver import Receiver
from gmux_testkit import assert_identical


def _build(frozen_seed=0, swap=False):
    """A frozen table and a constant buffer (settled: offered), under a trained body of 64 KiB weights."""
    torch.manual_seed(frozen_seed)
    tables = [nn.Embedding(1024, 32), nn.Embedding(1024, 32)]
    if swap:
        tables.reverse()
    torch.manual_seed(1)
    body = nn.Sequential(nn.Linear(32, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Linear(512, 1))
    model = nn.ModuleDict({"a": tables[0], "b": tables[1], "body": body})
    model.register_buffer("basis", torch.arange(32 * 512, dtype=torch.float32).reshape(32, 512))
    for t in tables:
        t.weight.requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return model, opt


def _step(model, opt, i):
    g = torch.Generator().manual_seed(i)
    rows = torch.randint(0, 1024, (16,), generator=g)
    x = model["a"](rows) + model["b"](rows) + torch.randn(16, 32, generator=g) @ model.basis[:, :32]
    loss = model["body"](x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def _trained(steps=3, **kw):
    model, opt = _build(**kw)
    job = gj.attach(model, opt)
    for i in range(steps):
        _step(model, opt, i)
    return job


def _values(job):
    return [t.detach().clone() for t in job.tracked.tensors()]


def _streamed(job, holds: bytes, tmp_path) -> bytes:
    """The job's checkpoint as a move streams it: into a pipe (the size announced first, then the stream)."""
    path = str(tmp_path / "stream")
    if os.path.exists(path):
        os.unlink(path)
    os.mkfifo(path)
    out = []
    reader = threading.Thread(target=lambda: out.append(open(path, "rb").read()))
    reader.start()
    job.checkpoint(path, holds)
    reader.join()
    return out[0][8:]


def _held_rows(data: bytes) -> list:
    return msgpack.unpackb(split(data)[0][1]).get("held", [])


def test_a_move_leaves_out_what_the_target_holds_and_runs_on_bit_identical(tmp_path):
    src = _trained()
    dst_model, dst_opt = _build()
    dst = gj.attach(dst_model, dst_opt)
    offer = holdings.Offer.of(dst.tracked.modules)
    assert len(offer.by_digest) == 3                 # both tables and the buffer; nothing under MIN_BYTES
    data = _streamed(src, offer.wire(), tmp_path)
    whole = _streamed(src, b"", tmp_path)
    assert len(_held_rows(data)) == 3 and _held_rows(whole) == []
    assert len(whole) - len(data) > (2 * 128 + 64 - 1) << 10     # (their rows in HEAD: a few bytes each)
    dst.restore(io.BytesIO(data), fresh=True, offer=offer)
    assert_identical(_values(src), _values(dst))
    for i in range(3, 6):
        _step(src.tracked.modules[0], src.tracked.optimizers[0], i)
        _step(dst_model, dst_opt, i)
    assert_identical(_values(src), _values(dst))
    # restored, the target is a source whose settled tensors are unchanged again: a next move leaves them out
    assert len(_held_rows(_streamed(dst, offer.wire(), tmp_path))) == 3


def test_only_tensors_whose_version_did_not_move_are_hashed(tmp_path, monkeypatch):
    src = _trained()
    offer = holdings.Offer.of(_build()[0].modules())
    hashed = []
    digests = holdings.digests
    monkeypatch.setattr(holdings, "digests", lambda ts: hashed.extend(t.shape for t in ts) or digests(ts))
    _streamed(src, offer.wire(), tmp_path)
    # the trained weights are as large, but every step moved them: the tables and the buffer only
    assert sorted(hashed) == sorted([torch.Size([1024, 32])] * 2 + [torch.Size([32, 512])])


def test_what_the_source_changed_is_sent_however_it_changed_it(tmp_path):
    src = _trained()
    model = src.tracked.modules[0]
    model["a"].weight.numpy()[7] += 1.0              # behind its version counter: hashed, found different
    model.basis.mul_(2.0)                            # an in-place op: not even hashed
    dst_model, dst_opt = _build()
    dst = gj.attach(dst_model, dst_opt)
    offer = holdings.Offer.of(dst.tracked.modules)
    data = _streamed(src, offer.wire(), tmp_path)
    assert len(_held_rows(data)) == 1                # table b only
    dst.restore(io.BytesIO(data), fresh=True, offer=offer)
    assert_identical(_values(src), _values(dst))


def test_a_target_built_otherwise_is_sent_everything(tmp_path):
    src = _trained()
    dst_model, dst_opt = _build(frozen_seed=5)
    dst = gj.attach(dst_model, dst_opt)
    offer = holdings.Offer.of(dst.tracked.modules)
    data = _streamed(src, offer.wire(), tmp_path)
    assert len(_held_rows(data)) == 1                # only the buffer, which no seed changes
    dst.restore(io.BytesIO(data), fresh=True, offer=offer)
    assert_identical(_values(src), _values(dst))


def test_bytes_the_target_holds_in_other_places_are_taken_before_any_is_overwritten(tmp_path):
    # The target built its two tables the other way round: each row's bytes are in the other row's tensor,
    # which a fresh restore reads into.
    src = _trained()
    dst_model, dst_opt = _build(swap=True)
    dst = gj.attach(dst_model, dst_opt)
    offer = holdings.Offer.of(dst.tracked.modules)
    data = _streamed(src, offer.wire(), tmp_path)
    assert len(_held_rows(data)) == 3
    dst.restore(io.BytesIO(data), fresh=True, offer=offer)
    assert_identical(_values(src), _values(dst))


def test_a_stream_with_held_rows_restores_nowhere_else(tmp_path):
    src = _trained()
    offer = holdings.Offer.of(_build()[0].modules())
    data = _streamed(src, offer.wire(), tmp_path)
    with pytest.raises(gj.CheckpointError, match="can only be restored there"):
        _trained(steps=0).restore(io.BytesIO(data))
    other = holdings.Offer.of(_build(frozen_seed=5)[0].modules())
    with pytest.raises(gj.CheckpointError, match="holds none with digest"):
        ckpt.read(io.BytesIO(data), "(test)", holds=other.find)
    with pytest.raises(gj.CheckpointError, match="bytes, the tensor this process holds"):
        ckpt.read(io.BytesIO(data), "(test)", holds=lambda d: torch.zeros(3))


def test_a_checkpoint_file_never_leaves_anything_out(tmp_path):
    src = _trained()
    offer = holdings.Offer.of(_build()[0].modules())
    src.checkpoint(str(tmp_path / "file.ckpt"), offer.wire())
    dst = _trained(steps=0)
    dst.restore(str(tmp_path / "file.ckpt"))
    assert_identical(_values(src), _values(dst))


def test_bad_held_rows_in_the_head_are_refused():
    snap = {"t": torch.ones(3), "u": torch.ones(2), "z": ckpt.Zeros(torch.ones(2))}
    sink = io.BytesIO()
    d = holdings.digest(torch.ones(2))
    ckpt.write(snap, sink.write, held=lambda live: {1: d})
    frames = split(sink.getvalue())
    assert torch.equal(ckpt.read(io.BytesIO(sink.getvalue()), "(test)", holds=lambda x: torch.ones(2))["u"],
                       torch.ones(2))
    head = msgpack.unpackb(frames[0][1])
    for bad in ([[9, d]], [[1, d], [1, d]], "1", [[1, "d"]], [[2, d]], [[-1, d]], [[True, d]]):
        frames[0][1] = msgpack.packb({**head, "held": bad})
        with pytest.raises(gj.CheckpointError, match="held"):
            ckpt.read(io.BytesIO(join(frames)), "(test)", holds=lambda x: torch.ones(2))


def test_the_receiver_serves_an_offer_only_from_a_regular_file_of_digests(tmp_path):
    rx = Receiver(str(tmp_path / "in"))
    msg = protocol.decode(protocol.encode("xfer_holds", 1, table=protocol.CLUSTER_MESSAGES, xfer="j-m1.0"),
                          protocol.CLUSTER_MESSAGES)
    ask = lambda: rx.handle(msg, None)
    offered = holdings.holds_path(rx.path("j-m1.0"))
    assert ask() == (True, {"holds": b""})
    holdings.Offer({b"a" * 16: None, b"b" * 16: None}).save(offered)
    assert ask() == (True, {"holds": b"a" * 16 + b"b" * 16})
    for content in (b"x" * 15, b"x" * (16 * (protocol.HOLDS_MAX + 1))):
        with open(offered, "wb") as f:
            f.write(content)
        assert ask() == (True, {"holds": b""})
    os.unlink(offered)
    os.symlink(str(tmp_path / "elsewhere"), offered)
    with open(tmp_path / "elsewhere", "wb") as f:
        f.write(b"c" * 16)
    assert ask() == (True, {"holds": b""})
    os.unlink(offered)
    os.mkfifo(offered)
    assert ask() == (True, {"holds": b""})            # (and does not wait for a writer)
    assert rx.expire(now=os.path.getmtime(offered) + 10**6) == 1 and not os.path.exists(offered)
    assert holdings.parse(b"x" * 17) == frozenset() and len(holdings.parse(b"x" * 16 + b"y" * 16)) == 2


def test_a_digest_covers_every_piece_of_a_large_tensor(monkeypatch):
    monkeypatch.setattr(holdings, "PIECE_BYTES", 1024)
    t = torch.randn(1000)                            # four pieces, the last one short
    u = t.clone()
    assert holdings.digest(t) == holdings.digest(u) and len(holdings.digest(t)) == protocol.HOLDS_DIGEST_BYTES
    for at in (0, 300, 999):
        v = t.clone()
        v[at] += 1
        assert holdings.digest(v) != holdings.digest(t)
    assert holdings.digest(t[:512]) != holdings.digest(t)


def test_an_interrupted_stream_with_held_rows_changes_nothing(tmp_path):
    src = _trained()
    dst = _trained(steps=1)
    offer = holdings.Offer.of(_build()[0].modules())
    data = _streamed(src, offer.wire(), tmp_path)
    before = _values(dst)
    for cut in (len(data) // 3, len(data) - 1):
        with pytest.raises(gj.CheckpointError, match="truncated|holds only"):
            dst.restore(io.BytesIO(data[:cut]), offer=offer)
        assert_identical(before, _values(dst))
