"""Where jobs go on one machine, as pure functions over plain views (no sockets, no clock).

Two kinds of demand share the GPUs. A single-GPU job goes to a GPU where it time-slices (or packs) with the
jobs already there. A multi-GPU job, or a gang of ranks, needs whole GPUs *exclusively*: no other job resident
or sliced on them while it holds them (a collective across GPUs runs at the pace of its slowest member, so
slicing one GPU of N would stall all N). When not enough GPUs are free, `plan_defrag` finds moves of movable
single-GPU jobs onto the other GPUs (where they time-slice) that free enough whole GPUs with the fewest bytes
moved; a job that cannot move pins its GPU. A move never puts a job on a GPU too small for its working set.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional

from gmux.util.sizes import format_size

MAX_COMBINATIONS = 20000   # GPU subsets examined per plan (8 GPUs: at most 70 of them are)


@dataclass
class Occupant:
    """A single-GPU job on a GPU, as the planner sees it."""
    id: str
    mem: int              # working set a target GPU must hold (0: not known yet)
    bytes: int            # what moving it copies (0: it has not started and moves by bookkeeping)
    movable: bool
    why_not: str = ""     # why it cannot move (shown when no plan exists)
    weight: float = 1.0


@dataclass
class GpuView:
    index: int
    mem_total: int
    occupants: list = field(default_factory=list)
    owner: Optional[str] = None       # held exclusively by this job
    reserved: Optional[str] = None    # being freed for this waiting unit

    def available_to(self, unit: Optional[str]) -> bool:
        return self.owner is None and self.reserved in (None, unit)

    @property
    def load(self) -> float:
        return sum(o.weight for o in self.occupants)


@dataclass
class Move:
    job: str
    src: int
    dst: int
    bytes: int


@dataclass
class Plan:
    gpus: list            # the GPUs the unit gets once the moves are done
    moves: list

    @property
    def bytes(self) -> int:
        return sum(m.bytes for m in self.moves)


def single_gpu(gpus: list, need: int, pinned: Optional[int] = None, keep_free: bool = False) -> Optional[int]:
    """The GPU for a single-GPU job: the least loaded one it fits on that nobody holds exclusively; None: wait.

    keep_free: a multi-GPU job or gang is waiting for whole GPUs, so prefer GPUs already in use (time-slicing
    there) over a free GPU the waiting job could take."""
    fitting = [g for g in gpus if g.available_to(None) and g.mem_total >= need
               and (pinned is None or g.index == pinned)]
    if not fitting:
        return None
    return min(fitting, key=lambda g: (keep_free and not g.occupants, g.load, g.index)).index


def whole_gpus(gpus: list, unit: str, count: int, need: int, pinned: tuple = ()) -> Optional[list]:
    """`count` GPUs free right now for `unit` (every GPU in `pinned` among them), or None."""
    free = [g for g in gpus if g.available_to(unit) and not g.occupants and g.mem_total >= need]
    ids = {g.index for g in free}
    if not set(pinned) <= ids:
        return None
    # GPUs reserved for this unit first (they were freed for it), then by index.
    rest = sorted((g for g in free if g.index not in pinned), key=lambda g: (g.reserved != unit, g.index))
    chosen = list(pinned) + [g.index for g in rest[:count - len(pinned)]]
    return sorted(chosen) if len(chosen) == count else None


def plan_defrag(gpus: list, unit: str, count: int, need: int, pinned: tuple = (),
                keep_clear: tuple = ()) -> tuple[Optional[Plan], str]:
    """Moves that free `count` whole GPUs (including `pinned`) for `unit`: the fewest bytes moved, then the
    fewest moves, none onto a GPU in `keep_clear` (one another waiting unit is pinned to). Returns (plan, "")
    or (None, why not)."""
    by_index = {g.index: g for g in gpus}
    candidates = []
    blocked = []
    for g in gpus:
        if not g.available_to(unit):
            blocked.append(f"GPU {g.index} is held by {g.owner or g.reserved}")
        elif g.mem_total < need:
            blocked.append(f"GPU {g.index} has {format_size(g.mem_total)} < {format_size(need)}")
        elif not all(o.movable for o in g.occupants):
            stuck = next(o for o in g.occupants if not o.movable)
            blocked.append(f"GPU {g.index} holds {stuck.id}, which cannot move ({stuck.why_not})")
        else:
            candidates.append(g.index)
    for p in pinned:
        if p not in candidates:
            return None, f"the pinned GPU {p} cannot be freed: " + "; ".join(b for b in blocked
                                                                              if b.startswith(f"GPU {p} "))
    if len(candidates) < count:
        return None, (f"needs {count} whole GPUs, at most {len(candidates)} can be freed"
                      + (": " + "; ".join(blocked) if blocked else ""))
    others = [c for c in candidates if c not in pinned]
    best: Optional[tuple] = None
    for combo in itertools.islice(itertools.combinations(others, count - len(pinned)), MAX_COMBINATIONS):
        freed = set(pinned) | set(combo)
        moves = _moves(by_index, freed, keep_clear)
        if moves is None:
            continue
        key = (sum(m.bytes for m in moves), len(moves), sorted(freed))
        if best is None or key < best[0]:
            best = (key, Plan(sorted(freed), moves))
    if best is None:
        return None, (f"no way to free {count} whole GPUs: the jobs on them have no other GPU that fits them"
                      + (" (" + "; ".join(blocked) + ")" if blocked else ""))
    return best[1], ""


def _moves(by_index: dict, freed: set, keep_clear: tuple = ()) -> Optional[list]:
    """Each job on the freed GPUs goes to the least loaded other GPU that holds its working set; None if one
    has nowhere to go. Biggest jobs are placed first, so a small one does not take the only GPU a big one fits."""
    targets = [g for i, g in by_index.items() if i not in freed and i not in keep_clear and g.owner is None
               and g.reserved is None]
    load = {g.index: g.load for g in targets}
    moves = []
    leaving = sorted(((o, i) for i in sorted(freed) for o in by_index[i].occupants), key=lambda x: -x[0].mem)
    for o, src in leaving:
        fits = [g for g in targets if g.mem_total >= o.mem]
        if not fits:
            return None
        dst = min(fits, key=lambda g: (load[g.index], g.index)).index
        load[dst] += o.weight
        moves.append(Move(o.id, src, dst, o.bytes))
    return sorted(moves, key=lambda m: m.job)
