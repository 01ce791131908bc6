"""A job's output into gmuxd's log: it survives a full disk and keeps to the log's limit, and the log says what
was lost.

A submitted job writes its stdout and stderr into its log in gmuxd's runtime directory. When that filesystem
fills (another job's checkpoint, a spill, anyone's files), Python raises "No space left on device" at the job's
next print and the job dies, its traceback lost with the rest. Hours of training should not end for a log line:
the job's streams are rebuilt over a file whose writes that find no room are counted and dropped, and the first
write that fits again is preceded by a line saying how much was lost.

gmuxd trims a log past its --log-limit (GMUX_LOG_LIMIT) every few seconds, which a print in a tight loop outran by
GBs, and never one someone deleted. So the job trims too, under the same lock (gmux.node.log_limit): a write that
would take the log past twice the limit first empties it down to the newest output the job keeps in memory (the
last lines of a log, a traceback, are the ones read).
"""
from __future__ import annotations

import errno
import fcntl
import io
import os
import sys

from gmux.util.dropped_line import HEAD, from_whole_line, said

_FULL = (errno.ENOSPC, errno.EDQUOT)
TAIL = 1 << 20      # bytes of its newest output a job keeps to write back when it trims its log


class _Log:
    """One log file as the job's streams share it (stdout and stderr both write into it): the newest output, and
    what was lost."""

    def __init__(self, limit: int):
        self.cap = 2 * limit    # bytes the file may hold (0: no bound)
        self.keep = min(TAIL, limit // 2)
        self.tail = bytearray()
        self.lost = 0
        self.why = ""

    def write(self, fd: int, data: bytes) -> None:
        """Through the stream's own descriptor `fd` (the script may have closed the other)."""
        cut = max(0, len(data) - self.cap // 2) if self.cap else 0     # one write the log cannot hold: its end
        data = data[cut:]
        if cut or self.cap and os.fstat(fd).st_size + len(data) + 200 > self.cap:   # (200: the lines said here)
            self._trim(fd, len(data), cut)
        # Shared with the job's other writers, exclusive to a trim (gmuxd's): one written between the trim's read
        # of the tail and its emptying of the file was lost, uncounted. (Output written below Python, by C code
        # or a child's own streams, still can be.)
        locked = _lock(fd, fcntl.LOCK_SH)
        left = memoryview(data)
        try:
            if self.lost:
                self._say_lost(fd)
            while left:      # (a filling disk writes part of a write, then says ENOSPC at the next)
                left = left[os.write(fd, left):]
        except OSError as e:
            if e.errno not in _FULL:
                raise
            self.lost, self.why = self.lost + len(left), "the log's disk was full"
            data = data[:len(data) - len(left)]
        finally:
            if locked:
                _lock(fd, fcntl.LOCK_UN)
        self.tail += data
        if len(self.tail) > 2 * self.keep:
            del self.tail[:len(self.tail) - self.keep]

    def _trim(self, fd: int, coming: int, cut: int = 0) -> None:
        """Empties the log down to the newest output kept here, behind the line counting all it lost (and `cut`
        bytes of the write of `coming` bytes about to be made, which it cannot hold)."""
        fcntl.flock(fd, fcntl.LOCK_EX)     # (gmuxd's trim reads the tail and writes it back under it)
        try:
            size = os.fstat(fd).st_size
            if size + coming + 200 <= self.cap and not cut:
                return                          # gmuxd trimmed it meanwhile
            tail = from_whole_line(bytes(self.tail[-self.keep:]))
            before, line = said(_head(fd))      # (an earlier trim's count: the new line adds to it)
            os.ftruncate(fd, 0)
            lost = max(0, before + size - line - len(tail)) + cut
            os.write(fd, f"[gmux: {lost:,} bytes of this job's output dropped: its log is kept under "
                         f"{self.cap:,} bytes, twice gmuxd --log-limit, between gmuxd's trims]\n".encode() + tail)
        except OSError as e:
            if e.errno not in _FULL:
                raise
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _say_lost(self, fd: int) -> None:
        os.write(fd, f"\n[gmux: {self.lost:,} bytes of this job's output were lost here: {self.why}]\n"
                 .encode())
        self.lost = 0


def _lock(fd: int, how: int) -> bool:
    """flock, where the log's filesystem has it."""
    try:
        fcntl.flock(fd, how)
    except OSError:
        return False
    return True


def _head(fd: int) -> bytes:
    """The log's first bytes, read through a descriptor of its own (the job's is for writing only); b"" where the
    job may not read its log (a system gmuxd's)."""
    try:
        r = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.pread(r, HEAD, 0)
    except OSError:
        return b""
    finally:
        os.close(r)


class _Stream(io.RawIOBase):
    """The raw file under one of a job's streams, writing through its _Log; never raises for a full disk."""

    def __init__(self, fd: int, log: _Log):
        super().__init__()
        self._fd, self._log = fd, log

    def fileno(self) -> int:
        return self._fd

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, data) -> int:
        data = bytes(data)
        self._log.write(self._fd, data)
        return len(data)


def _log_file(fd: int, logs_dir: str):
    """(device, inode) of the file `fd` writes, where it is a log in `logs_dir`; else None."""
    try:
        if os.path.dirname(os.readlink(f"/proc/self/fd/{fd}")) != os.path.realpath(logs_dir):
            return None
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    except OSError:
        return None


def keep_going_on_full_disk(logs_dir: str) -> None:
    """Rebuilds sys.stdout and sys.stderr, where they write into a log in `logs_dir`, over _Stream, held to twice
    GMUX_LOG_LIMIT bytes where gmuxd set it. (A job started from a shell keeps its own streams: where they go is
    its user's.)"""
    try:
        limit = max(0, int(os.environ.get("GMUX_LOG_LIMIT", "0")))
    except ValueError:
        limit = 0
    logs: dict = {}
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream, file = getattr(sys, name), _log_file(fd, logs_dir)
        if stream is None or file is None:
            continue
        try:
            stream.flush()
        except OSError:
            pass
        log = logs.setdefault(file, _Log(limit))
        # (unbuffered as it was, under python -u or PYTHONUNBUFFERED: its bytes go straight to the raw file)
        raw, unbuffered = _Stream(fd, log), isinstance(getattr(stream, "buffer", None), io.RawIOBase)
        rebuilt = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding=stream.encoding,
                                   errors=stream.errors, line_buffering=stream.line_buffering,
                                   write_through=unbuffered or stream.write_through)
        setattr(sys, name, rebuilt)
        setattr(sys, f"__{name}__", rebuilt)
