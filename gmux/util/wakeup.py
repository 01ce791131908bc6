"""A loop asleep in zmq.Poller.poll woken by another thread: a byte on a pipe whose reading end the poller
watches (zmq.Poller takes its file descriptor beside sockets, and names it by that number when it is
ready). Queue the work first, then `set()`."""
from __future__ import annotations

import contextlib
import os
import threading


class Wakeup:
    def __init__(self):
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Lock()     # a thread that sets after close() must not write to a reused fd

    def fileno(self) -> int:
        return self._r

    def set(self) -> None:
        with self._lock, contextlib.suppress(BlockingIOError):    # (a full pipe: the loop is woken already)
            if self._w is not None:
                os.write(self._w, b"\0")

    def clear(self) -> None:
        """The loop, once woken: reads what was written (any number of sets wake it once)."""
        with contextlib.suppress(BlockingIOError):
            os.read(self._r, 4096)

    def close(self) -> None:
        with self._lock:
            if self._w is not None:
                os.close(self._r)
                os.close(self._w)
                self._w = None
