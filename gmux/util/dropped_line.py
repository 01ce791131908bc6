"""The line a trimmed log begins with: how much of its job's output was dropped, in all.

gmuxd's trim (gmux.node.log_limit) and the job's own (gmux.job.log_output) each write it, adding what they drop
to what the line they drop said, so that it counts the log's whole loss, not the last trim's; and each keeps the
newest output from its first whole line.
"""
from __future__ import annotations

import re

_COUNT = re.compile(rb"\[gmuxd?: ([0-9,]+) bytes of this job's output dropped[^\n]*\n")
HEAD = 400      # bytes of a log's start that hold the line, if it has one


def from_whole_line(tail: bytes) -> bytes:
    """The newest output a trim keeps, from its first whole line (all of it, where it holds one line only)."""
    start = tail.find(b"\n") + 1
    return tail[start:] if 0 < start < len(tail) else tail


def said(head: bytes) -> tuple[int, int]:
    """(bytes the line at the start of `head` counts, the line's own length), or (0, 0) without one."""
    m = _COUNT.match(head)
    return (int(m.group(1).replace(b",", b"")), m.end()) if m else (0, 0)
