"""A submitted job's log deleted while the job runs (a careless `rm` of the logs) is still the file the job writes
to: `gmux logs` reads it through the job's stdout in /proc, so its output stays in view until the job ends."""
from __future__ import annotations

import os
from typing import Optional

from gmux.util.text import file_end


def read_deleted(pid: int, path: str, max_bytes: int, lines: int = 0) -> Optional[tuple[bytes, int]]:
    """The end of the deleted log at `path` that process `pid` still writes to (its stdout or stderr), or None;
    cut as `file_end` cuts, with the bytes before it.
    What was opened is checked after opening, as the job may point its descriptors anywhere at any moment: a
    daemon running as root must show the log, never another file the job holds that its user may not read."""
    for fd in (1, 2):
        try:
            mine = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if os.readlink(f"/proc/self/fd/{mine}") == f"{path} (deleted)" and os.fstat(mine).st_nlink == 0:
                return file_end(f"/proc/self/fd/{mine}", max_bytes, lines)
        except OSError:
            pass
        finally:
            os.close(mine)
    return None
