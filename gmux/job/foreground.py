"""gmux-launch in the foreground of a terminal: the shell must never see the job stopped.

gmuxd takes the GPU from a job that does not yield it in time by stopping its process (SIGSTOP). An interactive
shell waits for its foreground job with WUNTRACED: it saw gmux-launch stopped, printed "[1]+ Stopped", took the
terminal back and made the job a background one (Ctrl-C no longer reached it), and when the shell exited the job
was killed by SIGHUP. So gmux-launch there forks first: this process stays the shell's child and only waits,
while the child, in the same process group (Ctrl-C and Ctrl-Z still reach it), becomes the job. Its stops are
not its parent's, and the shell's child ends as the job does, with its status or its signal.
"""
from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def _in_foreground() -> bool:
    """Whether this process leads the foreground process group of its terminal: a job a shell started (gmuxd
    stops a process that leads no group alone, so that one started by a driver script never stops the driver)."""
    if os.getpgrp() != os.getpid():
        return False
    for fd in (0, 1, 2):
        try:
            return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


def fork_if_in_foreground() -> None:
    """Returns in the child (the job) where this process leads a terminal's foreground process group; else
    returns at once. The parent never returns: it exits as the child does."""
    if not _in_foreground():
        return
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        _end_with_parent(parent)
        return
    # What the terminal sends the group reaches the job itself; what is sent to this process alone is passed on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda s, _frame: _pass_on(child, s))
    while True:
        try:
            _, status = os.waitpid(child, 0)    # (without WUNTRACED: the job's stops are not this process's)
            break
        except ChildProcessError:
            os._exit(1)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):      # (which cannot be caught, so never were)
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)               # ended as the job was: the shell says "Killed", not a status
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status))


def _end_with_parent(parent: int) -> None:
    """The job is sent SIGTERM if the process the shell waits for is killed outright (kill -9), which could not
    pass it on: it would train on, orphaned, printing onto the terminal."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # (gone already, before the call: its child went to init or a subreaper)
        os.kill(os.getpid(), signal.SIGTERM)


def _pass_on(child: int, sig: int) -> None:
    try:
        os.kill(child, sig)     # (a job gmuxd stopped holds it until its next turn, as gmuxd continues it)
    except ProcessLookupError:
        pass
