"""Does a loader's dataset or collate function draw random numbers? Tried once on a first batch, in the job's
process, the random states put back after.

Where a loader's workers carry their random states across epochs (persistent workers) or a restored process
fetches a batch again under other states, only data that draws nothing moves exactly; this is how gmux tells.
The trial indexes the dataset's first items and collates them, as the loader's first batch would: a dataset with
side effects on indexing (a counter, a stream) sees one batch more.
"""
from __future__ import annotations

from typing import Optional

import torch

from .state import capture_rng, restore_rng


def draws(dataset, collate, size: int) -> Optional[tuple[bool, bool]]:
    """Whether indexing the dataset, and collating a batch of it, draws from the random states: tried once on its
    first items, the states put back after. None if it cannot be tried here."""
    if dataset is None or collate is None:
        return None
    before = capture_rng()
    try:
        items = [dataset[i] for i in range(min(size, len(dataset)))]
        indexed = not same(before, capture_rng())
        collate(items)
        return indexed, not same(before, capture_rng())
    except Exception:
        return None
    finally:
        restore_rng(before)


def same(a: dict, b: dict) -> bool:
    """Whether two captures of the random states (gmux.job.state.capture_rng) are the same, CUDA's aside."""
    return a["python"] == b["python"] and torch.equal(a["torch"], b["torch"]) and all(
        (x == y).all() if hasattr(x, "all") else x == y for x, y in zip(a["numpy"], b["numpy"]))
