"""A script's own signal handlers wait while its job is held.

From a suspend's first copy to its resume's last the job's tensors are, or may partly be, off the device. A
handler the script installed (a SIGTERM that saves a checkpoint and exits, as scripts written for SLURM or
Kubernetes preemption do; a SIGUSR1 that saves and requeues; a Ctrl-C that sets a stop flag) run there saved the
emptied tensors over the script's last good checkpoint. So while held, a signal whose handler is a Python function
of the script's is noted (with a line in the job's log: a supervisor waiting for it may escalate), not run, and
raised again once the state is back: the handler then sees what it expects. A job that moves to a new process
while one is pending takes it along (gmux.job.launch raises it there once the state is restored: `carried`).

Python's own Ctrl-C (KeyboardInterrupt) is not deferred: gmux-launch ends a held job on it, and in a script that
drives itself it stays Python's. A signal ignored stays ignored, and one without a Python handler keeps its
default action (SIGTERM ends the process at once, and runs nothing of the script's; gmux-launch leaves a record
that says so). Handlers are the main
thread's: a job whose boundaries come in another thread is held there without this.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading

ENV = "GMUX_HELD_SIGNALS"     # signals carried into a move's new process, by name
HANDLED = "GMUX_HANDLED_SIGNALS"   # those the old process's script handled: noted in the new one until restored
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}
_UNSAID = {signal.SIGCHLD, signal.SIGWINCH}    # news, not requests (a loader's worker ended, a terminal resized)
unrun: list[int] = []          # noted while held by a span the process left (a move, an exit) without raising them


def _noter(pending: list):
    def note(signum, _frame) -> None:
        if signum not in pending:
            pending.append(signum)
            if signum in _UNSAID:
                return
            with contextlib.suppress(OSError):      # (raw: a handler may not print; a closed stderr is no error)
                os.write(2, f"gmux: {signal.Signals(signum).name} came while gmuxd holds the job: its script's "
                            f"handler runs once its state is back on the device\n".encode())
    return note


@contextlib.contextmanager
def deferred():
    """Defers the script's handlers for the span; yields the signals noted so far and those deferred (live
    lists)."""
    pending: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pending, []
        return
    note = _noter(pending)

    theirs = {}
    for sig in signal.valid_signals() - _UNCATCHABLE:
        try:
            handler = signal.getsignal(sig)
            if callable(handler) and handler is not signal.default_int_handler:
                signal.signal(sig, note)
                theirs[sig] = handler
        except (OSError, ValueError):    # (one Python may not handle)
            continue
    left = True
    try:
        yield pending, list(theirs)
        left = False
    finally:
        for sig, handler in theirs.items():
            signal.signal(sig, handler)
        if left:
            unrun.extend(s for s in pending if s not in unrun)
        else:
            for sig in pending:
                signal.raise_signal(sig)      # (its handler runs now, with the state back on the device)


def names(sigs) -> str:
    return ",".join(signal.Signals(s).name for s in sigs)


def carried(text: str | None) -> list[int]:
    """The signals a move's old process passed on (ENV), each a catchable signal's name; others are dropped."""
    out = []
    for name in (text or "").split(","):
        sig = signal.Signals.__members__.get(name)
        if sig is not None and sig not in _UNCATCHABLE and sig not in out:
            out.append(sig)
    return out


class Restoring:
    """A move's new process, from its start to its first boundary: the script runs from its top (installing its
    handlers) before its state is restored, so a handler run there saved the untrained model over the user's
    checkpoint, and a SIGTERM as it waited for its turn killed the job. The signals its old process's script
    handled are noted here, and what the script installs for them (and for those in `aside`, whose handler now
    stays: SIGINT, the launcher's) is kept aside, as `signal.getsignal` shows it, until `end`."""

    def __init__(self, sigs: list, aside=()):
        self.pending: list[int] = []
        self.installed: dict = {}
        self.watched = set(sigs) | set(aside)
        self._signal, self._getsignal = signal.signal, signal.getsignal
        note = _noter(self.pending)
        for sig in sigs:
            self._signal(sig, note)
        signal.signal, signal.getsignal = self._set, self._get

    def _set(self, sig, handler):
        if sig not in self.watched or threading.current_thread() is not threading.main_thread():
            return self._signal(sig, handler)
        before = self._get(sig)
        self.installed[sig] = handler
        return before

    def _get(self, sig):
        if sig not in self.watched:
            return self._getsignal(sig)
        return self.installed.get(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)

    def end(self) -> list[int]:
        """Installs what the script set, and returns the signals noted meanwhile (to raise, now restored)."""
        signal.signal, signal.getsignal = self._signal, self._getsignal
        for sig in self.watched:
            self._signal(sig, self._get(sig))
        return self.pending
