"""The data position: which epoch a job is in and how many batches of it it has consumed.

A job restored in a new process must see exactly the batches it would have seen. The shuffle of an epoch
and the seeds of its loader workers are drawn from the random streams (torch's, or numpy's for a sampler of the
script's own, or the loader's generator) when the epoch's iterator starts, so the position keeps them as they
were at the loader's start. Restoring
mid-epoch rebuilds the iterator from it and replays the batches already consumed (the workers load them
again, in the same order and with the same seeds, so any randomness inside them repeats too), then puts the
random streams back to where the checkpoint left them.

What the script itself draws when an epoch begins (a list of batches it shuffles, the epoch's augmentation
strength) comes before its job.data call, so the position also keeps every random stream as it was when
job.epochs entered the epoch: a restore puts them back there when job.epochs re-enters it, the script draws
the same again, and the replay ends with the streams where the checkpoint left them.

One loader per epoch marks the boundaries (batches()); others read while it is, or after it, are read beside it
(validation, zip). A checkpoint is taken only while the epoch's loader is being read and has batches left (where
it says how many): a new process resumes inside it; a move asked for later in the epoch waits for the next one's
(Job.boundary).

Limits, stated where users look: a loader whose persistent_workers were started in an earlier epoch carries
their seed and random state from then, which a new process cannot give new workers: a move is refused in such an
epoch if its dataset or collate function draws random numbers (reused_workers; tried once on a first batch),
and where they draw nothing the new process's workers draw their seed from a generator of their own, as the
first process drew none that epoch; a generator the loader's dataset or sampler holds of its own is kept with the
loader's, or, where its kind cannot be, a move is refused once it has drawn (gmux.job.held_generators); one the
script's loop draws from of its own and did not attach is not seen (attached, gmux.job.generators keeps it).
Suspend/resume in one process is always exact.
"""
from __future__ import annotations

import contextlib
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from gmux.util.text import printable

from . import held_generators, script_generators, state_deques
from .data_draws import draws
from .own_loops import restarting_loop


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
    # Every random stream when the epoch's loader started: a sampler drawing from numpy or `random` replays
    # alike (None in older files: only epoch_rng).
    data_streams: Optional[dict] = None
    # Other loaders being read beside the epoch's at the checkpoint (zip(job.data(a), job.data(b))), in the order
    # the script made them: Reading.to_dict()s, each replayed by the data() call of the same rank.
    beside: list = field(default_factory=list)
    replay: bool = False                            # set by a restore: the next data() call fast-forwards
    # While a restored epoch is re-entered: the streams as the checkpoint left them, put back after the replay.
    at_checkpoint: Optional[dict] = None
    # The epoch's loader kept persistent workers started in an earlier epoch (no seed drawn for them this epoch)
    reused_workers: bool = False
    # Taken with the epoch loader's last batch counted in `index` fetched, not yet given to the script
    # (Job._take_held): every random stream just before that fetch, under which a new process fetches it again.
    fetch_streams: Optional[dict] = None
    unmovable: Optional[str] = None     # why this epoch cannot continue exactly in a new process (a move refuses)
    # The loader that marks the boundaries this epoch, its reading under way (None: none is), and the readings of
    # other loaders under way (Reading.aside: one started after the epoch's loader had ended).
    loader: Any = None
    current: Optional["Reading"] = None
    ends_at: Optional[int] = None       # the epoch loader's length, where it has one: its batches this epoch
    others: list = field(default_factory=list)
    # state='s values holding no tensor as job.epochs entered the epoch (TrackedState.plain_state): a restore puts
    # them back while the epoch's top runs again, and the checkpoint's once its loader is read. A list shuffled in
    # place at the top (in state=, as the README advised) was shuffled twice, and a count the top adds to counted
    # twice; a value the top resets (`running = 0.0`) is the checkpoint's again for the body.
    epoch_state: Optional[dict] = None
    # Passes over the epoch's loader read to their end outside job.epochs (a loop by steps, or over epochs of the
    # script's own, which a new process starts again from its first: Job.restore says so), and the script's `for`
    # loop around one (gmux.job.own_loops: "" where its source could not be read; None: while loops only)
    passes: int = 0
    own_loop: Optional[str] = None
    attached_at: Any = None         # (code, line) of the attach() call, where loops around the job's begin
    state_at_checkpoint: Optional[dict] = None      # (while the restored epoch's top runs again)
    # Why no move is exact any more: itertools.cycle over job.data gives its first pass again (gmux.job.data_epoch;
    # not kept in a checkpoint, as no move is taken once it is set), and the lines of the script and the loaders
    # whose job.data's end was looked at for one.
    cycled: Optional[str] = None
    sites_looked: dict = field(default_factory=dict)     # (a line's (code, number) -> ids of loaders looked at)
    # The epoch loader's pass under way as the last epoch ended, which the script may read on in this one
    left: Optional["Reading"] = None
    watched: dict = field(default_factory=dict)     # generators the loaders hold that no state keeps (held_generators)
    script_gens: script_generators.Watch = field(default_factory=script_generators.Watch)     # (the script's own)

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "epoch_rng": self.epoch_rng,
                "epoch_generator": self.epoch_generator, "marked_by_script": self.marked_by_script,
                "epoch_streams": self.epoch_streams, "data_streams": self.data_streams,
                "beside": [r.to_dict() for r in self.others], "reused_workers": self.reused_workers,
                "fetch_streams": self.fetch_streams, "epoch_state": state_deques.stored(self.epoch_state),
                "passes": self.passes, "own_loop": self.own_loop}

    @classmethod
    def from_dict(cls, d: dict) -> "DataPosition":
        return cls(int(d["epoch"]), int(d["index"]), d["epoch_rng"], d["epoch_generator"],
                   bool(d["marked_by_script"]), d.get("epoch_streams"), d.get("data_streams"),
                   list(d.get("beside") or []), replay=d["index"] > 0,
                   reused_workers=bool(d.get("reused_workers", False)), fetch_streams=d.get("fetch_streams"),
                   epoch_state=state_deques.loaded(d.get("epoch_state")), passes=d.get("passes", 0),
                   own_loop=d.get("own_loop", ""))      # (a file from before it was kept: not known)

    def movable(self) -> bool:
        """Whether a new process could resume at a boundary now: inside the epoch loader's reading, with a batch
        still to come. At its last batch (or at any, where the loader has no length to say which is last) a new
        process would replay the whole epoch and run none of the loop's body, and what the script does after the
        loop with the loop's variables (the epoch's last loss) would find none: a move waits for the next batch
        to be fetched (Job._take_held)."""
        return (self.loader is None and not self.pass_left()) or \
            (self.current is not None and not any(r.aside for r in self.others) and self.has_next())

    def pass_left(self) -> bool:
        """Whether a pass over an earlier epoch's loader that the script broke out of (a job.data made once) is
        under way, not read on yet in this epoch: a boundary before it is (job.boundary() at the epoch's top) is no
        place for a move, as a new process would start that epoch's reading from its start (_go_on_in_a_later_epoch
        makes it this epoch's loader once it is read on)."""
        return self.left is not None and self.left.epoch is not None and self.left.epoch() is not None

    def has_next(self) -> bool:
        """Whether the epoch's loader says it has a batch left."""
        return self.ends_at is not None and self.index < self.ends_at

    def start_epoch(self) -> None:
        self.left = self.current
        self.index, self.replay, self.loader, self.current, self.ends_at = 0, False, None, None, None
        # Another loader's pass read beside the epoch's and still under way (an auxiliary task's iterator made again
        # only when it ends) goes on beside the next epoch's: kept, so a checkpoint there fast-forwards it too. One
        # read after the epoch's loop (validation) is no concern of the next epoch.
        self.beside, self.others = [], [r for r in self.others if not r.aside]


class Reading:
    """One job.data call's loader as it is read: how many batches it has given and, for a loader read beside the
    epoch's own, the random streams and its generators' states when it started."""

    def __init__(self):
        self.index, self.streams, self.generators, self.restored_at = 0, None, [], 0
        self.aside = False      # read beside the epoch's loader after it ended (validation)
        self.epoch: Optional[Callable[[], Optional["Epoch"]]] = None    # its Epoch (a weak reference), once made

    def to_dict(self) -> dict:
        return {"index": self.index, "streams": self.streams, "generators": self.generators}


def loader_generators(loader, depth: int = 3) -> tuple[list, list]:
    """The torch.Generators an epoch of `loader` draws from, each once: the loader's own (its shuffle, its workers'
    seeds) and its sampler's (a RandomSampler, SubsetRandomSampler or WeightedRandomSampler given one), found
    through what wraps it too (a progress bar, map(), a generator expression: `wrapped`), and through the
    iterator a wrapper made of it already (its `_index_sampler`); and apart, (where, generator) for each one its
    dataset, sampler and collate function hold of their own (gmux.job.held_generators), the CPU torch ones of which
    are among the first."""
    found: list = []
    # (not `or`: a sampler without a length, an IterableDataset's, raises on truthiness)
    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is None:
        batch_sampler = getattr(loader, "_index_sampler", None)
    for owner in (loader, getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not f for f in found):
            found.append(g)
    held = held_generators.held(loader)
    found += [g for _, g in held if held_generators.kept(g) and all(g is not f for f in found)]
    for inner in (wrapped(loader) if depth else []):
        more, more_held = loader_generators(inner, depth - 1)
        found += [g for g in more if all(g is not f for f in found)]
        held += [(where, g) for where, g in more_held if all(g is not h for _, h in held)]
    return found, held


def wrapped(obj) -> list:
    """What a wrapper of a loader reads from: a progress bar's iterable, map()'s iterators, the source of a
    generator expression (its iterator, made when the expression was)."""
    if type(obj).__name__ == "tqdm":
        return [obj.iterable]
    if type(obj) is map:
        return list(obj.__reduce__()[1][1:])
    frame = getattr(obj, "gi_frame", None)
    if frame is not None and ".0" in frame.f_locals:
        return [frame.f_locals[".0"]]
    return []


def _one_or_list(states: list):
    return None if not states else states[0] if len(states) == 1 else states


def generator_states(saved) -> list:
    """DataPosition.epoch_generator as a list of states."""
    return saved if isinstance(saved, list) else [] if saved is None else [saved]


def reused_workers(loader) -> tuple[bool, Optional[str]]:
    """Whether an epoch of `loader` reuses workers started in an earlier epoch (persistent_workers=True: their
    seed drawn then), and why it cannot then be replayed in a new process: what they run draws random numbers,
    with a random state carried on since that new workers cannot be given (tried once per loader)."""
    if not (getattr(loader, "persistent_workers", False) and getattr(loader, "_iterator", None) is not None):
        return False, None
    if loader not in _DRAWS:
        _DRAWS[loader] = draws(loader.dataset, loader.collate_fn, loader.batch_size or 1)
    drew = _DRAWS[loader]
    if drew is not None and not drew.any():
        return True, None
    what = "could not be tried" if drew is None else "draws random numbers"
    return True, (f"its loader's persistent_workers were started in an earlier epoch and its dataset or collate "
                  f"function {what}: a new process could not give new workers the random state they have now "
                  f"(a move is exact in the epoch they start in)")


_DRAWS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # loader -> draws() of its data


def hidden_workers(loader, epoch: int, depth: int = 3) -> Optional[str]:
    """Why an epoch read through map() or a generator expression over a loader's iterator with persistent workers,
    kept from an earlier epoch, cannot be replayed: the script makes that iterator before job.data sees it, and in
    a new process it is made anew, drawing the workers' seed from the loader's generator before the epoch's
    shuffle (the first process drew none after its first epoch)."""
    for inner in (wrapped(loader) if depth else []):
        if getattr(inner, "_persistent_workers", False):
            if _SEEN.setdefault(inner, epoch) < epoch:
                return ("its loader's persistent workers are read through map() or a generator expression made "
                        "before job.data, whose iterator a new process makes anew: its epoch's order would "
                        "differ (map over job.data(loader) instead)")
        elif (why := hidden_workers(inner, epoch, depth - 1)) is not None:
            return why
    return None


_SEEN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()    # a loader's iterator -> the epoch first read


def epochs(position: DataPosition, count: int, tracked) -> Iterator[int]:
    """`tracked`: the job's TrackedState, whose random streams an epoch's start keeps."""
    while position.epoch < count:
        if position.replay and position.epoch_streams is not None:
            if position.at_checkpoint is None:      # (Job.restore keeps them as the checkpoint has them)
                position.at_checkpoint = tracked.streams()
            tracked.set_streams(position.epoch_streams)
            if position.epoch_state is not None:
                position.state_at_checkpoint = tracked.plain_state(tensors=True)
                tracked.put_state(position.epoch_state)
        else:
            position.epoch_streams = tracked.streams()
            position.epoch_state = tracked.plain_state()
        yield position.epoch
        position.epoch += 1
        position.start_epoch()


def own_epochs(position: DataPosition) -> Optional[str]:
    """What a new process may do again where the script read its loader to the end outside job.epochs, inside a
    `for` loop of its own (or where that could not be seen), or None."""
    if not position.passes or position.epoch_streams is not None or position.own_loop is None:
        return None
    n = position.passes
    loop = (f"the script's loop {printable(position.own_loop, limit=160)}" if position.own_loop else
            "a loop of the script's own over epochs (for epoch in range(n))")
    return (f"the job read {n} pass{'es' if n > 1 else ''} over its loader to the end outside job.epochs: {loop} "
            f"starts again from its first iteration in the new process and trains {n} more, unless it starts "
            f"from a count kept in state= (range(state['epoch'], n)); job.epochs(n) goes on from the restored "
            f"epoch")


def length(loader) -> Optional[int]:
    """How many batches an epoch of `loader` gives, where it says (a DataLoader, a list, a progress bar); None
    where it cannot (a generator, an IterableDataset's loader without __len__)."""
    try:
        n = len(loader)
    except Exception:       # (TypeError for most; a dataset's own __len__ may raise anything)
        return None
    return n if isinstance(n, int) and n >= 0 else None


def unwrapped(loader):
    """The loader inside a progress bar (tqdm's `.iterable`), whose identity is the epoch loader's."""
    return loader.iterable if type(loader).__name__ == "tqdm" else loader


def batches(position: DataPosition, loader: Iterable, before_fetch: Callable[[bool], None], tracked,
            reading: Reading, move_waits: Callable[[], bool] = lambda: False,
            take_move: Callable[[], None] = lambda: None, begins_step: Callable[[], bool] = lambda: True
            ) -> Iterator[Any]:
    """One epoch of `loader`, its role decided when it is first read; calls `before_fetch(movable)` before every
    fetch after the first. Where a move waits for the epoch loader's next batch (`move_waits()`: the last
    boundary was no place for one), `take_move()` is called once that batch is fetched, before it is given, with
    the random streams as they were before the fetch in position.fetch_streams. A fetch where `begins_step()` is
    false is no boundary (gmux.job.step_starts: asked once per fetch). `tracked`: the job's
    TrackedState (its random streams, which a replay draws from); `reading`: where this call stands, for
    job.enumerate.

    The epoch's loader is the first one read in the epoch (read again, as a loop by steps does, it stays so); a
    loader read while it is (zip(job.data(a), job.data(b)), an evaluation inside the loop) or another one after
    it (validation) is read beside it: no checkpoint falls inside it (one asked for there waits for the epoch
    loader's next boundary), and one under way at a checkpoint is fast-forwarded by the new process's data()
    call of the same rank."""
    inner = unwrapped(loader)
    # (another loader after the epoch's, only inside job.epochs: a loop of its own over epochs makes each anew)
    after = position.epoch_streams is not None and position.loader is not None and position.loader is not inner
    if (position.current is not None and position.loader is not inner) or after:
        yield from _beside(position, loader, before_fetch, tracked, reading, aside=position.current is None)
        return
    # The epoch's loader: first read, or made again while an earlier pass over it is left unfinished (a loop by
    # steps that broke out of it), which this one replaces.
    position.loader, position.current, position.ends_at = inner, reading, length(loader)
    generators, held = loader_generators(inner)
    held_generators.watch(position.watched, held, tracked.generators)
    script_generators.look(position, generators, held)
    skip_mark, ahead = position.replay, None
    if position.replay:
        # The streams are as the checkpoint left them (it holds them), or job.epochs kept them so while the
        # script drew its epoch's start again: the replay's draws are put back. The loader's generators (its
        # own, its sampler's) start the replay where the epoch's start left them in the first process, and
        # the replay leaves them where they were at the checkpoint (an attached one is put back too).
        back = position.at_checkpoint or tracked.streams()
        states = generator_states(position.epoch_generator)
        if len(states) != len(generators):
            print(f"gmux: the checkpoint kept {len(states)} data generator states and this loader draws from "
                  f"{len(generators)}: the epoch's order after the move may differ", file=sys.stderr)
        if position.data_streams is None:       # (a file from before they were kept: torch's stream only)
            torch.set_rng_state(position.epoch_rng)
        # workers the first process had started an epoch before: their seed was not drawn at this epoch's start
        apart = inner if position.reused_workers else None
        # Taken just after a fetch (fetch_streams): replayed to the batch before it, and that batch fetched again
        # as it was first, under the streams it was fetched under, not given twice.
        ahead = position.fetch_streams
        if ahead is not None:
            position.index -= 1
        it = _fast_forward(loader, position.index, tracked, position.data_streams, zip(generators, states),
                           back if ahead is None else ahead, seeded_apart=apart)
        position.replay, position.at_checkpoint, position.fetch_streams = False, None, None
        if position.state_at_checkpoint is not None:
            tracked.put_state(position.state_at_checkpoint)
            position.state_at_checkpoint = None
        reading.index = reading.restored_at = position.index
    else:
        position.index = 0
        position.reused_workers, position.unmovable = reused_workers(inner)
        position.unmovable = position.unmovable or hidden_workers(loader, position.epoch)
        position.data_streams = tracked.streams()
        position.epoch_rng = position.data_streams["rng"]["torch"]
        position.epoch_generator = _one_or_list([g.get_state() for g in generators])
        it = iter(loader)
    try:
        while True:
            # (a restored job resumes just after the boundary its checkpoint was taken at: not marked twice)
            starts = begins_step()
            if position.index and not skip_mark and starts:
                before_fetch(position.has_next())
            replayed, skip_mark = skip_mark, False
            waiting = not replayed and starts and move_waits()
            before = tracked.streams() if waiting else None
            try:
                batch = next(it)
            except StopIteration:
                if position.epoch_streams is None:
                    position.passes += 1
                    # (the frames above this generator's are the script's that read it)
                    position.own_loop = position.own_loop or restarting_loop(sys._getframe(1),
                                                                             position.attached_at)
                return
            position.index += 1
            reading.index = position.index
            if ahead is not None:
                tracked.set_streams(back)       # (as the checkpoint has them: where that fetch left them)
                ahead = None
            if waiting:
                position.fetch_streams = before
                try:
                    take_move()
                finally:
                    position.fetch_streams = None
            yield batch
            if position.current is not reading:
                _go_on_in_a_later_epoch(position, loader, reading)
    finally:
        if position.current is reading:
            position.current = None


def _go_on_in_a_later_epoch(position: DataPosition, loader: Iterable, reading: Reading) -> None:
    """The script left this pass over the epoch's loader (a job.data made once, broken out of at a step budget) and
    reads on in a later epoch: it is that epoch's loader, its index the pass's, its streams those the pass began
    with, so a new process replays the pass to here as it does a pass begun in this epoch. Where another loader
    became this epoch's meanwhile, a new process could not: no move this epoch."""
    if position.current is None and position.loader is None:
        position.loader, position.current, position.ends_at = unwrapped(loader), reading, length(loader)
        position.index = reading.index
    else:
        position.unmovable = position.unmovable or (
            "a pass over an earlier epoch's loader goes on in this epoch beside this epoch's own (job.data made "
            "once and broken out of): a new process could not replay both (no move this epoch)")


def _beside(position: DataPosition, loader: Iterable, before_fetch: Callable[[bool], None], tracked,
            reading: Reading, aside: bool) -> Iterator[Any]:
    """`aside`: started after the epoch's loader ended (validation): its fetches are boundaries, but no place for a
    move (a suspend is fine). One read while the epoch's loader is has the boundaries of that one."""
    generators, held = loader_generators(unwrapped(loader))
    held_generators.watch(position.watched, held, tracked.generators)
    script_generators.look(position, generators, held)
    saved = position.beside.pop(0) if position.beside else None
    if saved is not None:
        reading.streams, reading.generators, reading.index = saved["streams"], saved["generators"], saved["index"]
        it = _fast_forward(loader, reading.index, tracked, saved["streams"], zip(generators, saved["generators"]),
                           back=tracked.streams())
    else:
        reading.streams, reading.generators = tracked.streams(), [g.get_state() for g in generators]
        inner = unwrapped(loader)
        if getattr(inner, "persistent_workers", False) and getattr(inner, "_iterator", None) is not None:
            position.unmovable = position.unmovable or (
                "a loader read beside the epoch's has persistent_workers started in an earlier epoch, whose seed "
                "a new process could not give new ones")
        position.unmovable = position.unmovable or hidden_workers(loader, position.epoch)
        it = iter(loader)
    reading.aside = aside
    position.others.append(reading)
    try:
        while True:
            if aside and reading.index:
                before_fetch(False)
            try:
                batch = next(it)
            except StopIteration:
                return
            reading.index += 1
            yield batch
    finally:
        if reading in position.others:
            position.others.remove(reading)


def _fast_forward(loader: Iterable, count: int, tracked, streams: Optional[dict], generators, back: dict,
                  seeded_apart=None) -> Iterator:
    """`loader`'s iterator `count` batches on, fetched as they were first: under `streams` (None: as they are)
    and with its generators at the (generator, state) pairs given; the streams are `back` afterwards.
    `seeded_apart`: a DataLoader whose workers draw their base seed from a scratch generator."""
    if streams is not None:
        tracked.set_streams(streams)
    for g, state in generators:
        g.set_state(state)
    it = _replayed(loader, count, seeded_apart)
    tracked.set_streams(back)
    return it


def _replayed(loader: Iterable, count: int, seeded_apart=None) -> Iterator[Any]:
    """`loader`'s iterator with `count` batches fetched and dropped; one with fewer batches than that is read to
    its end (said on stderr: the data changed since the checkpoint)."""
    # (held through the replay: a progress bar makes the loader's iterator at its first fetch)
    with workers_seeded_apart([] if seeded_apart is None else [seeded_apart]):
        it = iter(loader)
        for k in range(count):
            try:
                next(it)
            except StopIteration:
                print(f"gmux: the checkpoint is {count} batches into this loader and it has {k}: the data changed "
                      f"since, and its epoch ends here", file=sys.stderr)
                break
    return it


@contextlib.contextmanager
def workers_seeded_apart(loaders: Iterable):
    """While it lasts, each of these DataLoaders draws its workers' base seed from a scratch generator (its sampler
    keeps its own generator, or the global stream): workers a restored process starts where the first process
    had kept persistent ones, which drew no seed then."""
    swapped = [(dl, dl.generator) for dl in loaders]
    try:
        for dl, _ in swapped:
            dl.generator = torch.Generator()
        yield
    finally:
        for dl, generator in swapped:
            dl.generator = generator
