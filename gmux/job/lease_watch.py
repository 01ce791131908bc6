"""The lease of a cluster job that sends gmuxd nothing, watched from a process of its own.

A job that reaches no boundary (an unmodified script whose steps gmux does not see, or one long piece of work) is
never told that gmuxd stopped answering, and trained on beside the copy its scheduler started elsewhere. So it is
watched: it stops as the lease does once no gmuxd has run on the runtime dir for `lease` seconds (one restarted in
time takes the job back), or once the gmuxd there has not beaten for as long (alive, but stopped or hung: it sends
its scheduler nothing either). A pid file the watch may not read (a system daemon's) says only when gmuxd last
beat. The watch is a forked process, not a thread of the job's: a step that holds the GIL for seconds (a sort of
millions of strings, one long C call) kept a thread from running while the copy elsewhere had started.
"""
from __future__ import annotations

import os
import signal
import time

from gmux import protocol
from gmux.rundir import RuntimeDir, alive, write_exit


def lease_lost_reason(job_id: str, waited: float) -> str:
    return (f"{protocol.LEASE_LOST_REASON} for {waited:.1f} s: job {job_id} stopped here, as the cluster scheduler "
            f"starts it again elsewhere from its last checkpoint (two copies must not both train)")


def start(job_id: str, rundir: RuntimeDir, lease: float) -> None:
    """Forks the watch of this process, the job (it ends with the job)."""
    job = os.getpid()
    if os.fork() != 0:
        return
    try:            # (the child of a process with threads: it only sleeps, reads files and signals)
        waited = _until_lost(job, rundir, lease)
        if waited is not None:
            msg = lease_lost_reason(job_id, waited)
            os.write(2, f"gmux-launch: {msg}\n".encode())
            write_exit(rundir, job_id, protocol.LEASE_LOST_STATUS, msg)
            os.kill(job, signal.SIGKILL)        # (no atexit handler runs: it must not write over the new copy's)
    finally:
        os._exit(0)


def _until_lost(job: int, rundir: RuntimeDir, lease: float):
    """Seconds gmuxd has been silent once past the lease; None once the job has ended."""
    gone_since = None
    while os.getppid() == job:
        time.sleep(lease / 5)
        daemon = rundir.daemon_process()    # (None: none, stopped or between two gmuxd, or half written)
        unreadable = daemon is None and os.path.exists(rundir.pid_file) and not os.access(rundir.pid_file, os.R_OK)
        now = time.monotonic()
        gone_since = None if unreadable or daemon is not None and alive(*daemon) else (gone_since or now)
        silence = rundir.daemon_silence()
        if silence is not None and silence > lease:
            return silence
        if gone_since is not None and now - gone_since > lease:
            return now - gone_since
    return None
