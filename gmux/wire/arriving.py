"""A checkpoint read while its transfer still writes it: a move's new process restores as the bytes arrive,
instead of after the last one.

A receiver (gmux.wire.receiver.Receiver) appends to NAME.part and renames it to NAME.ckpt once the sender has
completed the transfer (the source's job vouched for its checkpoint). `Arriving(path)` reads NAME.ckpt from the
partial file as it grows: a read at the end of what has landed waits for more, and the stream ends only once
the file is complete (renamed), so a reader that reads to the end of the stream (gmux.job.checkpoint: nothing
may follow the END frame) never accepts bytes of a transfer that was not completed. A partial file given up
(discarded, or begun again) or silent for `wait` seconds ends the stream with a TransferError.

The partial file may be a FIFO (gmux.wire.piped: the receiver knew this process would read it): the same
names, the same rules. It is opened without blocking, so that no writer yet is no data yet, not a wait in
open(); the end of its stream is the writer closing its end once the FIFO has its final name."""
from __future__ import annotations

import io
import os
import select
import stat
import time

from gmux.wire.piped import wait_ready
from gmux.wire.receiver import partial_path
from gmux.wire.transfer import TransferError

POLL_S = 0.002     # between looks at a file that has no new bytes yet (a 1 MiB chunk lands every ~4 ms at 250 MB/s)


class Arriving(io.RawIOBase):
    def __init__(self, path: str, wait: float):
        self.name, self.wait = path, wait
        self._part = partial_path(path)
        self._fd = self._open()
        self._fifo = stat.S_ISFIFO(os.fstat(self._fd).st_mode)
        self._got = 0                 # bytes read
        self._complete = False

    def _open(self) -> int:
        deadline = time.monotonic() + self.wait
        while True:
            for p in (self.name, self._part):     # the final name first: a partial file may be renamed meanwhile
                try:
                    return os.open(p, os.O_RDONLY | os.O_NONBLOCK)
                except FileNotFoundError:
                    pass
            if time.monotonic() > deadline:
                raise TransferError(f"{self.name}: the checkpoint to restore did not arrive within {self.wait:g} s")
            time.sleep(POLL_S)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        idle_since = time.monotonic()
        while True:
            try:
                n = os.readv(self._fd, [buffer])
            except BlockingIOError:            # a FIFO whose writer has written nothing more yet
                n = None
            if n or (n == 0 and self._complete):
                self._got += n
                return n
            if n == 0 and self._completed():
                self._complete = True        # read again: bytes may have landed just before the rename
                continue
            if time.monotonic() - idle_since > self.wait:
                raise TransferError(f"{self.name}: no bytes of the checkpoint arrived for {self.wait:g} s")
            if n is None:
                wait_ready(self._fd, select.POLLIN, int(POLL_S * 50 * 1000))
            else:
                time.sleep(POLL_S)

    def _completed(self) -> bool:
        """Whether the file this reads is now NAME.ckpt (its transfer completed); raises if it was given up.
        A FIFO read to its end before its first byte has only not had its writer yet: a complete one had to
        pass at least its header through it."""
        mine = os.fstat(self._fd)
        if mine.st_nlink == 0:
            raise TransferError(f"{self.name}: its transfer was given up after {self._got} bytes (the partial "
                                f"file was discarded)")
        if self._fifo and not self._got:
            return False
        try:
            final = os.stat(self.name)
        except FileNotFoundError:
            return False
        return (final.st_ino, final.st_dev) == (mine.st_ino, mine.st_dev)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()
