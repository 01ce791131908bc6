"""Writing out what a script's open files hold in their buffers, before its process re-executes (a move, a
spill): the exec drops every buffer, and a metrics file the script appends to each step lost its last lines at
each move (python flushes them as it exits, and the script's objects are kept to the end: runner.py).

A write may block for ever: a pipe whose reader stopped reading, a terminal stopped by Ctrl-S. Files on disk are
written here; every other file is written by a helper thread, waited for a bounded time, so that such a file
cannot hold the move (what it could not take was going to be lost with the exec anyway)."""
from __future__ import annotations

import _io
import contextlib
import gc
import os
import stat
import sys
import threading
from typing import Callable

WAIT_S = 2.0        # what the files that are not on disk may take, together


def flush_open_files(wait: float = WAIT_S) -> bool:
    """Flushes every open writable file object of this process; the files stay open. False when those not on
    disk were still being written after `wait` seconds."""
    on_disk, others = [], []
    for obj in gc.get_objects():
        # (its type, not isinstance: that reads an object's __class__, and torch's deprecated reduce_op warns on it)
        if issubclass(type(obj), _io._IOBase):
            with contextlib.suppress(Exception):
                if not obj.closed and obj.writable():
                    (on_disk if _on_disk(obj) else others).append(obj)
    for f in on_disk:
        _flush_quietly(f)
    # (sys.stdout may be an object of the script's own, found by no type: its flush is waited for the same way)
    return within(wait, lambda: [_flush_quietly(f) for f in others + [sys.stdout]])


def within(wait: float, work: Callable[[], object]) -> bool:
    """Runs `work` in a daemon thread and waits at most `wait` seconds for it: True when it ended in time."""
    done = threading.Event()

    def run():
        with contextlib.suppress(Exception):
            work()
        done.set()
    threading.Thread(target=run, name="gmux-flush", daemon=True).start()
    return done.wait(wait)


def _on_disk(f) -> bool:
    try:
        return stat.S_ISREG(os.fstat(f.fileno()).st_mode)
    except Exception:        # (no file descriptor: an in-memory buffer, or one a wrapper does not give)
        return False


def _flush_quietly(f) -> None:
    with contextlib.suppress(Exception):
        f.flush()
