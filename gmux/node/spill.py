"""The spill policy: which suspended job's state leaves host RAM for disk when suspended jobs hold more host RAM
than the budget. A pure function like the slicer and the packer (no I/O, no clock): the daemon describes the
jobs of one GPU, the policy returns one decision or None, and the daemon carries it out and logs it.

The largest holder goes first (fewest spills to get back under the budget). How it spills depends on what it
can do: a job that can restart from a checkpoint (explicit mode) checkpoints and its process ends, giving back
everything it holds; any other writes its host copy to a file in its own process and frees it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from gmux.util.sizes import format_size


@dataclass(frozen=True)
class Candidate:
    """A job on the GPU, as the policy sees it."""
    job: str
    host_bytes: int        # host RAM holding its suspended state
    started: bool          # has run (a job that never ran has nothing to spill)
    gang: bool             # a gang rank: never spilled alone, its process would leave the gang's process group
    refused: bool          # answered a spill with an error before: asking again would fail again
    busy: bool             # resident on the GPU, or a command is in flight for it
    migratable: bool       # restarts from a checkpoint in a new process (explicit mode)


@dataclass(frozen=True)
class Spill:
    job: str
    command: str           # "migrate" (checkpoint, the process ends) or "spill" (host copy to a file, in-process)
    numbers: dict          # for the decision log
    text: str


def choose(held: int, budget: int, candidates: Iterable[Candidate]) -> Optional[Spill]:
    """held: host RAM all live jobs of the machine hold for suspended state; candidates: one GPU's jobs."""
    if held <= budget:
        return None
    for c in sorted(candidates, key=lambda c: -c.host_bytes):
        if not c.host_bytes or not c.started or c.gang or c.refused or c.busy:
            continue
        command, how = (("migrate", "checkpoint, end its process") if c.migratable else
                        ("spill", "host copy to a file, in its process"))
        return Spill(c.job, command, {"host_held": held, "budget": budget, "bytes": c.host_bytes},
                     f"host RAM for suspended jobs {format_size(held)} > budget {format_size(budget)}: "
                     f"spilling {c.job} to disk ({how})")
    return None
