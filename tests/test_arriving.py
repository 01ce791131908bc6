"""A moved job restores from its checkpoint as the bytes arrive (gmux.wire.arriving), and applies it only once
the transfer is complete: the receiver's partial file is written here by a thread standing for the receiver."""
import os
import threading
import time

import pytest
import torch
from torch import nn

import gmux.job as gj
from gmux.wire.arriving import Arriving
from gmux.wire.receiver import partial_path
from gmux.wire.transfer import TransferError
from gmux_testkit import assert_identical


def _job(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    job = gj.attach(model, opt, state={"step": seed})
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    return job


def _values(job):
    return [t.detach().clone() for t in job.tracked.tensors()]


class Receiver(threading.Thread):
    """Appends `data` to PATH.part in pieces, then (if `complete`) renames it to PATH, as a transfer's receiver
    does; `gone_at`: the byte count at which it discards the partial file instead."""

    def __init__(self, path, data, pieces=20, pause=0.02, complete=True, gone_at=None, start_after=0.0):
        super().__init__(daemon=True)
        self.path, self.data, self.pieces, self.pause = path, data, pieces, pause
        self.complete, self.gone_at, self.start_after = complete, gone_at, start_after
        self.renamed_at = None

    def run(self):
        time.sleep(self.start_after)
        part = partial_path(self.path)
        step = -(-len(self.data) // self.pieces)
        with open(part, "wb", buffering=0) as f:
            for lo in range(0, len(self.data), step):
                if self.gone_at is not None and lo >= self.gone_at:
                    os.unlink(part)
                    return
                f.write(self.data[lo:lo + step])
                time.sleep(self.pause)
        if self.complete:
            self.renamed_at = time.monotonic()
            os.rename(part, self.path)


def _checkpoint_bytes(tmp_path, job):
    path = tmp_path / "src.ckpt"
    job.checkpoint(str(path))
    return path.read_bytes()


def test_restores_as_the_bytes_arrive_and_applies_only_once_complete(tmp_path):
    src = _job(0)
    data = _checkpoint_bytes(tmp_path, src)
    path = str(tmp_path / "m1-c1-k1.0.ckpt")
    dst = _job(1)       # (before the transfer starts: see _refused_and_unchanged)
    rx = Receiver(path, data, start_after=0.1)
    rx.start()
    reads = []

    class Counted(Arriving):
        def readinto(self, buffer):
            n = super().readinto(buffer)
            reads.append((time.monotonic(), n))
            return n
    with Counted(path, wait=10) as arriving:      # opened before the first byte lands
        dst.restore(arriving)
    done = time.monotonic()
    rx.join()
    assert rx.renamed_at is not None and done >= rx.renamed_at
    # Read as it landed (the pieces come 20 ms apart), not all after the last one.
    assert sum(n for t, n in reads if t < rx.renamed_at) > len(data) // 2
    assert_identical(_values(src), _values(dst))
    assert dst.state["step"] == 0


def test_a_complete_transfer_is_read_like_a_file(tmp_path):
    src = _job(0)
    path = tmp_path / "done.ckpt"
    path.write_bytes(_checkpoint_bytes(tmp_path, src))
    dst = _job(1)
    with Arriving(str(path), wait=1) as arriving:
        dst.restore(arriving)
    assert_identical(_values(src), _values(dst))


def _refused_and_unchanged(path, wait, match, rx=None):
    """A restore from `path` as it arrives fails with `match`, and the job it was for is as it was. `rx`: a receiver
    started only once that job is made (attach() looks at the process's objects: in a long-lived test worker that
    took longer than a transfer given up after 0.2 s, whose partial file was gone before the restore looked)."""
    dst = _job(1)
    before = _values(dst)
    if rx is not None:
        rx.start()
    with pytest.raises(TransferError, match=match):
        with Arriving(path, wait=wait) as arriving:
            dst.restore(arriving)
    assert_identical(before, _values(dst))


def test_a_transfer_given_up_half_way_changes_nothing(tmp_path):
    data = _checkpoint_bytes(tmp_path, _job(0))
    path = str(tmp_path / "cut.ckpt")
    rx = Receiver(path, data, gone_at=len(data) // 2)
    _refused_and_unchanged(path, 10, "given up after", rx)
    rx.join()


def test_every_byte_but_never_completed_is_not_applied(tmp_path):
    # The source's job wrote its whole checkpoint but did not vouch for it (its checkpoint failed at the end):
    # the sender never completes the transfer, so the END frame alone must not make the restore go ahead.
    data = _checkpoint_bytes(tmp_path, _job(0))
    path = str(tmp_path / "unvouched.ckpt")
    rx = Receiver(path, data, pieces=4, pause=0.0, complete=False)
    rx.start()
    rx.join()
    _refused_and_unchanged(path, 0.3, "no bytes of the checkpoint arrived for 0.3 s")


def test_nothing_arriving_is_named(tmp_path):
    with pytest.raises(TransferError, match="did not arrive within 0.2 s"):
        Arriving(str(tmp_path / "never.ckpt"), wait=0.2)


def test_bytes_after_the_end_frame_are_refused(tmp_path):
    src = _job(0)
    path = tmp_path / "trailing.ckpt"
    path.write_bytes(_checkpoint_bytes(tmp_path, src) + b"\0")
    dst = _job(1)
    before = _values(dst)
    with pytest.raises(gj.CheckpointError, match="bytes after the END frame"):
        dst.restore(str(path))
    assert_identical(before, _values(dst))


def test_a_fresh_process_restores_straight_into_its_own_parameters(tmp_path, monkeypatch):
    # A move's target only just built its model, and ends if the restore fails: its parameters and buffers are
    # read into where they are, not into new buffers copied in afterwards (one pass over the bytes less).
    from gmux.job import checkpoint as ckpt
    src = _job(0)
    data = _checkpoint_bytes(tmp_path, src)
    path = str(tmp_path / "fresh.ckpt")
    rx = Receiver(path, data)
    rx.start()
    dst = _job(1)
    model = dst.tracked.modules[0]
    where = {n: p.data_ptr() for n, p in model.state_dict().items()}
    filled, read = [], ckpt.read

    def spy(source, origin, check=None, into=None, holds=None):
        out = read(source, origin, check, into, holds)
        filled.extend(t.data_ptr() for t in (into or {}).values())
        return out
    monkeypatch.setattr(ckpt, "read", spy)
    with Arriving(path, wait=10) as arriving:
        dst.restore(arriving, fresh=True)
    rx.join()
    assert_identical(_values(src), _values(dst))
    assert {n: p.data_ptr() for n, p in model.state_dict().items()} == where
    assert sorted(filled) == sorted(where.values())      # every parameter and buffer read into where it is


def test_a_fresh_restore_given_up_half_way_is_still_refused(tmp_path):
    data = _checkpoint_bytes(tmp_path, _job(0))
    path = str(tmp_path / "cut-fresh.ckpt")
    rx = Receiver(path, data, gone_at=len(data) // 2)
    rx.start()
    with pytest.raises(TransferError, match="given up after"):
        with Arriving(path, wait=10) as arriving:
            _job(1).restore(arriving, fresh=True)
    rx.join()
