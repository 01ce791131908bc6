"""A submitted job's log is bounded: one that floods its output (a print in a tight loop) would otherwise fill the
machine's disk for every user. Past the limit, the log keeps its newest half behind a line saying how much was
dropped; the job writes on, undisturbed.

The job writes straight to the file (O_APPEND, no pipe through gmuxd, so a slow or restarting gmuxd never
blocks a job's print), so the file is trimmed in place: its tail read, the file emptied, the tail written back,
under an exclusive lock: the job's writes through its streams take the lock shared (gmux.job.log_output), so none
lands in between. Output written below Python (C code, a child's own streams) may, and is lost uncounted.
"""
from __future__ import annotations

import fcntl
import logging
import os
from typing import Optional

from gmux.util.dropped_line import HEAD, from_whole_line, said

log = logging.getLogger("gmux.daemon")

DEFAULT_LIMIT = 256 << 20     # bytes; far beyond any training log, well below a disk
EVERY_S = 2.0                 # how often every log is looked at and trimmed once past its limit


class Bounds:
    """gmuxd's hold on its submitted jobs' logs. Each is trimmed once past the limit every EVERY_S seconds, and
    at the next tick once past twice it, which only output around the job's own bound (gmux.job.log_output)
    reaches: `os.write(1, ...)` in a loop wrote GBs between two rounds. What the ticks trim is said with the
    next round's figure, so gmuxd's own log gets a line per job per round at most."""

    def __init__(self, limit: int):
        self.limit = limit
        self.last_round = 0.0
        self.unsaid: dict[str, int] = {}

    def round_due(self, now: float) -> bool:
        if now - self.last_round < EVERY_S:
            return False
        self.last_round = now
        return True

    def hold(self, job: str, path: str, due: bool) -> int:
        """Trims the log of `job` at `path` if due, or past twice the limit: the bytes to say were dropped now
        (a due round's, with what the ticks before it trimmed), else 0."""
        if not due and size(path) <= 2 * self.limit:
            return 0
        dropped = (trim(path, self.limit) or 0) + self.unsaid.pop(job, 0)
        if not due and dropped:
            self.unsaid[job] = dropped
            return 0
        if dropped:
            log.info("%s: %d bytes of its output dropped (its log is kept under %d bytes)", job, dropped, self.limit)
        return dropped


def size(path: str) -> int:
    """The log's size now (0 if gone)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


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
        try:    # the job trims too, under this lock (gmux.job.log_output): one trimming is left to finish, but
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)     # one holding the lock for ever outgrows it
        except OSError:
            if f.seek(0, os.SEEK_END) <= 4 * limit:
                return None
        # (taken under the lock: a line written before it was taken would be cut out of the middle, below)
        size = f.seek(0, os.SEEK_END)
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
