"""What an optimizer class of the script's own keeps in plain attributes rather than in `state` or `param_groups`,
which torch's state_dict() leaves out: a step count its bias correction is read from (`self.t += 1`), a count of
steps since a Lookahead-style sync, slow weights kept as a list of tensors. A move's new process built them as the
script builds them (0, the initial weights) and went on otherwise than unmoved, its reports saying movable. gmux
carries such attributes that changed since attach with the optimizer, as it does a module's
(gmux.job.module_attributes, gmux.job.plain_values: plain data, tensors inside lists, tuples and dicts; an optimizer
carried whole or not at all).

Only the classes of the script's own are looked at (torch's optimizers and the libraries' keep their state where
state_dict() finds it), and of them only what their library base classes do not set for themselves.
"""
from __future__ import annotations

import warnings

import torch

from . import plain_values, sparse_tensors
from .module_attributes import LIBRARIES

_library_keys: dict = {}        # class -> the attribute names its library bases set (None: a library's own class)


def _own(opt: torch.optim.Optimizer):
    """The attribute names the optimizer's library bases set, or None for a class of a library's own."""
    cls = type(opt)
    if cls not in _library_keys:
        bases = [c for c in cls.__mro__ if issubclass(c, torch.optim.Optimizer)]
        if all(c.__module__.startswith(LIBRARIES) for c in bases):
            _library_keys[cls] = None
        else:
            keys = set()
            for base in bases:
                if base.__module__.startswith(LIBRARIES):
                    keys |= _built_keys(base)
            _library_keys[cls] = frozenset(keys)
    return _library_keys[cls]


def _built_keys(base) -> set:
    """The attribute names a library base class's constructor sets, given one parameter (none known: one that needs
    other arguments; the base Optimizer itself takes its defaults)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            params = [torch.nn.Parameter(torch.zeros(1))]
            return set(vars(base(params, {}) if base is torch.optim.Optimizer else base(params)))
    except Exception:
        return set()


def remember(opt: torch.optim.Optimizer) -> None:
    """At attach: what the optimizer holds, which capture() carries the changes of."""
    if _own(opt) is not None:
        plain_values.remember(opt)


def capture(opt: torch.optim.Optimizer) -> dict:
    """{attribute: value} of what changed since attach; {} for an optimizer of a library's own class."""
    keys = _own(opt)
    if keys is None:
        return {}
    kept = plain_values.changed(opt, keys)
    # An attribute holding the optimizer's parameters or their state (`self.params = list(params)`) is the
    # optimizer's structure, which the new process builds alike and load_state_dict() refills: values put there
    # instead would no longer be the parameters it steps.
    held = set().union(*map(sparse_tensors.memory, _structure(opt)))
    kept = {k: v for k, v in kept.items()
            if not any(sparse_tensors.memory(t) & held for t in plain_values.tensors_in(v))}
    return plain_values.with_places(kept) if kept else {}


def _structure(opt: torch.optim.Optimizer) -> list:
    tensors = [p for g in opt.param_groups for p in g["params"]]
    return tensors + [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


def not_carried(opt: torch.optim.Optimizer):
    """Why a move would lose what the optimizer counted in its attributes (None: it would not), as
    module_attributes.not_carried says it of a module."""
    keys = _own(opt)
    if keys is None:
        return None
    return plain_values.not_carried(opt, keys, "optimizer", type(opt).__name__)


def check(fit, saved, optimizers: list) -> None:
    """Refuses (gmux.job.restore_check.Fit's way) what apply() could not put back whole; None (a checkpoint
    written before these were kept) passes."""
    if saved is None:
        return
    if not isinstance(saved, list) or len(saved) != len(optimizers):
        fit.fail(f"'optimizer_attributes': a {type(saved).__name__}, the job has a list of {len(optimizers)}")
    for i, (values, opt) in enumerate(zip(saved, optimizers)):
        if values and _own(opt) is None:
            fit.fail(f"optimizer {i} attributes: its {type(opt).__name__} is a library's, which keeps none")
        why = plain_values.fits_placed(opt, values)
        if why is not None:
            fit.fail(f"optimizer {i} attributes: {why}")


def apply(opt: torch.optim.Optimizer, saved: dict) -> None:
    """Only for what check() passed. Tensors go to the device of the optimizer's first parameter (those the script
    kept on the host stay there); a container the optimizer holds is filled in place (plain_values.put)."""
    device = next((p.device for g in opt.param_groups for p in g["params"]), None)
    for attribute, value in plain_values.placed(saved, device).items():
        plain_values.put(opt, attribute, value)
