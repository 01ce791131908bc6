"""The fallback memory of a virtual GPU, in pure Python, for where the native pool (gmux._native) is not built
(or a job is run with --no-native): a fixed pool of physical pages that exists before any job and outlives them.
It backs the state tier only; the native Pool (native.py) is preferred and backs the allocator tier.

A real GPU's memory is already there when a job starts; taking it again after a suspend costs an allocator
call, not page faults. On a machine with no GPU the same holds only if "device memory" comes from a pool of
pages faulted in once: fresh anonymous memory costs ~3 s/GiB of page faults, a copy into warm pages ~70 ms/GiB.
The pool is a shared-memory file (so gmuxd can own it and jobs can map it), populated at creation.

Regions are handed out first-fit and come back only when the torch storage over them really dies (a weakref
finalizer on the buffer object torch holds), so a view the runtime did not know about can never see a region
reused by someone else: it keeps the region alive, and `in_use` shows it.

A job with a memory limit (limit.py) counts its pool regions with its tensors: a region is claimed from the
job's count when it is handed out (refused past the limit, with torch's out-of-memory error) and released
when it comes back. A pool that is full refuses with the same error, naming the pool.
"""
from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import threading
import weakref

import torch

from . import limit

ALIGN = 4096


class PoolExhausted(torch.OutOfMemoryError, MemoryError):
    """The virtual GPU's pool has no room: what a GPU out of memory raises (a script's `except
    torch.OutOfMemoryError` catches it), and a MemoryError as before."""


class DevicePool:
    def __init__(self, size: int, path: str | None = None):
        if size <= 0:
            raise ValueError(f"pool size must be positive, got {size}")
        self.size = (size + ALIGN - 1) // ALIGN * ALIGN
        if path is None:
            fd = os.memfd_create("gmux-vgpu", 0)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < self.size:
                os.ftruncate(fd, self.size)
            self._map = mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        finally:
            os.close(fd)
        self.path = path
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, self.size)]  # sorted (offset, length)
        self.in_use = 0

    def holds(self, address: int) -> bool:
        return self.base <= address < self.base + self.size

    def storage(self, nbytes: int) -> torch.UntypedStorage:
        """A CPU storage of `nbytes` over warm pool pages; the region returns to the pool when it dies."""
        length = max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)
        offset = self._take(length)
        limiter = limit.cpu_limit()
        if limiter is not None:
            try:
                limiter.claim(length)
            except BaseException:
                self._give_back(offset, length)
                raise
        region = (ctypes.c_char * length).from_buffer(self._map, offset)
        weakref.finalize(region, self._give_back, offset, length, limiter)
        return torch.frombuffer(region, dtype=torch.uint8, count=nbytes).untyped_storage()

    def _take(self, length: int) -> int:
        with self._lock:
            for i, (offset, free) in enumerate(self._free):
                if free >= length:
                    if free == length:
                        del self._free[i]
                    else:
                        self._free[i] = (offset + length, free - length)
                    self.in_use += length
                    return offset
        raise PoolExhausted(
            f"virtual GPU pool exhausted: {length} bytes asked, {self.size - self.in_use} of {self.size} free "
            f"(largest free run {max((f for _, f in self._free), default=0)})")

    def _give_back(self, offset: int, length: int, limiter=None) -> None:
        if limiter is not None:   # the limiter that counted this region (None: it was not counted)
            limiter.release(length)
        with self._lock:
            self.in_use -= length
            i = bisect.bisect(self._free, (offset, length))
            self._free.insert(i, (offset, length))
            # Coalesce with the neighbours so large regions stay available.
            if i + 1 < len(self._free) and offset + length == self._free[i + 1][0]:
                self._free[i] = (offset, length + self._free[i + 1][1])
                del self._free[i + 1]
            if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == self._free[i][0]:
                prev = self._free[i - 1]
                self._free[i - 1] = (prev[0], prev[1] + self._free[i][1])
                del self._free[i]
