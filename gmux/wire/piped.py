"""A received checkpoint handed to the process that restores it through a pipe, never a file (issue 15, item 1).

A move's target process is started, and waits for its checkpoint (gmux.wire.arriving), before the source
suspends; what arrives for it need not outlive a crash (the source holds the job until the target restored).
Appending it to a file cost this VM 1.3-3.6 s per GiB in page-cache pages faulted in for the first time, and
held the whole checkpoint in the page cache; a pipe reuses the same 1 MiB. So where the receiver knows a
reader waits (gmux.wire.receiver.Receiver.expect_reader), NAME.part is a FIFO that a thread of its own fills in
order, and the receiver's loop never blocks on it. The thread splices the chunks (gmux.util.splice: the reader's
read is the only copy) and closes its end only once the reader has read them all.

The names keep their meaning: NAME.part is renamed NAME.ckpt once the transfer completed, before the writer
closes its end, so a reader that sees the end of the stream and finds its FIFO named NAME.ckpt knows it has
all of it; a FIFO unlinked (given up) tells it the transfer failed.

Memory: chunks wait in the writer's queue only while the reader is slower than the network, or while no reader
has opened the FIFO yet, and never more than QUEUE_BYTES of them: `room` says how much more it takes, the
receiver refuses a chunk beyond it and tells its sender the room left, and the sender keeps no more than that in
flight (gmux.wire.transfer). A reader that never comes (its process died first) does not hold them for long: the
writer gives up once its FIFO is gone (the start that waited for it is over: gmux.node.cluster_starts deletes
it once complete) or after `patience` seconds.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import queue
import select
import threading
import time
from typing import Optional

from gmux.util.splice import PipeWriter

PIPE_BYTES = 1 << 20
QUEUE_BYTES = 32 << 20   # two senders' windows: a reader as fast as the network never sees it full
LOOK_S = 0.002       # between attempts to open the FIFO while no reader has


class Piped:
    """A FIFO at `path`, to be renamed `final` once complete, and the thread that writes into it, in order,
    what `put` is given."""

    def __init__(self, path: str, final: str, patience: float):
        self.names, self.patience = (path, final), patience
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)          # a partial file, or a FIFO left by a receiver that stopped
        os.mkfifo(path, 0o600)
        self.error: Optional[OSError] = None
        self._stop = threading.Event()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._queued = 0                      # bytes put and not yet written
        self._count = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="gmux-piped", daemon=True)
        self._thread.start()

    @property
    def room(self) -> int:
        """How many more bytes `put` may queue now."""
        return max(0, QUEUE_BYTES - self._queued)

    def put(self, data: bytes) -> None:
        """Queues a chunk (the caller keeps within `room`); raises the OSError that stopped the writer (its
        reader gone, say)."""
        if self.error is not None:
            raise self.error
        if self._stop.is_set():
            raise OSError(errno.EPIPE, "no process will read it any more (its FIFO is gone)")
        with self._count:
            self._queued += len(data)
        self._queue.put(data)

    def end(self) -> None:
        """Nothing more comes (the FIFO was renamed to its final name): the writer closes its end once it has
        written everything."""
        self._queue.put(None)

    def abort(self) -> None:
        """Stops the writer and drops what it has not written; its FIFO is the caller's to unlink."""
        self._stop.set()
        self._queue.put(None)

    def fail(self, error: OSError) -> None:
        """As `abort`, for a reason that `put` raises from now on (the process to read it has ended)."""
        self.error = error
        self.abort()

    def join(self, timeout: Optional[float] = None) -> None:
        self._thread.join(timeout)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def _run(self) -> None:
        fd = None
        try:
            fd = self._open()
            if fd is None:
                return
            pipe = PipeWriter(fd)
            while not self._stop.is_set():
                data = self._queue.get()
                if data is None:
                    pipe.drain(stop=self._stop.is_set)
                    return
                self._write(pipe, memoryview(data))
                with self._count:
                    self._queued -= len(data)
        except OSError as e:
            if e.errno == errno.EPIPE:
                e = OSError(errno.EPIPE, "the process restoring it stopped reading (it ended)")
            self.error = e
        finally:
            if fd is not None:
                os.close(fd)
            self._stop.set()
            while not self._queue.empty():     # nothing more will be written: free the memory now
                self._queue.get_nowait()
            with self._count:
                self._queued = 0

    def _open(self) -> Optional[int]:
        """The FIFO's writing end, once a reader has opened it; None if given up first."""
        deadline = time.monotonic() + self.patience
        while not self._stop.is_set():
            try:
                fd = self._open_either()
            except OSError as e:
                if e.errno == errno.ENOENT:
                    return None                # unlinked: its start is over, or its transfer given up
                if e.errno != errno.ENXIO:     # ENXIO: no reader yet
                    raise
                if time.monotonic() > deadline:
                    raise OSError(errno.ETIMEDOUT, f"no process opened it to restore within {self.patience:g} s")
                time.sleep(LOOK_S)
                continue
            with contextlib.suppress(OSError):    # (capped by /proc/sys/fs/pipe-max-size)
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            return fd
        return None

    def _open_either(self) -> int:
        """Its partial name first: should that be gone, the rename to the final one has happened already."""
        try:
            return os.open(self.names[0], os.O_WRONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return os.open(self.names[1], os.O_WRONLY | os.O_NONBLOCK)

    def _write(self, pipe: PipeWriter, view: memoryview) -> None:
        while view and not self._stop.is_set():
            try:
                view = view[pipe.write(view):]
            except BlockingIOError:               # full: the reader is busy; wake up to see _stop now and then
                wait_ready(pipe.fd, select.POLLOUT, 100)


def wait_ready(fd: int, event: int, ms: int) -> None:
    """Until `fd` is ready for `event` or `ms` have passed (poll, not select: a daemon's fds may pass 1024)."""
    p = select.poll()
    p.register(fd, event)
    p.poll(ms)
