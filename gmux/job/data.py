"""The data position: which epoch a job is in and how many batches of it it has consumed.

A job restored in a new process must see exactly the batches it would have seen. The shuffle of an epoch
and the seeds of its loader workers are drawn from torch's random stream (or the loader's generator) when the
epoch's iterator starts, so the position keeps that stream's state as it was at the epoch's start. Restoring
mid-epoch rebuilds the iterator from it and replays the batches already consumed (the workers load them
again, in the same order and with the same seeds, so any randomness inside them repeats too), then puts the
random streams back to where the checkpoint left them.

Limits, stated where users look: with persistent_workers=True a loader rebuilt in a new process draws its
workers' seeds where the first process drew only the epoch's shuffle, and worker random state carries across
epochs, so a restore in a new process can differ; so can one where the script draws from a generator of its own
that it did not attach (gmux does not see it; attached, gmux.job.generators keeps it). Suspend/resume in one
process is always exact.
"""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch

from . import generators as gens


@dataclass
class DataPosition:
    epoch: int = 0
    index: int = 0                                  # batches of this epoch consumed
    epoch_rng: Optional[torch.Tensor] = None        # torch's CPU random state when the epoch's iterator started
    # The states at the epoch's start of the generators the loader draws from (its own, its sampler's): one
    # tensor, or a list where there are several; None where there are none.
    epoch_generator: Any = None
    # The script marks its boundaries itself (job.boundary(): gradient accumulation), so fetches are not
    # boundaries: kept in the checkpoint, or a new process would take its first fetches, mid-cycle, for them.
    marked_by_script: bool = False
    replay: bool = False                            # set by a restore: the next data() call fast-forwards

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "epoch_rng": self.epoch_rng,
                "epoch_generator": self.epoch_generator, "marked_by_script": self.marked_by_script}

    @classmethod
    def from_dict(cls, d: dict) -> "DataPosition":
        return cls(int(d["epoch"]), int(d["index"]), d["epoch_rng"], d["epoch_generator"],
                   bool(d["marked_by_script"]), replay=d["index"] > 0)


def loader_generators(loader) -> list:
    """The torch.Generators an epoch of `loader` draws from, each once: the loader's own (its shuffle, its workers'
    seeds) and its sampler's (a RandomSampler, SubsetRandomSampler or WeightedRandomSampler given one)."""
    found: list = []
    sampler = getattr(loader, "sampler", None)
    inner = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    for owner in (loader, sampler, inner):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not f for f in found):
            found.append(g)
    return found


def generator_states(saved) -> list:
    """DataPosition.epoch_generator as a list of states."""
    return saved if isinstance(saved, list) else [] if saved is None else [saved]


def epochs(position: DataPosition, count: int) -> Iterator[int]:
    while position.epoch < count:
        yield position.epoch
        position.epoch += 1
        position.index = 0
        position.replay = False


def batches(position: DataPosition, loader: Iterable, before_fetch: Callable[[], None],
            own: Sequence = ()) -> Iterator[Any]:
    """Iterates one epoch of `loader`; calls `before_fetch` before every fetch after the first. `own`: the
    script's attached generators, which the replay draws from too."""
    generators = loader_generators(loader)
    # A restored job resumes just after the boundary its checkpoint was taken at: do not mark that one twice.
    skip_mark = position.replay
    if position.replay:
        # The process-wide streams are as the checkpoint left them (it holds them): the replay's draws are put
        # back. The loader's generators (its own, its sampler's) start the replay where the epoch's start left
        # them in the first process, and the replay leaves them where they were at the checkpoint (an attached
        # one is put back with the others).
        now_rng, now_np, now_py = torch.get_rng_state(), np.random.get_state(), random.getstate()
        now_own = [gens.capture(g) for g in own]
        torch.set_rng_state(position.epoch_rng)
        states = generator_states(position.epoch_generator)
        if len(states) != len(generators):
            print(f"gmux: the checkpoint kept {len(states)} data generator states and this loader draws from "
                  f"{len(generators)}: the epoch's order after the move may differ", file=sys.stderr)
        for g, state in zip(generators, states):
            g.set_state(state)
        it = iter(loader)
        for _ in range(position.index):
            next(it)
        torch.set_rng_state(now_rng)
        np.random.set_state(now_np)
        random.setstate(now_py)
        for g, state in zip(own, now_own):
            gens.apply(g, state)
        position.replay = False
    else:
        position.index = 0
        position.epoch_rng = torch.get_rng_state()
        states = [g.get_state() for g in generators]
        position.epoch_generator = None if not states else states[0] if len(states) == 1 else states
        it = iter(loader)
    while True:
        if position.index and not skip_mark:
            before_fetch()
        skip_mark = False
        try:
            batch = next(it)
        except StopIteration:
            return
        position.index += 1
        yield batch
