"""A long-running loop's own failures: each part fails alone, is counted, and is logged without flooding the log.

A daemon's periodic work (gmuxd's tick) runs every few tens of milliseconds for every user's jobs. An unexpected
exception in one part of it (one GPU's packing decision, the reaping of one job) is a bug; letting it end the
process would take away the control of every other job on the machine too, and a bug that the persisted state
triggers would end each restart alike. So each part runs under `guard`: its exception is counted, its traceback
logged the first time and then at most once every `every_s` with how often it failed since, and the loop goes on
with the other parts. The count is the daemon's `internal_errors`, which its tests assert stays 0.
"""
from __future__ import annotations

import contextlib
import logging
import time


class Faults:
    def __init__(self, log: logging.Logger, every_s: float = 60.0):
        self.log = log
        self.every_s = every_s
        self.count = 0
        self._seen: dict[str, list] = {}    # part -> [failures not yet logged, when last logged]

    @contextlib.contextmanager
    def guard(self, part: str, detail: str = ""):
        """`part` names what failed (and is what the log is rate-limited by); `detail` (a job's id) is logged."""
        try:
            yield
        except Exception:
            self.count += 1
            now = time.monotonic()
            seen = self._seen.get(part)
            what = f"{part} ({detail})" if detail else part
            if seen is None:
                self._seen[part] = [0, now]
                self.log.exception("internal error in %s (the other parts go on; logged again at most every "
                                   "%.0f s while it recurs)", what, self.every_s)
            elif now - seen[1] >= self.every_s:
                self.log.exception("internal error in %s again (%d more times since it was last logged)",
                                   what, seen[0] + 1)
                seen[:] = [0, now]
            else:
                seen[0] += 1
