"""Writes into a pipe without copying the bytes: vmsplice(2) hands the pipe the pages where they lie, and the
reader's read() is the only copy.

A move's checkpoint crosses two pipes (from the job to its link, and from the target's link to the new process:
gmux.job.job, gmux.wire.piped); on this project's VM a write() into a pipe cost as much CPU as the read out of
it, about 1 s per GiB each, and vmsplice halves a pipe's cost.

The pipe refers to the writer's memory until its reader has read it, so what was spliced must stay as it is
until then. `PipeWriter` keeps a reference to each spliced piece until the pipe says (FIONREAD) that its reader
has read that far, and `drain` waits until the reader has read everything or is gone; a writer calls it before
it closes its end. The owner of a piece must not change it meanwhile either: callers splice immutable bytes, or
the state of a job that stands still while it is written. Small pieces, and every piece where the kernel
refuses vmsplice (another kernel, a seccomp profile; or GMUX_VMSPLICE=off), are written as usual.
"""
from __future__ import annotations

import errno
import fcntl
import functools
import os
import select
import struct
import termios
from collections import deque

SPLICE_FROM = 64 << 10      # below this a plain write's copy costs less than the page bookkeeping
SPLICE_F_NONBLOCK = 0x02    # (vmsplice blocks on a full pipe whatever the fd's O_NONBLOCK says)


@functools.cache
def _vmsplice():
    """(ffi, libc), or None where libc has no vmsplice. Loaded on first use: cffi's parser costs ~50 ms to
    import, which a process that never writes into a pipe should not pay."""
    import cffi
    ffi = cffi.FFI()
    ffi.cdef("struct iovec { void *iov_base; size_t iov_len; };"
             "ssize_t vmsplice(int fd, const struct iovec *iov, unsigned long nr_segs, unsigned int flags);")
    try:
        libc = ffi.dlopen(None)
        libc.vmsplice   # noqa: B018 - (a libc without it: plain writes)
    except (OSError, AttributeError):
        return None
    return ffi, libc


def unread(fd: int) -> int:
    """Bytes in the pipe that its reader has not read yet."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


class PipeWriter:
    """The writing end `fd` of a pipe (blocking or not: `write` behaves as os.write on it, BlockingIOError
    included). The fd stays the caller's to close, after `drain`."""

    def __init__(self, fd: int):
        self.fd = fd
        self.written = 0
        self._held: deque = deque()           # (end offset, piece): spliced, maybe not read yet
        self._small = bytearray()             # write_all's small pieces, written together
        self._splice = os.environ.get("GMUX_VMSPLICE") != "off" and _vmsplice() is not None
        self._flags = 0 if self._splice and os.get_blocking(fd) else SPLICE_F_NONBLOCK

    def write(self, data) -> int:
        """Writes some of `data` (a contiguous buffer), as os.write does; returns how many bytes."""
        view = memoryview(data).cast("B")
        n = self._spliced(view) if self._splice and len(view) >= SPLICE_FROM else None
        if n is None:
            n = os.write(self.fd, view)
        self.written += n
        self._release()
        return n

    def write_all(self, data) -> None:
        """All of `data`, on a blocking fd; small pieces are gathered and written with the next large one, or
        by `flush`."""
        view = memoryview(data).cast("B")
        if len(view) < SPLICE_FROM:
            self._small += view
            if len(self._small) < SPLICE_FROM:
                return
            view, self._small = memoryview(self._small), bytearray()   # (the gathered ones, never changed again)
        else:
            self.flush()
        self._out(view)

    def flush(self) -> None:
        small, self._small = self._small, bytearray()
        self._out(memoryview(small))

    def _out(self, view: memoryview) -> None:
        while view:
            view = view[self.write(view):]

    def _spliced(self, view: memoryview):
        ffi, libc = _vmsplice()
        iov = ffi.new("struct iovec *", {"iov_base": ffi.from_buffer(view), "iov_len": len(view)})
        n = libc.vmsplice(self.fd, iov, 1, self._flags)
        if n >= 0:
            self._held.append((self.written + n, view))
            return n
        err = ffi.errno
        if err == errno.EAGAIN:
            raise BlockingIOError(err, os.strerror(err))
        if err in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.EFAULT, errno.EBADF):
            self._splice = False              # this kernel or fd does not splice: plain writes from now on
            return None
        raise OSError(err, os.strerror(err))

    def _release(self) -> None:
        if not self._held:
            return
        read_up_to = self.written - unread(self.fd)
        while self._held and self._held[0][0] <= read_up_to:
            self._held.popleft()

    def drain(self, poll_ms: int = 5, stop=None) -> None:
        """Until the reader has read every spliced byte, or has closed its end (nothing spliced can be read
        then), or `stop()` says so (the caller gives the stream up: what its reader may still read is not
        believed). Small pieces still gathered are written first."""
        self.flush()
        p = select.poll()
        p.register(self.fd, 0)                # only POLLERR: the reader closed its end
        while self._held:
            self._release()
            if not self._held or (stop is not None and stop()):
                break
            if any(ev & select.POLLERR for _, ev in p.poll(poll_ms)):
                break
        self._held.clear()
