"""gmux.util.splice: what a pipe's reader reads is exactly what was written, spliced or not; a spliced piece is
kept until the reader has read it; the writer neither hangs on a reader that left nor fails where vmsplice is
refused."""
import fcntl
import os
import random
import threading

import pytest

from gmux.util.splice import SPLICE_FROM, PipeWriter, unread


def read_all(fd: int) -> bytes:
    out = bytearray()
    while chunk := os.read(fd, 1 << 20):
        out += chunk
    return bytes(out)


@pytest.mark.parametrize("mode", ["on", "off"])
def test_pieces_of_every_size_arrive_in_order(mode, monkeypatch):
    monkeypatch.setenv("GMUX_VMSPLICE", mode)
    rng = random.Random(7)
    pieces = [rng.randbytes(rng.choice([1, 9, 100, SPLICE_FROM - 1, SPLICE_FROM, 3 * SPLICE_FROM + 5, 1 << 20]))
              for _ in range(60)]
    r, w = os.pipe()
    got = {}
    reader = threading.Thread(target=lambda: got.setdefault("bytes", read_all(r)))
    reader.start()
    pipe = PipeWriter(w)
    for p in pieces:
        pipe.write_all(memoryview(p))
    pipe.drain()
    os.close(w)
    reader.join(10)
    os.close(r)
    assert got["bytes"] == b"".join(pieces)
    assert pipe.written == len(got["bytes"])


def test_a_spliced_piece_is_kept_until_read():
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    piece = bytes(range(256)) * 1024               # 256 KiB, spliced
    pipe = PipeWriter(w)
    if not pipe._splice:
        pytest.skip("vmsplice is not available here")
    assert pipe.write(piece) == len(piece)
    assert pipe._held and pipe._held[0][1].obj is piece   # the pipe refers to it: it must not be freed
    assert unread(w) == len(piece)
    assert os.read(r, len(piece)) == piece
    pipe.drain()
    assert not pipe._held
    os.close(w)
    os.close(r)


def test_drain_ends_when_the_reader_leaves():
    r, w = os.pipe()
    pipe = PipeWriter(w)
    pipe.write(bytes(SPLICE_FROM))                 # never read
    os.close(r)
    t = threading.Thread(target=pipe.drain)
    t.start()
    t.join(5)
    assert not t.is_alive()
    os.close(w)


def test_drain_ends_when_the_caller_stops():
    r, w = os.pipe()
    pipe = PipeWriter(w)
    pipe.write(bytes(SPLICE_FROM))
    pipe.drain(stop=lambda: True)
    assert not pipe._held
    os.close(w)
    os.close(r)


def test_a_full_pipe_that_does_not_block_says_so():
    r, w = os.pipe()
    os.set_blocking(w, False)
    pipe = PipeWriter(w)
    with pytest.raises(BlockingIOError):
        for _ in range(1000):
            pipe.write(bytes(SPLICE_FROM))
    os.close(w)
    os.close(r)


def test_a_file_is_written_as_usual(tmp_path):
    """vmsplice refuses what is not a pipe: the writer falls back to write() and loses nothing."""
    data = random.Random(1).randbytes(5 * SPLICE_FROM + 3)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    pipe = PipeWriter(fd)
    pipe.write_all(data[:10])
    pipe.write_all(data[10:])
    pipe.flush()
    os.close(fd)
    assert (tmp_path / "f").read_bytes() == data
    assert not pipe._splice


def test_a_reader_gone_is_a_broken_pipe():
    r, w = os.pipe()
    os.close(r)
    with pytest.raises(BrokenPipeError):
        PipeWriter(w).write(bytes(SPLICE_FROM))
    os.close(w)
