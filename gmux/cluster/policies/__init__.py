"""Cluster scheduling policies behind one interface (see api.py): pure objects, snapshot in, actions out.

`make_policy(name, **params)` builds one by name; POLICIES lists the names. The same objects drive gmux-sim
and gmux-scheduler."""
from __future__ import annotations

import inspect
import math

from .api import (Event, EventKind, Grow, JobState, JobView, MachineView, Migrate, Pack, PairRate, Place, Policy,
                  PolicyError, Resume, SetTimer, Shrink, Suspend, Unpack)
from .fifo import FifoBackfillPolicy, FifoPolicy
from .gandiva import GandivaPolicy
from .gmux_default import GmuxPolicy
from .law_oracle import GmuxLawPolicy
from .oracle import SjfPolicy, SrtfPolicy
from .snapshot import Snapshot
from .tiresias import TiresiasPolicy

POLICIES = {p.name: p for p in (FifoPolicy, FifoBackfillPolicy, SjfPolicy, SrtfPolicy, TiresiasPolicy, GandivaPolicy,
                                GmuxPolicy, GmuxLawPolicy)}


def make_policy(name: str, **params) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}") from None
    return cls(**_check(name, _parameters(cls), params))


def _parameters(cls) -> dict:
    """Each keyword the policy's constructor takes, with its default (through `**params` handed to a base)."""
    out: dict = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        forwards = False
        for p in list(inspect.signature(init).parameters.values())[1:]:
            if p.kind is p.VAR_KEYWORD:
                forwards = True
            elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                out.setdefault(p.name, p.default)
        if not forwards:
            break
    return out


def _check(name: str, accepted: dict, params: dict) -> dict:
    """Parameters come from users (gmux-sim --params, JSON): a wrong name or kind is named here, before the
    constructor fails on it with a message about types. A whole number may be written as one (4.0, 1e9)."""
    params = dict(params)
    for key, value in params.items():
        if key not in accepted:
            raise ValueError(f"{name}: unknown parameter {key!r}; " +
                             (f"it takes {', '.join(sorted(accepted))}" if accepted else "it takes none"))
        default = accepted[key]
        if isinstance(default, bool):
            ok, kind = isinstance(value, bool), "true or false"
        elif isinstance(default, int):
            if isinstance(value, float) and value.is_integer():
                value = params[key] = int(value)
            ok, kind = isinstance(value, int) and not isinstance(value, bool), "a whole number"
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value)
            kind = "a finite number"
        elif isinstance(default, (tuple, list)):
            ok, kind = isinstance(value, (tuple, list)), "a list"
        else:
            continue
        if not ok:
            raise ValueError(f"{name}: parameter {key!r} must be {kind}, got {value!r}")
    return params


def _finite(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:       # (a JSON integer past the largest float: a traceback from math.isfinite)
        return False


__all__ = ["POLICIES", "make_policy", "Snapshot", "Policy", "PolicyError", "Event", "EventKind", "JobState",
           "JobView", "MachineView", "PairRate", "Place", "Resume", "Suspend", "Pack", "Unpack", "Migrate", "Grow",
           "Shrink", "SetTimer"]
