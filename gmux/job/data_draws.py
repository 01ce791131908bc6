"""Does a loader's dataset or collate function draw random numbers, and from where? Tried once on a first batch,
in a child the job's process forks, as the loader's workers are.

Where a loader's workers carry their random states across epochs (persistent workers) or a restored process
fetches a batch again, only data that draws nothing, or draws only from the random states gmux keeps (torch's,
NumPy's, Python's), moves exactly; this is how gmux tells. The child indexes the dataset's first items and
collates them, as the loader's first batch would, and sees what changed in the random states; then it indexes and
collates them again from the same states: a different result means a generator of the data's own (a collator's
`seed=`, a `np.random.default_rng()` in the dataset), whose state gmux does not have. Whatever the dataset opens
or caches as it is indexed (a file handle that must not cross a fork) stays in the child, and the job's process
and its random states are untouched. Items drawn from only now and then can pass unseen.
"""
from __future__ import annotations

import itertools
import os
import select
from typing import NamedTuple, Optional

import numpy as np
import torch

from .state import capture_rng, restore_rng

TRIAL_S = 60.0       # a child that has not answered by then (a lock held across the fork) is killed: unknown
ITEMS = 8            # at most this many items tried: a few show a habit of drawing, and slow data stays quick


class Draws(NamedTuple):
    indexed: bool       # indexing the dataset draws from the random states gmux keeps
    collated: bool      # collating the batch does
    own: bool           # a result differs from the same states: a generator of the data's own

    def any(self) -> bool:
        return self.indexed or self.collated or self.own


def draws(dataset, collate, size: int) -> Optional[Draws]:
    """What indexing the dataset's first `size` items and collating them draws from, or None if it cannot be
    told (the trial failed, or no fork here)."""
    if dataset is None or collate is None or not hasattr(os, "fork"):
        return None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                       # the child: answer, then leave without running anything of the job's
        try:
            os.close(read)
            torch.set_num_threads(1)   # as a loader's workers do: an OpenMP pool does not survive a fork
            os.write(write, _tried(dataset, collate, min(size, ITEMS)))
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], TRIAL_S)
        answer = os.read(read, 3) if ready else b""
    finally:
        os.close(read)
        if not answer:
            _kill(pid)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:      # a script that ignores SIGCHLD: the child was reaped already
            pass
    return Draws(*(c == ord("1") for c in answer)) if len(answer) == 3 else None


def _tried(dataset, collate, size: int) -> bytes:
    try:
        before = capture_rng()
        items = _first(dataset, size)
        indexed = not same(before, capture_rng())
        batch = collate(items)
        collated = not same(before, capture_rng())
        restore_rng(before)
        again = _first(dataset, size)
        own = not (_equal(items, again) and _equal(batch, collate(again)))
        return b"%d%d%d" % (indexed, collated, own)
    except BaseException:
        return b"?"


def _first(dataset, size: int) -> list:
    """The dataset's first `size` items: indexed, or a stream's (an IterableDataset, which has no dataset[i]) read
    from a new iterator of it, as a worker does."""
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return list(itertools.islice(iter(dataset), size))
    return [dataset[i] for i in range(min(size, len(dataset)))]


def _equal(a, b) -> bool:
    """Whether two items or batches hold the same values: tensors and arrays bit for bit (NaN equals NaN), and
    True where they cannot be compared (no evidence of a generator of their own)."""
    try:
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and \
                a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and \
                a.dtype == b.dtype and (a.tobytes() == b.tobytes() if a.dtype != object else _equal(a.tolist(),
                                                                                                   b.tolist()))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
        if type(a) is not type(b):
            return False
        if isinstance(a, float):
            return a == b or (a != a and b != b)
        if hasattr(a, "keys") and hasattr(b, "keys"):       # BatchEncoding and other mappings
            return _equal(dict(a), dict(b))
        if hasattr(a, "__dict__") and type(a).__eq__ is object.__eq__:    # a dataclass-like holder, no __eq__
            return _equal(vars(a), vars(b))
        return bool(a == b)
    except Exception:
        return True


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) if t.dtype.is_floating_point else t


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
