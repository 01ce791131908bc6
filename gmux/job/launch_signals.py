"""What a signal does to a job gmux-launch holds: before its script runs, while gmuxd holds it suspended, and as
it moves to a new process, none of the script's code may run (its state is off the device, or not restored yet).

Ctrl-C there (before the script runs: as gmux-launch imports torch, registers, waits for its first turn) ends the
job in one line, with status 130 and an exit record that says when: a KeyboardInterrupt's traceback through gmux's
own wait tells the user nothing, and a suspended script's handler would run with its state off the device (a
`torch.save` there wrote garbage over the last good checkpoint, or crashed). Elsewhere in the script it is the
script's own KeyboardInterrupt, as it is in a process forked from this one (the lease watch, a loader's workers):
while the script runs, outside gmuxd's holds, SIGINT's handler is the one python gives it (asyncio.run installs
its own only over that one). A SIGINT ignored (a job started in the background, or by its script) stays ignored,
and a script's own SIGINT handler waits for the resume as its other handlers do (gmux.job.held_signals).

A signal whose default action ends the process (SIGTERM, SIGHUP...), which the script has no handler for, still
ends a held job at once, by that signal, as its sender expects (torchrun, told Ctrl-C, passes a signal on to its
workers), but with an exit record that says which and when: without one gmuxd could only call the job lost to an
unknown signal. A handler installed below Python (faulthandler, a native library) is left alone. While the script
runs the default action stays the kernel's: a handler of Python's would wait for the main thread's next bytecode,
in a long native call until whoever sent the signal gives up and sends SIGKILL.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Optional

from gmux.job.agent import Agent
from gmux.rundir import RuntimeDir, proc_starttime, write_exit
from gmux.util.process_tree import descendants

ENDING = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)


def held_ends(rundir: RuntimeDir, job: Optional[str], restore: Optional[str]) -> dict:
    """Installs the SIGINT handler for the launch (`job`: the id gmuxd gave it already, a move's new process or a
    job gmuxd started; `restore`: the checkpoint it restores from). Returns what the handlers read, for the
    launch to keep up to date (the agent once registered, whether the script has started, whether it moves and
    to which checkpoint, whether it restores), the SIGINT handler (None where SIGINT is ignored), and
    `while_waiting`, which installs the handlers around each span where the job is held."""
    held = {"agent": None, "script": False, "moving": False, "kept": None, "restoring": False, "ending": False}
    interruptible = signal.getsignal(signal.SIGINT) is signal.default_int_handler   # (not one ignored)
    launcher = os.getpid()

    def when() -> tuple[str, Optional[str]]:
        kept = held["kept"] if held["moving"] else restore if held["restoring"] or not held["script"] else None
        return ("during its move to a new process" if held["moving"] else
                "before it registered" if held["agent"] is None else
                "before its state was restored" if held["script"] and held["restoring"] else
                "while suspended by gmuxd" if held["script"] else "before its first turn"), kept

    def end_here(job_id: str, status: int, reason: str, said: str) -> None:
        """Says why the job ends, in its log and its exit record, and to gmuxd."""
        agent = held["agent"]
        with contextlib.suppress(Exception):
            sys.stdout.flush()                  # (what the script printed before is kept)
        with contextlib.suppress(Exception):    # (a print of gmux's own this signal came in the middle of)
            print(said, file=sys.stderr, flush=True)
        write_exit(rundir, job_id, status, reason, left=left_running())
        if agent is None:
            return
        with contextlib.suppress(Exception):     # (gmuxd away, or a move closed the agent: the record says it all)
            agent.bye(status, reason)
            agent.sock.context.destroy(linger=2000)  # (an exit now would drop the bye still queued)

    def on_sigint(signum, frame) -> None:
        if held["ending"]:
            return          # (a second signal while the first ends the job: the first says why)
        agent = held["agent"]
        if os.getpid() != launcher or held["script"] and not (held["moving"] or held["restoring"] or
                                                               _under_suspend() or
                                                               _waiting_in(frame, Agent.wait.__code__)):
            signal.default_int_handler(signum, frame)
        held["ending"] = True
        try:
            job_id = agent.job if agent is not None else job
            if job_id is None:
                print("gmux-launch: interrupted before gmuxd took the job: nothing ran", file=sys.stderr, flush=True)
                return
            at, kept = when()
            end_here(job_id, 130, f"interrupted (SIGINT) {at}" + (f"; its state is kept in {kept}" if kept else ""),
                     f"gmux-launch: job {job_id} interrupted {at}: it ends" + (
                         f" (its state is kept in {kept})" if kept else
                         " (its script's own Ctrl-C handling is not run: its state is off the device)"
                         if held["script"] else ""))
        finally:
            os._exit(130)

    def on_ending(signum, _frame) -> None:
        if held["ending"]:
            return
        held["ending"] = True
        try:
            agent = held["agent"]
            job_id = agent.job if agent is not None else job
            if os.getpid() == launcher and job_id is not None:
                name = signal.Signals(signum).name
                at, kept = when()
                end_here(job_id, 128 + signum, f"ended by {name} {at}, which the script has no handler for" +
                         (f"; its state is kept in {kept}" if kept else ""),
                         f"gmux-launch: job {job_id} got {name} {at}: it ends, as the signal's default action "
                         f"does" + (f" (its state is kept in {kept})" if kept else ""))
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)        # (ended by the signal, as its sender expects: torchrun reads it)
            os._exit(128 + signum)              # (were it blocked in this thread)

    @contextlib.contextmanager
    def while_waiting():
        if threading.current_thread() is not threading.main_thread():
            yield      # (signal handlers are the main thread's to set)
            return
        elsewhere = _caught_below_python()
        ours = {sig: on_ending for sig in ENDING if signal.getsignal(sig) is on_ending or
                signal.getsignal(sig) is signal.SIG_DFL and sig not in elsewhere}
        if interruptible and signal.getsignal(signal.SIGINT) in (signal.default_int_handler, on_sigint):
            ours[signal.SIGINT] = on_sigint      # (one ignored or the script's is kept)
        theirs = {sig: signal.signal(sig, handler) for sig, handler in ours.items()}
        try:
            yield
        finally:
            for sig, handler in theirs.items():
                signal.signal(sig, handler if handler is not None else
                              signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)

    if interruptible:
        signal.signal(signal.SIGINT, on_sigint)
    held.update(handler=on_sigint if interruptible else None, while_waiting=while_waiting)
    return held


def _caught_below_python() -> set:
    """The signals this process catches with a handler Python did not install (faulthandler.register, a native
    library): signal.getsignal says SIG_DFL for them; the kernel's SigCgt mask (/proc/self/status) does not."""
    try:
        with open("/proc/self/status", "rb") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith(b"SigCgt:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return set()
    return {sig for sig in ENDING if mask >> (sig - 1) & 1}


def _under_suspend() -> bool:
    api = sys.modules.get("gmux.job.api")   # (a handler imports nothing: the script may not have torch yet)
    current = api.current() if api is not None else None
    return current is not None and current.under_suspend


def _waiting_in(frame, code) -> bool:
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def left_running() -> list:
    """What this job leaves running, [pid, start time] each, for gmuxd to end with the job: outside its process
    group first (a server in a session of its own, a daemon it double-forked and adopted back, whatever its
    environment says now), then its own descendants in its group. gmuxd ends the group of a job it started, but
    a gmux-launch job's group is its shell's and is left alone: a child the script forked (os.fork carries no
    marks in its starting environment) ran on after the job's end, holding a copy of its memory."""
    group, outside, inside = os.getpgrp(), [], []
    for pid in descendants(os.getpid()):
        try:
            start = proc_starttime(pid)
            (outside if os.getpgid(pid) != group else inside).append([pid, start])
        except ProcessLookupError:
            continue
    return [entry for entry in outside + inside if entry[1] is not None]
