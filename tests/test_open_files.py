"""What a script's open files hold is written before a move's exec (gmux/job/open_files.py), and a file whose
write blocks for ever (a pipe nobody reads) does not hold the move."""
import fcntl
import os
import time

from gmux.job.open_files import flush_open_files


def _full_pipe():
    """A pipe whose buffer is full and whose reader never reads: a write to it blocks."""
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    return r, w


def test_files_on_disk_are_written_and_a_pipe_nobody_reads_does_not_hold_it(tmp_path):
    r, w = _full_pipe()
    stalled = os.fdopen(w, "w")
    stalled.write("never read\n")
    metrics = open(tmp_path / "metrics.csv", "w")          # written after the pipe in gc's order
    metrics.write("step,loss\n" + "".join(f"{i},0.5\n" for i in range(100)))
    binary = open(tmp_path / "raw.bin", "ab", buffering=1 << 20)
    binary.write(b"\x00" * 1000)
    try:
        t0 = time.monotonic()
        assert flush_open_files(wait=0.5) is False          # the pipe's write was still blocked
        assert time.monotonic() - t0 < 5
        assert (tmp_path / "metrics.csv").read_text().count("\n") == 101
        assert (tmp_path / "raw.bin").stat().st_size == 1000
        assert not metrics.closed and not binary.closed       # still the script's, open
        metrics.write("100,0.4\n")
        metrics.flush()
        assert (tmp_path / "metrics.csv").read_text().endswith("100,0.4\n")
    finally:
        os.close(r)     # the blocked write fails (EPIPE) and its thread ends
        for f in (metrics, binary, stalled):
            try:
                f.close()
            except OSError:
                pass


def test_with_nothing_blocked_it_says_all_was_written(tmp_path):
    r, w = os.pipe()
    piped = os.fdopen(w, "w")
    piped.write("read\n")
    try:
        assert flush_open_files(wait=5) is True
        assert os.read(r, 100) == b"read\n"
    finally:
        piped.close()
        os.close(r)
