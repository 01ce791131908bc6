"""The data position: which epoch a job is in and how many batches of it it has consumed.

A job restored in a new process must see exactly the batches it would have seen. The shuffle of an epoch
and the seeds of its loader workers are drawn from torch's random stream (or the loader's generator) when the
epoch's iterator starts, so the position keeps that stream's state as it was at the epoch's start. Restoring
mid-epoch rebuilds the iterator from it and replays the batches already consumed (the workers load them
again, in the same order and with the same seeds, so any randomness inside them repeats too), then puts the
random streams back to where the checkpoint left them.

What the script itself draws when an epoch begins (a list of batches it shuffles, the epoch's augmentation
strength) comes before its job.data call, so the position also keeps every random stream as it was when
job.epochs entered the epoch: a restore puts them back there when job.epochs re-enters it, the script draws
the same again, and the replay ends with the streams where the checkpoint left them.

Limits, stated where users look: a loader whose persistent_workers were started in an earlier epoch carries
their seed and random state from then, which a new process cannot give new workers, so a move is refused in
such an epoch (reused_workers); a generator the script draws from of its own and did not attach is not seen
(attached, gmux.job.generators keeps it). Suspend/resume in one process is always exact.
"""
from __future__ import annotations

import gc
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

import torch


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
    # Every random stream (TrackedState.streams) when job.epochs entered the epoch; None outside job.epochs.
    epoch_streams: Optional[dict] = None
    replay: bool = False                            # set by a restore: the next data() call fast-forwards
    # While a restored epoch is re-entered: the streams as the checkpoint left them, put back after the replay.
    at_checkpoint: Optional[dict] = None
    unmovable: Optional[str] = None     # why this epoch cannot continue exactly in a new process (a move refuses)

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "epoch_rng": self.epoch_rng,
                "epoch_generator": self.epoch_generator, "marked_by_script": self.marked_by_script,
                "epoch_streams": self.epoch_streams}

    @classmethod
    def from_dict(cls, d: dict) -> "DataPosition":
        return cls(int(d["epoch"]), int(d["index"]), d["epoch_rng"], d["epoch_generator"],
                   bool(d["marked_by_script"]), d.get("epoch_streams"), replay=d["index"] > 0)


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


def reused_workers(loader) -> Optional[str]:
    """Why an epoch of `loader` cannot be replayed in a new process: its workers were started in an earlier epoch
    (persistent_workers=True), their seed drawn then and their random state carried on since, which a new
    process, starting them now, cannot give them (an epoch in which they were started replays exactly)."""
    if getattr(loader, "persistent_workers", False) and getattr(loader, "_iterator", None) is not None:
        return ("its loader's persistent_workers were started in an earlier epoch, and a new process could not "
                "give them the random state they have now (a move is exact in the epoch they start in)")
    return None


def epochs(position: DataPosition, count: int, tracked) -> Iterator[int]:
    """`tracked`: the job's TrackedState, whose random streams an epoch's start keeps."""
    while position.epoch < count:
        if position.replay and position.epoch_streams is not None:
            position.at_checkpoint = tracked.streams()
            tracked.set_streams(position.epoch_streams)
        else:
            position.epoch_streams = tracked.streams()
        yield position.epoch
        position.epoch += 1
        position.index = 0
        position.replay = False


def batches(position: DataPosition, loader: Iterable, before_fetch: Callable[[], None], tracked) -> Iterator[Any]:
    """Iterates one epoch of `loader`; calls `before_fetch` before every fetch after the first. `tracked`: the
    job's TrackedState (its random streams, which the replay draws from)."""
    generators = loader_generators(loader)
    position.unmovable = reused_workers(loader)
    # A restored job resumes just after the boundary its checkpoint was taken at: do not mark that one twice.
    skip_mark = position.replay
    if position.replay:
        # The streams are as the checkpoint left them (it holds them), or job.epochs kept them so while the
        # script drew its epoch's start again: the replay's draws are put back. The loader's generators (its
        # own, its sampler's) start the replay where the epoch's start left them in the first process, and the
        # replay leaves them where they were at the checkpoint (an attached one is put back with the others).
        at_checkpoint = position.at_checkpoint or tracked.streams()
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
        tracked.set_streams(at_checkpoint)
        position.replay, position.at_checkpoint = False, None
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


class Epoch:
    """job.data's iterator: the batches, and a warning where a restored epoch is counted by enumerate(), whose
    index starts at 0 again in the middle of the epoch (any `i % n` or `i < k` the script computes from it then
    differs from the run it continues)."""

    def __init__(self, position: DataPosition, batches: Iterator[Any]):
        self._batches = batches
        self._restored_at = position.index if position.replay else 0

    def __iter__(self) -> "Epoch":
        return self

    def __next__(self) -> Any:
        if self._restored_at:
            # Once per restore: finding the referrers walks every object the collector tracks.
            if any(type(r) is enumerate for r in gc.get_referrers(self)):
                print(f"gmux: this epoch was restored {self._restored_at} batches in, and enumerate(job.data(...)) "
                      f"counts from 0 again: use `for i, batch in job.enumerate(loader)` (or job.position.index) "
                      f"where the index matters", file=sys.stderr)
            self._restored_at = 0
        return next(self._batches)
