"""A process's tree: its descendants as /proc shows them, and keeping its orphans in it.

A daemon a job double-forks, whose parent then exits, is re-parented to the nearest "child subreaper" above it
(else to init). With the job's process a subreaper, that daemon stays the job's descendant, however it left the
job's process group and session and whatever it did to its environment, so that what stops, continues or kills
the job's tree reaches it too. (Linux's PR_SET_CHILD_SUBREAPER; kept across exec, not given to children.)
An adopted orphan that exits stays a zombie (a pid, no memory) until the job ends and init reaps it: nothing
reaps it earlier, because telling it from a child the job itself will wait for is not possible, and a child
reaped behind the job's back gives its `wait` a false exit status.
"""
from __future__ import annotations

import ctypes
import os

_PR_SET_CHILD_SUBREAPER = 36


def keep_orphans() -> bool:
    """Makes this process the subreaper of its descendants; False where the kernel does not offer it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """The process's children, theirs, and so on (from /proc/PID/task/TID/children)."""
    found, todo = [], [pid]
    seen = {pid}
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            for kid in kids:
                if kid not in seen:
                    seen.add(kid)
                    found.append(kid)
                    todo.append(kid)
    return found
