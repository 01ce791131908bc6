"""Host-to-host copies of many byte ranges: the state tier's copy engine on the CPU (virtual GPUs).

torch's copy_ splits every copy across its intra-op threads, which for the many medium-sized storages of a
model costs up to 3x on a busy machine (the multiplexer's normal state); a fixed split of whole pieces keeps
each thread streaming. numpy's copy releases the GIL.
A small range is copied at once by address: wrapping it in tensors and arrays first costs more than the copy,
and a suspend's latency is mostly such per-storage overhead for a model of small layers.
"""
from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np


class Copier:
    """Copies many CPU byte ranges with one plain memcpy per piece, pieces spread over a few threads."""

    PIECE = 32 << 20
    SMALL = 1 << 20

    def __init__(self):
        self.threads = max(1, min(4, os.cpu_count() or 1))
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="gmux-copy") if self.threads > 1 else None

    def copy(self, ranges: list[tuple[int, int, int]]) -> None:
        """ranges: (destination address, source address, bytes)."""
        pieces = []
        for dst, src, n in ranges:
            if n < self.SMALL:
                ctypes.memmove(dst, src, n)
                continue
            d, s = _array_at(dst, n), _array_at(src, n)
            pieces += [(d[lo:lo + self.PIECE], s[lo:lo + self.PIECE]) for lo in range(0, n, self.PIECE)]
        if self._pool is None or len(pieces) < 2 or sum(d.nbytes for d, _ in pieces) < self.PIECE:
            for d, s in pieces:
                np.copyto(d, s)
            return
        share = [pieces[i::self.threads] for i in range(self.threads)]
        for f in [self._pool.submit(_copy_all, part) for part in share if part]:
            f.result()


def _copy_all(pieces) -> None:
    for d, s in pieces:
        np.copyto(d, s)


def _array_at(address: int, nbytes: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=np.uint8)
