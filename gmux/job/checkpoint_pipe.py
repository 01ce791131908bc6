"""A checkpoint written into a pipe whose reader sends it on as it comes (a cross-machine move's:
gmux.node.cluster_stream reads it): no file, no fsync, nothing held whole."""
from __future__ import annotations

import errno
import os
import stat
import struct
import time

from gmux.util.splice import PipeWriter

from . import checkpoint as ckpt


def is_fifo(path) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def stream(snap: dict, path: str, resolve, held=None, wait_s: float = 30.0) -> int:
    """The checkpoint `snap` into the pipe at `path`, its size's upper bound first (gmux.wire.transfer's streams);
    its bytes. The reader opened it before asking for the checkpoint; should it be gone, wait_s bounds the wait."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)   # fails (ENXIO) while no reader holds it open
            break
        except OSError as e:
            if e.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    os.set_blocking(fd, True)
    try:
        # Spliced, not copied (gmux.util.splice): the job stands still until this returns, and it returns only
        # once its reader has read every byte that refers to its memory.
        pipe = PipeWriter(fd)
        nbytes = ckpt.write(snap, pipe.write_all, resolve,
                            announce=lambda n: pipe.write_all(struct.pack("<Q", n)), held=held)
        pipe.drain()
        return nbytes
    finally:
        os.close(fd)
