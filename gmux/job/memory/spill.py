"""Spilling: a suspended job's host copy goes to a file and comes back, checked.

When gmuxd's host-RAM budget for suspended jobs runs out, it tells a suspended job to spill: the job writes
its host copy to a file and frees the buffer, in its own process (so an unmodified script, which cannot restart
from a checkpoint, can spill too); its resume reads the file back first. The file is not durable (it dies with
its process) but is never read half-written or damaged: it appears whole (renamed into place), its length and
crc32 are kept in memory and checked on the way back, and a mismatch names the file.
"""
from __future__ import annotations

import os

import numpy as np

from gmux.job.crc import crc32
from gmux.util.atomic import atomic_open

CHUNK = 64 << 20   # bytes per write/read and crc32 update: no second copy of the whole state in memory


class SpillError(RuntimeError):
    pass


class SpillFile:
    """One spilled host copy: where it is, how long, and its checksum."""

    def __init__(self, path: str, nbytes: int, crc: int):
        self.path, self.nbytes, self.crc = path, nbytes, crc

    @classmethod
    def write(cls, path: str, data: np.ndarray) -> "SpillFile":
        """Writes the bytes of `data` (a flat uint8 array) to `path`."""
        crc = 0
        with atomic_open(path, durable=False) as f:
            for lo in range(0, len(data), CHUNK):
                piece = data[lo:lo + CHUNK]
                crc = crc32(piece, crc)
                f.write(piece)
        return cls(path, len(data), crc)

    def check_size(self) -> None:
        """Raises SpillError unless the file is there, whole; cheap, so callers do it before allocating."""
        try:
            size = os.path.getsize(self.path)
        except OSError as e:
            raise SpillError(f"spill file {self.path}: {e.strerror}; the suspended state is in it") from None
        if size != self.nbytes:
            raise SpillError(f"spill file {self.path}: {size} bytes, {self.nbytes} were written")

    def read_into(self, data: np.ndarray) -> None:
        """Reads the file into `data` (nbytes long; after check_size), checks it, and deletes it once the bytes
        are back."""
        got = 0
        with open(self.path, "rb") as f:
            for lo in range(0, self.nbytes, CHUNK):
                n = f.readinto(memoryview(data[lo:lo + CHUNK]))
                got = crc32(data[lo:lo + n], got)
        if got != self.crc:
            raise SpillError(f"spill file {self.path}: checksum mismatch (crc32 {got:#010x}, written {self.crc:#010x})")
        os.unlink(self.path)
