"""Random generators a loader's dataset, sampler or collate function holds of its own (`self.rng =
np.random.default_rng(seed)` for an augmentation, a sampler's `self.g`), which neither the process's streams nor
attach() cover. A CPU torch.Generator among them is kept with the loader's own (gmux.job.data: its state at the
epoch's start puts the replay's draws back where they were). A NumPy or Python one (or a CUDA torch one), which a
loader's state does not hold, is watched from when the job first reads its loader: once it has drawn, a new process,
which builds it anew from its seed, would draw other numbers, so a move is refused, naming it, until the script
attaches it (attach(..., gen): gmux.job.generators)."""
from __future__ import annotations

from typing import Iterator, Optional

import numpy as np
import torch

from . import generators as gens

NAMES = {"torch": "CUDA torch.Generator", "numpy": "NumPy Generator", "numpy_legacy": "NumPy RandomState",
         "python": "random.Random"}
MAX_WATCHED = 16        # (a dataset per epoch, each with its own generator: the first ones say enough)


def held(loader) -> list:
    """(where, generator) for each random generator held by `loader`'s sampler, batch sampler, dataset (and the
    datasets it wraps: a Subset's, a ConcatDataset's) or collate function, or by an object one of them holds (a
    transform), each once; `where` as the script would reach it (loader.dataset.rng)."""
    found: list = []
    try:
        for where, owner in _owners(loader):
            for name, value in _attributes(owner):
                for at, g in ((f"{where}.{name}", value), *((f"{where}.{name}.{n}", v)
                                                            for n, v in _attributes(value))):
                    if gens.is_generator(g) and all(g is not f for _, f in found):
                        found.append((at, g))
    except Exception:       # (a dataset's own __getattr__ may raise anything: what was found stands)
        pass
    return found


def _owners(loader) -> Iterator[tuple]:
    # (datasets first: a sampler holds its dataset too, as data_source, and the name to give is the dataset's)
    level = [("loader.dataset", getattr(loader, "dataset", None))]
    for _ in range(3):      # (a Subset of a Subset of a dataset, at most)
        yield from level
        level = [(f"{w}.dataset", d.dataset) for w, d in level if getattr(d, "dataset", None) is not None] + \
            [(f"{w}.datasets[{i}]", x) for w, d in level if isinstance(getattr(d, "datasets", None), (list, tuple))
             for i, x in enumerate(d.datasets[:8])]
    batch_sampler = getattr(loader, "batch_sampler", None)
    yield from (("loader.sampler", getattr(loader, "sampler", None)), ("loader.batch_sampler", batch_sampler),
                ("loader.batch_sampler.sampler", getattr(batch_sampler, "sampler", None)),
                ("loader.collate_fn", getattr(loader, "collate_fn", None)))


def _attributes(obj) -> list:
    """An object's own attributes (its __dict__), none for what has none or is a tensor, array or container."""
    if obj is None or isinstance(obj, (torch.Tensor, np.ndarray, list, tuple, dict, set, str, bytes)):
        return []
    try:
        return list(vars(obj).items())
    except TypeError:
        return []


def kept(g) -> bool:
    """Whether the loader's state keeps `g` (a CPU torch.Generator, as the loader's own is) rather than `watch`."""
    return isinstance(g, torch.Generator) and g.device.type == "cpu"


def watch(watched: dict, found: list, attached: list) -> None:
    """Notes each generator `held` found (a loader's: (where, generator)) that neither the loader's state keeps nor
    attach() was given, as it is now (the first time it is seen)."""
    for where, g in found:
        if not kept(g) and id(g) not in watched and len(watched) < MAX_WATCHED and all(g is not a for a in attached):
            watched[id(g)] = (where, g, fingerprint(g))


def problem(watched: dict) -> Optional[str]:
    """Why a new process could not continue the loaders read: one of the generators watched has drawn, or None."""
    for where, g, first in watched.values():
        if fingerprint(g) != first:
            return (f"{where} (a {NAMES[gens.kind_of(g)]} held by the loader's own objects) has drawn since "
                    f"the job first read that loader, and attach() was not given it: a new process would build it "
                    f"anew from its seed and draw other numbers, so the job stays where it is (suspend and resume "
                    f"still work); given to attach() (attach(model, optimizer, {where})), a move keeps it")
    return None


def fingerprint(g):
    state = gens.capture(g)["state"]
    if isinstance(state, torch.Tensor):
        return state.numpy().tobytes()
    return (state[0], state[1].numpy().tobytes(), *state[2:]) if isinstance(g, np.random.RandomState) else state
