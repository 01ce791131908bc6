"""Reading exactly n bytes from a source that may hold fewer (an untrusted checkpoint), never allocating for
bytes it does not hold."""
from __future__ import annotations

from typing import BinaryIO, Optional


class BoundedReader:
    """Reads exactly n bytes (fewer only at the end of the stream), never allocating for bytes the source does
    not hold: `left` is what a file (or any seekable source) still holds; for a stream of unknown length the
    buffer grows `step` bytes at a time as the bytes arrive. `into` fills a buffer the caller has (tensor
    data goes straight to its place)."""

    def __init__(self, source: BinaryIO, step: int):
        self.source, self.left, self.step = source, _remaining(source), step

    def __call__(self, n: int) -> bytearray:
        if self.left is not None:
            n = min(n, self.left)
        buf, got = bytearray(min(n, self.step)), 0
        while got < n:
            if got == len(buf):
                buf.extend(bytes(min(n - got, self.step)))
            with memoryview(buf) as view, view[got:] as tail:   # released before buf is resized
                k = self._fill(tail)
            if not k:
                break
            got += k
        del buf[got:]
        return buf

    def into(self, view: memoryview) -> int:
        got = 0
        while got < len(view):
            k = self._fill(view[got:])
            if not k:
                break
            got += k
        return got

    def _fill(self, view: memoryview) -> int:
        k = self.source.readinto(view) or 0
        if self.left is not None:
            self.left -= k
        return k


def _remaining(source: BinaryIO) -> Optional[int]:
    try:
        if not source.seekable():
            return None
        here = source.tell()
        end = source.seek(0, 2)
        source.seek(here)
        return max(0, end - here)
    except (AttributeError, OSError, ValueError):
        return None
