"""A submitted job's log is bounded: one that floods its output (a print in a tight loop) would otherwise fill the
machine's disk for every user. Past the limit, the log keeps its newest half behind a line saying how much was
dropped; the job writes on, undisturbed.

The job writes straight to the file (O_APPEND, no pipe through gmuxd, so a slow or restarting gmuxd never
blocks a job's print), so the file is trimmed in place: its tail read, the file emptied, the tail written back.
Whatever the job writes in between those steps is dropped with the head; the line counts it as dropped.
"""
from __future__ import annotations

import fcntl
import os
from typing import Optional

from gmux.util.dropped_line import HEAD, from_whole_line, said

DEFAULT_LIMIT = 256 << 20     # bytes; far beyond any training log, well below a disk


def trim(path: str, limit: int) -> Optional[int]:
    """Keeps the newest `limit` // 2 bytes of the log at `path` once it is over `limit`: the bytes dropped now
    (the log's line counts all it lost), or None (under the limit, or gone)."""
    keep = limit // 2
    try:
        # (appending, as the job does: a line it writes while the tail goes back lands beside it, never under it)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        try:    # the job trims too, under this lock (gmux.job.log_output): one trimming is left to finish, but
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)     # one holding the lock for ever outgrows it
        except OSError:
            if size <= 4 * limit:
                return None
        if size <= limit:
            return None
        f.seek(0)
        before, line = said(f.read(HEAD))       # (an earlier trim's count: the new line adds to it)
        f.seek(size - keep)
        tail = from_whole_line(f.read(keep))
        now = f.seek(0, os.SEEK_END)        # what the job wrote since the size was taken is dropped too
        f.truncate(0)
        dropped = now - len(tail)
        f.write(f"[gmuxd: {before + dropped - line:,} bytes of this job's output dropped: its log is kept under "
                f"{limit:,} bytes (gmuxd --log-limit)]\n".encode() + tail)
    return dropped
