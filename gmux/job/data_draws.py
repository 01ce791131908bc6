"""Does a loader's dataset or collate function draw random numbers? Tried once on a first batch, in a child the
job's process forks, as the loader's workers are.

Where a loader's workers carry their random states across epochs (persistent workers) or a restored process
fetches a batch again under other states, only data that draws nothing moves exactly; this is how gmux tells.
The child indexes the dataset's first items and collates them, as the loader's first batch would, and says what
changed in its random states: whatever the dataset opens or caches as it is indexed (a file handle that must
not cross a fork, a counter) stays in the child, and the job's process and its random states are untouched.
"""
from __future__ import annotations

import os
import select
from typing import Optional

import torch

from .state import capture_rng

TRIAL_S = 60.0       # a child that has not answered by then (a lock held across the fork) is killed: unknown


def draws(dataset, collate, size: int) -> Optional[tuple[bool, bool]]:
    """Whether indexing the dataset, and collating a batch of it, draws from the random states: (as indexed,
    as indexed or collated), or None if it cannot be told (the trial failed, or no fork here)."""
    if dataset is None or collate is None or not hasattr(os, "fork"):
        return None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                       # the child: answer, then leave without running anything of the job's
        try:
            os.close(read)
            os.write(write, _tried(dataset, collate, size))
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], TRIAL_S)
        answer = os.read(read, 2) if ready else b""
    finally:
        os.close(read)
        if not answer:
            _kill(pid)
        os.waitpid(pid, 0)
    return (answer[:1] == b"1", answer[1:] == b"1") if len(answer) == 2 else None


def _tried(dataset, collate, size: int) -> bytes:
    try:
        before = capture_rng()
        items = [dataset[i] for i in range(min(size, len(dataset)))]
        indexed = not same(before, capture_rng())
        collate(items)
        return b"%d%d" % (indexed, not same(before, capture_rng()))
    except BaseException:
        return b"?"


def _kill(pid: int) -> None:
    import signal
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def same(a: dict, b: dict) -> bool:
    """Whether two captures of the random states (gmux.job.state.capture_rng) are the same, CUDA's aside."""
    return a["python"] == b["python"] and torch.equal(a["torch"], b["torch"]) and all(
        (x == y).all() if hasattr(x, "all") else x == y for x, y in zip(a["numpy"], b["numpy"]))
