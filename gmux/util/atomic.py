"""Atomic files: a reader sees the old file or the new one, never half of one.

Write to a temporary file beside the target, fsync it, rename it over the target, fsync the directory (so the
rename itself survives a crash). A failure at any point removes the temporary file and leaves the target as it
was.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator


def _partial_prefix(path: str) -> str:
    return f".{os.path.basename(path)}."


def partials(path: str) -> list[str]:
    """The temporary files that writers of `path` killed mid-write left beside it."""
    directory, prefix = os.path.dirname(os.path.abspath(path)), _partial_prefix(path)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names if n.startswith(prefix) and n.endswith(".tmp")]


@contextlib.contextmanager
def atomic_open(path: str, mode: int = 0o600, text: bool = False, durable: bool = True) -> Iterator[IO]:
    """Yields a file to write; on a clean exit it replaces `path`. `mode` is the new file's permission bits.
    durable=False skips the fsyncs, for files that need not survive a machine crash (a spill file dies with
    its process anyway) but must never be seen half-written."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=_partial_prefix(path), suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        # Buffered, binary too: a raw write may write only part of what it is given (a disk that fills up does,
        # before it says ENOSPC), and a caller that took it as whole renamed a truncated file into place. A
        # buffered write writes it all or raises.
        with os.fdopen(fd, "w" if text else "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_atomic(path: str, data: bytes, mode: int = 0o600) -> None:
    with atomic_open(path, mode) as f:
        f.write(data)
