"""Cluster scheduling policies behind one interface (see api.py): pure objects, snapshot in, actions out.

`make_policy(name, **params)` builds one by name; POLICIES lists the names. The same objects drive gmux-sim
and gmux-scheduler."""
from __future__ import annotations

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
    return cls(**params)


__all__ = ["POLICIES", "make_policy", "Snapshot", "Policy", "PolicyError", "Event", "EventKind", "JobState",
           "JobView", "MachineView", "PairRate", "Place", "Resume", "Suspend", "Pack", "Unpack", "Migrate", "Grow",
           "Shrink", "SetTimer"]
