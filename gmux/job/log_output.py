"""A job's output into gmuxd's log survives a full disk: training goes on, and the log says what was lost.

A submitted job writes its stdout and stderr into its log in gmuxd's runtime directory. When that filesystem
fills (another job's checkpoint, a spill, anyone's files), Python raises "No space left on device" at the job's
next print and the job dies, its traceback lost with the rest. Hours of training should not end for a log line:
the job's streams are rebuilt over a file whose writes that find no room are counted and dropped, and the first
write that fits again is preceded by a line saying how much was lost.
"""
from __future__ import annotations

import errno
import io
import os
import sys

_FULL = (errno.ENOSPC, errno.EDQUOT)


class _RoomOrCount(io.RawIOBase):
    """The raw file under a job's stream: os.write, but a write the disk has no room for is counted, not raised."""

    def __init__(self, fd: int):
        super().__init__()
        self._fd = fd
        self.lost = 0

    def fileno(self) -> int:
        return self._fd

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, data) -> int:
        data = bytes(data)
        try:
            if self.lost:
                self._say_lost()
            os.write(self._fd, data)    # (a regular file takes the whole write or fails)
        except OSError as e:
            if e.errno not in _FULL:
                raise
            self.lost += len(data)
        return len(data)

    def _say_lost(self) -> None:
        note = f"\n[gmux: {self.lost:,} bytes of this job's output were lost here: the log's disk was full]\n"
        os.write(self._fd, note.encode())
        self.lost = 0


def _is_log(fd: int, logs_dir: str) -> bool:
    try:
        return os.path.dirname(os.readlink(f"/proc/self/fd/{fd}")) == os.path.realpath(logs_dir)
    except OSError:
        return False


def keep_going_on_full_disk(logs_dir: str) -> None:
    """Rebuilds sys.stdout and sys.stderr, where they write into a log in `logs_dir`, over _RoomOrCount. (A job
    started from a shell keeps its own streams: where they go is its user's.)"""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is None or not _is_log(fd, logs_dir):
            continue
        try:
            stream.flush()
        except OSError:
            pass
        rebuilt = io.TextIOWrapper(io.BufferedWriter(_RoomOrCount(fd)), encoding=stream.encoding,
                                   errors=stream.errors, line_buffering=stream.line_buffering,
                                   write_through=name == "stderr")
        setattr(sys, name, rebuilt)
        setattr(sys, f"__{name}__", rebuilt)
