"""Random generators the script holds in its own variables (`g = torch.Generator().manual_seed(7)` beside the model,
a `random.Random(seed)` for an augmentation drawn in the loop) that attach() was not given and no loader read
through job.data holds: a new process builds each anew from its seed, at the state it had before the loop, and a
move after it has drawn there went on with other numbers (a run moved at step 7 of 36 ended with other weights,
nothing said). Such a generator is noted as it is when the job first reads a loader in this process (what it drew
while the script set up, before its loop, the new process draws alike), from the variables of the script's frames
around that read, up to the one that attached the job (its module's globals too); once one has drawn since, a move
is refused, naming it, until the script attaches it (attach(model, opt, g): gmux.job.generators).

Not seen: one created after that first read, or held deeper than a variable (in a dict, an object of the script's
own); one an attached module holds in an attribute is carried with the module (gmux.job.module_attributes), and
one a loader read through job.data holds is the data position's (gmux.job.data, gmux.job.held_generators)."""
from __future__ import annotations

import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Optional

from gmux.util.text import printable

from . import generators as gens
from .held_generators import fingerprint
from .own_loops import script_frames

MAX_WATCHED = 16
# (a library's frames, a Trainer's, are passed over: its generators are its own business, or its loader's)
_LIBRARIES = tuple(p for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"]} if p)
NAMES = {"torch": "torch.Generator", "numpy": "NumPy Generator", "numpy_legacy": "NumPy RandomState",
         "python": "random.Random"}


@dataclass
class Watch:
    seen: dict = field(default_factory=dict)        # id -> (the variable's name, the generator, its fingerprint)
    loaders: dict = field(default_factory=dict)     # id -> a generator a loader read through job.data holds


def look(position, generators: list, held: list) -> None:
    """At a job.data read: notes the loader's generators (`generators`, and `held`'s (where, generator)), and the
    generators the script's variables hold that were not noted yet, as they are now."""
    watch = position.script_gens
    for g in [*generators, *(h for _, h in held)]:
        watch.loaders.setdefault(id(g), g)
    frame = sys._getframe(1)
    try:
        for f, _ in script_frames(frame, position.attached_at, _LIBRARIES):
            for scope in (f.f_locals, f.f_globals):
                for name, value in list(scope.items()):
                    if len(watch.seen) < MAX_WATCHED and gens.is_generator(value) and id(value) not in watch.seen \
                            and id(value) not in watch.loaders:
                        watch.seen[id(value)] = (name, value, fingerprint(value))
    except Exception:       # (a guess at what the script holds: whatever its frames hold, the script trains on)
        pass
    finally:
        del frame


def problem(job) -> Optional[str]:
    """Why a new process would draw other numbers from a generator of the script's variables, or None."""
    watch = job.position.script_gens
    if not watch.seen:
        return None
    carried = {*watch.loaders, *map(id, job.tracked.generators), *map(id, job.tracked.state.values())}
    carried |= {id(v) for m in job.tracked.modules for sub in m.modules() for v in vars(sub).values()
                if gens.is_generator(v)}
    for name, g, first in watch.seen.values():
        if id(g) not in carried and fingerprint(g) != first:
            shown = printable(name, limit=40)
            return (f"the script's `{shown}` (a {NAMES[gens.kind_of(g)]}) has drawn since "
                    f"the job's loop began, and attach() was not given it: a new process would build it anew from "
                    f"its seed and draw other numbers, so the job stays where it is (suspend and resume still "
                    f"work); given to attach() (attach(model, optimizer, {shown})), a move keeps it")
    return None
