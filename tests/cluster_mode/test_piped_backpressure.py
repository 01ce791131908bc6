"""A move's checkpoint piped to the process restoring it (gmux.wire.piped) holds up its sender, not the receiving
host's memory, when that process reads slowly or stops reading: the real sender and receiver over real sockets,
through CurveZMQ and sealed beside it."""
import os
import threading
import time

import pytest

from gmux.wire import keys, sealed
from gmux.wire.piped import QUEUE_BYTES
from gmux.wire.receiver import partial_path
from gmux.wire.transfer import TransferError, send_stream
from test_transfer import _serve, keydir  # noqa: F401 - keydir is a fixture

BULK = [False] + ([True] if sealed.available() else [])


class Reader(threading.Thread):
    """The restoring process's end of the FIFO: reads `step` bytes every `pause` seconds (never, with
    `pause=None`, once opened)."""

    def __init__(self, path, step, pause):
        super().__init__(daemon=True)
        self.path, self.step, self.pause = path, step, pause
        self.got = bytearray()
        self.opened = threading.Event()
        self.stop = threading.Event()

    def run(self):
        while not os.path.exists(self.path) and not self.stop.is_set():
            time.sleep(0.002)
        fd = os.open(self.path, os.O_RDONLY)
        self.opened.set()
        try:
            while not self.stop.is_set():
                if self.pause is None:
                    time.sleep(0.01)
                    continue
                data = os.read(fd, self.step)
                if not data:
                    return
                self.got += data
                time.sleep(self.pause)
        finally:
            os.close(fd)


class Watch(threading.Thread):
    """The most bytes the receiver's piped writer held queued at any sample."""

    def __init__(self, recv, xfer):
        super().__init__(daemon=True)
        self.recv, self.xfer, self.most, self.stop = recv, xfer, 0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            st = self.recv.open.get(self.xfer)
            pipe = st and st["pipe"] or self.recv.draining.get(self.xfer)
            if pipe is not None:
                self.most = max(self.most, pipe._queued)
            time.sleep(0.001)


def _stream(payload):
    """A sender's read(n) over `payload`, led by its 8-byte length as a job's checkpoint stream is."""
    data = memoryview(len(payload).to_bytes(8, "little") + payload)
    pos = [0]

    def read(n):
        out = bytes(data[pos[0]:pos[0] + n])
        pos[0] += len(out)
        return out
    return read


def _run(keydir, tmp_path, bulk, payload, step, pause, **options):  # noqa: F811 - keydir is the fixture's value
    stop = threading.Event()
    st, t = _serve(keydir, str(tmp_path / "in"), stop, bulk=bulk, durable=False)
    recv, x = st["recv"], "m1-c9.0"
    recv.expect_reader(x)
    reader, watch = Reader(partial_path(recv.path(x)), step, pause), Watch(recv, x)
    reader.start()
    watch.start()
    try:
        t0 = time.monotonic()
        try:
            r = send_stream(_stream(payload), f"tcp://127.0.0.1:{st['port']}",
                            keys.load_public(keydir, "daemon", "b"), keydir, "daemon", "a", x, **options)
        except TransferError as e:
            r = e
        return r, time.monotonic() - t0, reader, watch, recv
    finally:
        watch.stop.set()
        watch.join(5)
        if pause is not None:
            reader.join(30)
        reader.stop.set()
        stop.set()
        t.join(5)


@pytest.mark.parametrize("bulk", BULK, ids=["curve", "sealed"][:len(BULK)])
def test_a_slow_reader_holds_up_the_sender_and_gets_every_byte(keydir, tmp_path, bulk):  # noqa: F811
    payload = os.urandom(96 << 20)
    # 1 MiB every 10 ms: ~100 MB/s, a fraction of what loopback carries, so the queue fills at once
    r, _, reader, watch, recv = _run(keydir, tmp_path, bulk, payload, 1 << 20, 0.01)
    assert not isinstance(r, Exception), r
    assert bytes(reader.got) == payload and r["bytes"] == len(payload)
    # The reader took ~1 s, the network far less: without back-pressure the receiver would have queued most of
    # the 96 MiB; it never held more than its bound, and the sender kept to the room it was told: nothing
    # refused, nothing sent twice.
    assert QUEUE_BYTES // 2 < watch.most <= QUEUE_BYTES
    assert recv.refused_full == 0 and r["resent"] == 0 and r["rewinds"] == 0, r


@pytest.mark.parametrize("bulk", BULK, ids=["curve", "sealed"][:len(BULK)])
def test_a_reader_that_stops_reading_fails_the_transfer_and_holds_little(keydir, tmp_path, bulk):  # noqa: F811
    payload = os.urandom(64 << 20)
    r, seconds, reader, watch, recv = _run(keydir, tmp_path, bulk, payload, 0, None, timeout=0.5, attempts=2)
    assert reader.opened.is_set()
    assert isinstance(r, TransferError) and "stopped reading" in str(r), r
    assert seconds < 30
    assert watch.most <= QUEUE_BYTES


def test_a_reader_slower_than_the_senders_patience_is_still_waited_for(keydir, tmp_path):  # noqa: F811
    bulk = BULK[-1]                              # gmux's own way (sealed, where it can)
    payload = os.urandom(80 << 20)
    # Read a quarter of a chunk at a time (~25 MB/s): room never reaches a whole chunk for long, and the sender
    # waits ~2 s in all, more than its patience (1 s of nothing taken), though never that long without progress.
    r, seconds, reader, watch, recv = _run(keydir, tmp_path, bulk, payload, 1 << 18, 0.01, timeout=0.5, attempts=2)
    assert not isinstance(r, Exception), r
    assert bytes(reader.got) == payload and seconds > 1.0
