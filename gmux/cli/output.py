"""What a command-line tool does when the program reading its output goes away (`gmux ps | head -1`)."""
from __future__ import annotations

import os
import sys


def reader_gone() -> int:
    """The exit status once the reader has closed the pipe: it has what it wanted. Standard output is pointed at
    /dev/null first, or Python's flush of it at exit would fail again with a traceback."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1
