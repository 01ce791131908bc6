"""A script's own signal handlers wait while its job is held.

From a suspend's first copy to its resume's last the job's tensors are, or may partly be, off the device. A
handler the script installed (a SIGTERM that saves a checkpoint and exits, as scripts written for SLURM or
Kubernetes preemption do; a SIGUSR1 that saves and requeues) run there saved the emptied tensors over the script's
last good checkpoint. So while held, a signal whose handler is a Python function of the script's is noted, not
run, and raised again once the state is back: the handler then sees what it expects. A job that leaves while held
(told to exit, moved to a new process) says which handlers it did not run.

Ctrl-C is not deferred: gmux-launch ends a held job on it (gmux.job.launch), and in a script that drives itself
it stays Python's KeyboardInterrupt. A signal without a Python handler keeps its default action (SIGTERM ends the
process at once, and runs nothing of the script's). Handlers are the main thread's: a job whose boundaries come in
another thread is held there without this.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

_NEVER = {signal.SIGINT, signal.SIGKILL, signal.SIGSTOP}


@contextlib.contextmanager
def deferred():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def note(signum, _frame) -> None:
        if signum not in pending:
            pending.append(signum)

    theirs = {}
    for sig in signal.valid_signals() - _NEVER:
        try:
            handler = signal.getsignal(sig)
            if callable(handler):
                signal.signal(sig, note)
                theirs[sig] = handler
        except (OSError, ValueError):    # (one Python may not handle)
            continue
    left = True
    try:
        yield
        left = False
    finally:
        for sig, handler in theirs.items():
            signal.signal(sig, handler)
        if pending and left:
            print(f"gmux: {_names(pending)} came while the job was held, and it leaves: its script's handler was "
                  f"not run (its state was off the device)", file=sys.stderr, flush=True)
        elif pending:
            for sig in pending:
                signal.raise_signal(sig)      # (its handler runs now, with the state back on the device)


def _names(sigs: list[int]) -> str:
    return ", ".join(signal.Signals(s).name for s in sigs)
