"""Processes: spawning submitted jobs with their logs, and finding out how any job's process ended.

gmuxd spawns a submitted job as `gmux-launch --job ID -- argv` (token in its environment) in its own session (so a daemon
restart or a terminal hang-up does not take the job with it), output appended to logs/ID.log. A job started
by gmux-launch from a shell is not gmuxd's child, and neither are its own children after a daemon restart:
for those the launcher leaves an exit record (exits/ID.exit) and a missing record means the process was
killed outright (SIGKILL, the OOM killer).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Optional

from gmux.node.jobs import Job
from gmux.rundir import RuntimeDir, alive, read_exit


class Supervisor:
    def __init__(self, rundir: RuntimeDir):
        self.rundir = rundir
        # Popen objects are kept so that poll() reaps exactly our children and reads their status.
        self.children: dict[int, subprocess.Popen] = {}

    def spawn(self, job: Job) -> int:
        cmd = [sys.executable, "-m", "gmux.cli.launch", "--runtime-dir", self.rundir.root, "--job", job.id,
               *([] if job.hook else ["--no-hook"]), "--", *job.argv]
        # The token travels in the environment, not on the command line that `ps` shows to everyone.
        env = {**os.environ, **job.env, "GMUX_RUNTIME_DIR": self.rundir.root, "GMUX_JOB_TOKEN": job.token}
        with os.fdopen(self.rundir.open_private(self.rundir.log_file(job.id), append=True), "ab") as log:
            p = subprocess.Popen(cmd, cwd=job.cwd or None, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        self.children[p.pid] = p
        return p.pid

    def ended(self, job: Job) -> Optional[tuple[str, Optional[int], str]]:
        """(state, exit status, what happened) if the job's process has ended, else None."""
        p = self.children.get(job.pid)
        if p is not None:
            rc = p.poll()
            if rc is None:
                return None
            del self.children[job.pid]
            return describe(rc, read_exit(self.rundir, job.id))
        if alive(job.pid, job.starttime):
            return None
        record = read_exit(self.rundir, job.id)
        if record is not None:
            return describe(record.get("status", 1), record)
        return ("lost", None, f"process {job.pid} ended without an exit record: killed by a signal "
                              f"(SIGKILL, the OOM killer) or crashed hard")

    def kill(self, job: Job, sig: int = signal.SIGKILL) -> bool:
        # Only a process identified by pid *and* start time: never a reused pid, never on a bare pid's word.
        if job.pid <= 1 or job.starttime is None or not alive(job.pid, job.starttime):
            return False
        try:
            os.kill(job.pid, sig)
            return True
        except ProcessLookupError:
            return False


def describe(rc: int, record: Optional[dict]) -> tuple[str, Optional[int], str]:
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        return ("killed", rc, f"killed by signal {-rc} ({name})")
    reason = (record or {}).get("reason") or ""
    if rc == 0:
        return ("exited", 0, reason or "finished")
    return ("failed", rc, f"exit status {rc}" + (f": {reason}" if reason else "") + "; see `gmux logs`")
