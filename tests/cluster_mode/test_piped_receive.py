"""A move's checkpoint reaches the process waiting for it through a FIFO (gmux.wire.piped), not a file: the real
Receiver, fed xfer_* messages as a cluster link feeds it, and a job restoring through Arriving in a thread.
Bit-identical whether the reader comes early or late, across a sender's reconnection; a reader that ends fails
the transfer; a transfer given up fails the restore and leaves the job as it was; a stream nobody reads is dropped once its start is over."""
import os
import stat
import threading
import time

import pytest

from gmux import protocol
from gmux.job.checkpoint import CheckpointError, load
from gmux.wire.arriving import Arriving
from gmux.wire.piped import QUEUE_BYTES
from gmux.wire.receiver import Receiver, partial_path
from gmux.wire.transfer import TransferError
from gmux_testkit import assert_identical
from test_arriving import _checkpoint_bytes as _checkpoint, _job, _values

CHUNK = 64 << 10


def _msg(mtype, mid=1, **fields):
    return protocol.decode(protocol.encode(mtype, mid, table=protocol.CLUSTER_MESSAGES, **fields),
                           protocol.CLUSTER_MESSAGES)


class Restoring(threading.Thread):
    """A new process's restore, as gmux.job.api does it, after `delay` seconds (`fresh=False`: copied in only
    once all is read, so that a failed one can be seen to change nothing)."""

    def __init__(self, path, delay=0.0, fresh=True):
        super().__init__(daemon=True)
        self.path, self.delay, self.fresh = path, delay, fresh
        self.job = _job(1)
        self.before = _values(self.job)
        self.error = None

    def run(self):
        time.sleep(self.delay)
        try:
            with Arriving(self.path, wait=10) as arriving:
                self.job.restore(arriving, fresh=self.fresh)
        except Exception as e:           # noqa: BLE001 - the test asserts what it was
            self.error = e


def _wait_open(path, timeout=10.0):
    """Until some thread of this process has `path` open."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == path:
                    return
            except OSError:
                pass
        time.sleep(0.005)
    raise AssertionError(f"{path} was never opened")


def _have(answer):
    """(ok, what it holds) of a receiver's answer; to a piped transfer it also says its room."""
    ok, out = answer
    assert 0 <= out.get("room", 0) <= QUEUE_BYTES
    return ok, out["have"]


def _send(rx, x, data, upto=None, pause=0.0):
    assert _have(rx.handle(_msg("xfer_begin", xfer=x, size=len(data)), None)) == (True, 0)
    for lo in range(0, len(data) if upto is None else upto, CHUNK):
        ok, out = rx.handle(_msg("xfer_chunk", xfer=x, offset=lo), data[lo:lo + CHUNK])
        if not ok:
            return ok, out
        assert out["have"] == min(lo + CHUNK, len(data))
        time.sleep(pause)
    if upto is not None:
        return True, None
    return rx.handle(_msg("xfer_end", xfer=x), None)


@pytest.mark.parametrize("reader_delay", [0.0, 0.5], ids=["reader-first", "reader-late"])
def test_piped_restore_is_bit_identical_and_no_file_is_written(tmp_path, reader_delay):
    src = _job(0)
    data = _checkpoint(tmp_path, src)
    rx = Receiver(str(tmp_path / "in"), durable=False)
    rx.expect_reader("m1-c1.0")
    path = rx.path("m1-c1.0")
    reader = Restoring(path, reader_delay)
    reader.start()
    assert _have(rx.handle(_msg("xfer_begin", xfer="m1-c1.0", size=len(data)), None)) == (True, 0)
    assert stat.S_ISFIFO(os.stat(partial_path(path)).st_mode)
    half = len(data) // CHUNK // 2 * CHUNK
    for lo in range(0, len(data), CHUNK):
        if lo == half:     # the connection was lost: the sender begins again and hears where to go on from
            assert _have(rx.handle(_msg("xfer_begin", xfer="m1-c1.0", size=len(data)), None)) == (True, half)
        assert rx.handle(_msg("xfer_chunk", xfer="m1-c1.0", offset=lo), data[lo:lo + CHUNK])[0]
    ok, out = rx.handle(_msg("xfer_end", xfer="m1-c1.0"), None)
    assert ok and out == {"have": len(data), "path": path}
    reader.join(20)
    assert reader.error is None and not reader.is_alive()
    assert_identical(_values(src), _values(reader.job))
    # Nothing was staged: what is left is the FIFO under its final name (the start deletes it), no regular file.
    assert [stat.S_ISFIFO(os.stat(os.path.join(rx.dir, f)).st_mode) for f in os.listdir(rx.dir)] == [True]
    rx.draining["m1-c1.0"].join(5)
    assert rx.draining["m1-c1.0"].done
    rx.close()


def test_a_reader_that_ends_fails_the_transfer_and_nothing_is_left(tmp_path):
    data = os.urandom(4 << 20)
    rx = Receiver(str(tmp_path / "in"), durable=False)
    rx.expect_reader("m1-c2.0")
    x, path = "m1-c2.0", rx.path("m1-c2.0")
    assert rx.handle(_msg("xfer_begin", xfer=x, size=len(data)), None)[0]
    fd = os.open(partial_path(path), os.O_RDONLY | os.O_NONBLOCK)
    assert rx.handle(_msg("xfer_chunk", xfer=x, offset=0), data[:CHUNK])[0]
    time.sleep(0.1)
    os.close(fd)                                     # the new process died
    deadline, answer = time.monotonic() + 10, None
    offset = CHUNK
    while time.monotonic() < deadline and offset < len(data):
        ok, answer = rx.handle(_msg("xfer_chunk", xfer=x, offset=offset), data[offset:offset + CHUNK])
        if not ok:
            break
        offset += CHUNK
        time.sleep(0.01)
    assert not ok and "cannot store it on this machine" in answer and "stopped reading" in answer, answer
    assert os.listdir(rx.dir) == [] and x not in rx.open
    rx.close()


def test_a_transfer_given_up_fails_the_restore_and_changes_nothing(tmp_path):
    data = _checkpoint(tmp_path, _job(0))
    rx = Receiver(str(tmp_path / "in"), durable=False)
    rx.expect_reader("m1-c3.0")
    reader = Restoring(rx.path("m1-c3.0"), fresh=False)
    reader.start()
    assert _send(rx, "m1-c3.0", data, upto=len(data) // 2) == (True, None)
    _wait_open(partial_path(rx.path("m1-c3.0")))      # (else it would read the transfer begun again, as it should)
    # The sender came back with another size: the transfer is begun again, the first one given up.
    assert _have(rx.handle(_msg("xfer_begin", xfer="m1-c3.0", size=len(data) + 1), None)) == (True, 0)
    reader.join(20)
    assert isinstance(reader.error, TransferError) and "given up" in str(reader.error), reader.error
    assert_identical(reader.before, _values(reader.job))
    rx.close()


def test_a_stream_nobody_reads_is_dropped_once_its_start_is_over(tmp_path):
    data = os.urandom(8 << 20)
    rx = Receiver(str(tmp_path / "in"), durable=False)
    rx.expect_reader("m1-c4.0")
    ok, out = _send(rx, "m1-c4.0", data)
    assert ok and out["path"] == rx.path("m1-c4.0")
    pipe = rx.draining["m1-c4.0"]
    time.sleep(0.2)
    assert not pipe.done                            # it still waits for its reader, holding the bytes
    os.unlink(out["path"])                          # the start that waited is over (gmux.node.cluster_starts)
    pipe.join(5)
    assert pipe.done and pipe._queue.empty()
    rx.expire(every=0)
    assert rx.draining == {}
    rx.close()


def test_a_transfer_nobody_announced_is_a_file_as_before(tmp_path):
    data = os.urandom(3 * CHUNK)
    rx = Receiver(str(tmp_path / "in"), durable=False)
    ok, out = _send(rx, "m1-c5.0", data)
    assert ok and stat.S_ISREG(os.stat(out["path"]).st_mode)
    with open(out["path"], "rb") as f:
        assert f.read() == data
    rx.close()


def test_a_checkpoint_that_is_a_fifo_is_refused_without_waiting(tmp_path):
    path = str(tmp_path / "planted.ckpt")
    os.mkfifo(path)
    t0 = time.monotonic()
    with pytest.raises(CheckpointError, match="not a regular file"):
        load(path)
    assert time.monotonic() - t0 < 5


def test_what_arrived_for_a_process_that_ended_is_deleted_at_once_though_its_sender_sends_no_more(tmp_path):
    """A move's new process killed as it read (CI): the move failed, its source heard so from the scheduler and
    sent nothing more, and what had arrived (a FIFO, or a partial file where the transfer began before its reader
    was announced) waited STALE_S (10 min) for expire. It goes as the process is found ended; a sealed chunk
    still gets a sealed refusal."""
    data = os.urandom(4 * CHUNK)
    rx = Receiver(str(tmp_path / "in"), durable=False)
    piped, filed = "m1-c6.0", "m1-c7.0"
    rx.expect_reader(piped)
    for x in (piped, filed):
        assert _send(rx, x, data, upto=2 * CHUNK) == (True, None)
    rx.expect_reader(filed)                         # (announced after its first bytes: it stays a file)
    assert rx.open[piped]["pipe"] is not None and rx.open[filed]["pipe"] is None
    assert sorted(os.listdir(rx.dir)) == ["m1-c6.0.part", "m1-c7.0.part"]
    for x in (piped, filed):
        rx.reader_gone(rx.path(x))
    assert os.listdir(rx.dir) == []
    with pytest.raises(OSError, match="has ended"):     # (what a sealed chunk's answer is made from)
        rx._append(rx.open[filed], 2 * CHUNK, data[:CHUNK])
    for x in (piped, filed):
        ok, out = rx.handle(_msg("xfer_chunk", xfer=x, offset=2 * CHUNK), data[:CHUNK])
        assert not ok and "has ended" in out and x not in rx.open, out
    assert os.listdir(rx.dir) == []
    rx.close()


def test_a_transfer_whose_process_ended_is_refused_at_once_whatever_its_sender_asks_next(tmp_path):
    """The new process was killed after it opened its FIFO and before the receiver's writer did (a loaded host):
    the writer, seeing no reader, waits for one for STALE_S; the queue filled, the sender asked for room for as
    long as it waits through silences (60 s), and the move's job sat suspended on its source all that time."""
    data = os.urandom(QUEUE_BYTES + 4 * CHUNK)
    rx = Receiver(str(tmp_path / "in"), durable=False)
    x, y = "m1-c6.0", "m1-c7.0"
    for name in (x, y):
        rx.expect_reader(name)
    assert _send(rx, x, data, upto=QUEUE_BYTES) == (True, None)       # queued: no reader opened it
    ok, out = rx.handle(_msg("xfer_chunk", xfer=x, offset=QUEUE_BYTES), b"")
    assert ok and out["room"] == 0
    rx.reader_gone(rx.path(x))                      # gmuxd saw its process end (gmux.node.cluster_starts)
    rx.reader_gone(rx.path(y))                      # this one ended before its sender began
    ok, out = rx.handle(_msg("xfer_chunk", xfer=x, offset=QUEUE_BYTES), b"")
    assert not ok and "has ended" in out and x not in rx.open, out
    ok, out = rx.handle(_msg("xfer_begin", xfer=y, size=len(data)), None)
    assert not ok and "has ended" in out and y not in rx.open, out
    assert os.listdir(rx.dir) == []
    rx.reader_gone(rx.path("m1-c8.0"))              # nobody waited for it: it is a file as before
    assert _send(rx, "m1-c8.0", data[:CHUNK])[0]
    rx.expire(now=time.time() + 700, every=0)
    assert rx.gone == {}
    rx.close()
