"""What a job's modules keep in plain attributes rather than in parameters or buffers, which state_dict() leaves out:
a LightningModule's list of its steps' losses averaged at the epoch's end (Lightning's own documented pattern), a
count of forward calls an annealed temperature is read from. A move's new process built them as the script builds
them (an empty list, a count of 0), and went on otherwise than unmoved: the epoch's average over the steps after
the move only, and whatever monitored it. gmux keeps such attributes that changed since attach (gmux.job.plain_values:
plain data, tensors inside lists, tuples and dicts; a module carried whole or not at all) with the module, and puts
them back into the containers the module holds.

Only the classes of the script's own are looked at (torch's layers, and the libraries' below, keep their
configuration there, which the new process builds alike), and of them only what their library base classes do not
set for themselves (a LightningModule's trainer, its current hook).
"""
from __future__ import annotations

import warnings
from typing import Iterator

import torch
from torch import nn

from . import metric_states, plain_values, sparse_tensors

LIBRARIES = ("torch.", "torchvision.", "torchaudio.", "torchmetrics.", "transformers.", "lightning.",
             "pytorch_lightning.", "lightning_fabric.", "timm.", "accelerate.", "peft.", "diffusers.", "gmux.")
_library_keys: dict = {}        # class -> the attribute names its library bases set (None: a library's own class)


def _own(module: nn.Module):
    """The attribute names the module's library bases set, or None for a class of a library's own."""
    cls = type(module)
    if cls not in _library_keys:
        # (a class torch makes over the script's own, parametrize's or FSDP2's, is the script's too)
        modules = [c for c in cls.__mro__ if issubclass(c, nn.Module) and c is not nn.Module]
        if all(c.__module__.startswith(LIBRARIES) for c in modules) or metric_states.is_metric(module):
            _library_keys[cls] = None       # (metric_states' are carried by their declared states)
        else:
            keys = set(vars(nn.Module()))
            for base in modules[1:]:
                if base.__module__.startswith(LIBRARIES):
                    keys |= _built_keys(base)
            _library_keys[cls] = frozenset(keys)
    return _library_keys[cls]


def _built_keys(base) -> set:
    """The attribute names a library base class's constructor sets (none known: one that needs arguments). Built
    on the meta device, the random streams put back after: nn.Transformer() is 44M parameters drawn from the
    generator, and a move's new process, building it again at its first checkpoint, drew what the unmoved run
    (its classes looked at already) did not, and went on another way."""
    from .state import capture_rng, restore_rng
    rng = capture_rng()
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return set(vars(base()))
    except Exception:
        return set()
    finally:
        restore_rng(rng)


def _modules(module: nn.Module) -> Iterator[tuple[str, nn.Module, frozenset]]:
    for name, m in module.named_modules():
        keys = _own(m)
        if keys is not None:
            yield name, m, keys


def remember(module: nn.Module) -> None:
    """At attach: what each of the module's own submodules holds, which capture() carries the changes of."""
    for _, m, _ in _modules(module):
        plain_values.remember(m)


def capture(module: nn.Module) -> dict:
    """{submodule's dotted name: {attribute: value}} of what changed since attach, the modules with any only."""
    # An attribute holding a parameter or buffer (or a view of one: `self.masks = [self.mask]`) is the module's
    # structure, which the new process builds alike and state_dict() refills; a copy put there instead no longer
    # saw the buffer's updates.
    held = None         # (looked up once an attribute holds a tensor: most hold none, and 2000 blocks' are slow)
    out = {}
    for name, m, keys in _modules(module):
        kept = plain_values.changed(m, keys)
        tensors = {k: found for k, v in kept.items() if (found := plain_values.tensors_in(v))}
        if tensors:
            held = held if held is not None else \
                set().union(*map(sparse_tensors.memory, (*module.parameters(), *module.buffers())))
            kept = {k: v for k, v in kept.items() if not any(sparse_tensors.memory(t) & held
                                                             for t in tensors.get(k, ()))}
        if kept:
            out[name] = plain_values.with_places(kept)
    return out


def not_carried(module: nn.Module):
    """Why a move would lose what one of the module's own submodules counted (None: it would not): an attribute
    that changed into (or in) numbers gmux does not carry, a set or a NumPy value of no number's dtype, which leaves
    the submodule out whole (`capture`): the count beside it would start again; or one whose value changed its
    kind (a restore would refuse it: plain_values.kind_changed). A tensor held in an attribute is
    carried (plain_values), or, one in the step's graph, made again by the new process's forward; but that too
    leaves the submodule out whole, and a count beside it (of the forward's calls) would start again."""
    for name, m, keys in _modules(module):
        why = plain_values.not_carried(m, keys, "module", name or type(m).__name__, " (hold a list: list(s))")
        if why is not None:
            return why
    return None


def check(fit, saved, modules: list) -> None:
    """Refuses (gmux.job.restore_check.Fit's way) what apply() could not put back whole."""
    if not isinstance(saved, list) or len(saved) != len(modules):
        fit.fail(f"'attributes': a {type(saved).__name__}, the job has a list of {len(modules)}")
    for i, (entries, module) in enumerate(zip(saved, modules)):
        live = {name: m for name, m, _ in _modules(module)}
        if not isinstance(entries, dict):
            fit.fail(f"module {i} attributes: a {type(entries).__name__}, the job has a dict")
        for name, values in entries.items():
            if name not in live:
                fit.fail(f"module {i} attributes: {str(name)[:60]!r} is no module of the script's own in the job")
            why = plain_values.fits_placed(live[name], values)
            if why is not None:
                fit.fail(f"module {i} attributes of {str(name)[:60] or 'the module'!r}: {why}")


def apply(module: nn.Module, saved: dict) -> None:
    """Only for what check() passed. Tensors go to the submodule's device (those the script kept on the host stay
    there); a container the module holds is filled in place (plain_values.put)."""
    live = dict(module.named_modules())
    default = _device(module)
    for name, values in saved.items():
        m = live[name]
        device = _device(m) or default      # (the submodule's own: a model split over GPUs)
        for attribute, value in plain_values.placed(values, device).items():
            plain_values.put(m, attribute, value)


def _device(m: nn.Module):
    return next((t.device for t in (*m.parameters(), *m.buffers())), None)
