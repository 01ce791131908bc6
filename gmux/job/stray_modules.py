"""Modules an attached job changes in place that attach() was not given (explicit mode): an EMA copy of the model
updated by hand after each step, a teacher training its batch-norm statistics.

A move's new process builds such a module as the script builds it and never sees what the old process did to it,
so the run would go on with another EMA. The garbage collector finds the candidates: a module that is alive, is no
part of an attached module, holds tensors none of which is one of the job's (a DDP or compiled wrapper of the
model holds only the model's), and is not inside another candidate. Each is remembered with the sum of its tensors'
version counters (every in-place change moves one) when first seen; one whose sum has moved since keeps the job
where it is. A frozen teacher, loaded once and then only read, is not one; a copy the script refreshes from the
model before each use is, though a new process would refresh it alike: attaching it costs only checkpoint bytes.

A full look walks every object of the process (tens of milliseconds in a training script, more in a larger heap):
the process takes one at its first attach(), so that a module changed only after it is seen, and then at most once
a minute, for the reports or a move. A move in between looks again at the modules already seen (their counters
only: nothing added to its downtime); one built since the last full look is seen at the next.
"""
from __future__ import annotations

import gc
import time
import weakref
from typing import Optional

from torch import nn

REPORT_SCAN_S = 60.0

_versions: dict = {}        # id of a module seen outside a job's state -> (weak reference, version sum then)
_last_scan: list = []       # when this process last looked (monotonic), once it has


def problem(job, fresh: bool = False) -> Optional[str]:
    """Why a module attach() was not given would come back otherwise in a new process (None: none seen). `fresh`:
    a move asks, and the modules seen are looked at again now; else this job's last answer, unless a full look is
    due (the process's last is REPORT_SCAN_S old, or it never took one)."""
    now = time.monotonic()
    attached = {id(m) for top in job.tracked.modules for m in top.modules()}
    if not _last_scan or now - _last_scan[0] >= REPORT_SCAN_S:
        candidates = [o for o in gc.get_objects() if issubclass(type(o), nn.Module) and id(o) not in attached]
        inside = {id(c) for m in candidates for c in m.children()}
        job.__dict__["_stray_module"] = _look(job, [m for m in candidates if id(m) not in inside], attached, True)
        _last_scan[:] = [now]
    elif fresh:
        seen = [m for m in (ref() for ref, _ in list(_versions.values())) if m is not None and id(m) not in attached]
        job.__dict__["_stray_module"] = _look(job, seen, attached, False)
    return job.__dict__.get("_stray_module")


def _look(job, modules: list, attached: set, full: bool) -> Optional[str]:
    for key in attached & set(_versions):
        del _versions[key]          # (seen again outside a job's state, it is looked at anew)
    held = {t.untyped_storage().data_ptr() for t in job.tracked.tensors()}
    alive = set()
    why = None
    for m in modules:
        tensors = [t for t in (*m.parameters(), *m.buffers()) if t.untyped_storage().data_ptr() not in held]
        if not tensors:
            continue
        try:
            version = sum(t._version for t in tensors)
        except RuntimeError:        # (an inference tensor keeps no version: read-only, not state)
            continue
        key = id(m)
        alive.add(key)
        ref, first = _versions.get(key, (None, None))
        if ref is None or ref() is not m:            # (an id the collector gave to a new object)
            _versions[key] = (weakref.ref(m), version)
        elif version != first and why is None:
            why = (f"a {type(m).__name__} attach() was not given is changed in place as the job trains (an EMA copy "
                   f"of the model?): a new process builds it anew and would train on without what it holds, so the "
                   f"job stays where it is (suspend and resume still work); give it to attach()")
    if full:
        for key in set(_versions) - alive:
            del _versions[key]
    return why
