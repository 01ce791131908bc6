"""job.data's iterator (Epoch), and what a script wraps it in: enumerate() and itertools.islice() count a restored
epoch from 0 again (said, and a move's answer warns of it), itertools.cycle() keeps the batches of its first pass to
give them again (a move is refused). The position it reads is gmux.job.data's."""
from __future__ import annotations

import gc
import itertools
import sys
import weakref
from typing import Any, Callable, Iterator, Optional

from .data import DataPosition, Reading, length


class Epoch:
    """job.data's iterator: the batches (with each one's index in its epoch where `counted`: job.enumerate), and a
    warning where a restored epoch is counted by enumerate() or cut by itertools.islice(), whose counts start at 0
    again in the middle of the epoch (any `i % n` or `i < k` the script computes from them, or the batches islice
    lets through, then differ from the run it continues).

    Read to its end and iterated again, it reads its loader again, as a `for` over the loader itself would: a new
    epoch of it (`data = job.data(loader)` made once and read each epoch, a generator of the script's own cycling
    it), where an ended iterator would give nothing, and such a generator spin without end. itertools.cycle over it
    reads it once and gives what it kept after that: a move during that pass is refused (cycled), and its end is
    said once and keeps the job where it is (position.cycled). Seeing the cycle walks every object, so the end of
    a pass is looked at once per loader and line of the script that calls job.data (`site`, its frame), for a few
    loaders a line: a helper making validation's job.data and the cycled training one is looked at for each, and a
    script making job.data of a new list for each step pays a few walks."""

    def __init__(self, batches: Iterator[Any], reading: Reading, again: Callable[[], "Epoch"],
                 position: DataPosition, counted: bool, site, loader):
        self._batches, self.reading, self._again, self._first = batches, reading, again, True
        self._position, self._counted, self._ended = position, counted, False
        self._site = None if site is None else (site.f_code, site.f_lineno)
        self._loader = loader
        reading.epoch = weakref.ref(self)

    def __iter__(self) -> "Epoch":
        return self._again() if self._ended else self

    def __len__(self) -> int:
        """The loader's length (batches in an epoch of it), as len(loader) says: a progress bar's total, a count of
        steps per epoch made from a job.data kept for every epoch."""
        n = length(self._loader)
        if n is None:
            raise TypeError(f"job.data's loader ({type(self._loader).__name__}) has no length")
        return n

    def __next__(self) -> Any:
        try:
            batch = next(self._batches)
        except StopIteration:
            if not self._ended and self.reading.index and self._site is not None:
                looked = self._position.sites_looked.setdefault(self._site, set())
                if id(self._loader) not in looked and len(looked) < LOOKS_PER_LINE:
                    looked.add(id(self._loader))
                    if wrapped_by(self) == "cycle":
                        self._position.cycled = CYCLED
                        print(f"gmux: {CYCLED}", file=sys.stderr)
            self._ended = True
            raise
        if self._first and self.reading.restored_at:
            counting = wrapped_by(self)
            if counting in ("enumerate", "islice"):
                print(f"gmux: this epoch was restored {self.reading.restored_at} batches in, and {counting}"
                      f"(job.data(...)) counts from 0 again: use `for i, batch in job.enumerate(loader)`, or "
                      f"job.position.index, where the count matters", file=sys.stderr)
        self._first = False
        return (self.reading.index - 1, batch) if self._counted else batch


LOOKS_PER_LINE = 8
CYCLED = ("itertools.cycle(job.data(...)) gives the batches of its first pass again without reading the loader: "
          "job.data marks no boundary in them (unless the script marks its own with job.boundary(), gmuxd can only "
          "stop and continue the process) and a new process would not have them to give, so the job is not moved "
          "from here on; `def forever(d): while True: yield from d` over job.data(loader) reads the loader anew "
          "each pass")


_WRAPPERS = (enumerate, itertools.islice, itertools.cycle)


def wrapped_by(epoch: Optional[Epoch]) -> Optional[str]:
    """The name of what reads `epoch`'s batches of those that count them from 0 (enumerate, islice) or keep them
    (cycle), or None. Finding the referrers walks every object the collector tracks: once per restore, move or
    job.data call's end."""
    if epoch is None:
        return None
    return next((type(r).__name__ for r in gc.get_referrers(epoch) if type(r) in _WRAPPERS), None)


def count_restarts(reading: Optional[Reading]) -> Optional[str]:
    """Why a new process would count the epoch under way differently (`reading`: the epoch's loader's), or None."""
    if reading is None or not reading.index or reading.epoch is None:
        return None
    counting = wrapped_by(reading.epoch())
    if counting not in ("enumerate", "islice"):
        return None
    return (f"the script counts this epoch's batches with {counting}(job.data(...)), which counts from 0 again in "
            f"the new process ({reading.index} batches in): any i % n or i < k it computes from that count differs "
            f"from the run it continues; job.enumerate(loader) counts on")


def cycled(position: DataPosition, look: bool) -> Optional[str]:
    """Why a new process could not continue the loaders read, where itertools.cycle reads one: it gives what it
    kept (position.cycled), or, where `look` (a move asks: a walk of every object), it is in its first pass under
    way now, and the new process's would keep only the batches after the checkpoint to give again. None: neither."""
    if position.cycled or not look:
        return position.cycled
    epochs = [e for e in (r.epoch() for r in (position.current, *position.others) if r is not None and r.epoch)
              if e is not None]
    if not epochs or not any(type(r) is itertools.cycle for r in gc.get_referrers(*epochs)):
        return None
    return ("the script reads job.data(...) through itertools.cycle, which keeps the batches of its first pass to "
            "give them again: a new process's would keep only those after the checkpoint, so the job stays where it "
            "is (suspend and resume still work); `def forever(d): while True: yield from d` over job.data(loader) "
            "reads the loader anew each pass")
