"""Modules an attached job changes in place that attach() was not given (explicit mode): an EMA copy of the model
updated by hand after each step, a teacher training its batch-norm statistics, a torchmetrics Metric beside the
model counting an epoch.

A move's new process builds such a module as the script builds it and never sees what the old process did to it,
so the run would go on with another EMA. The garbage collector finds the candidates: a module that is alive, is no
part of an attached module, holds tensors none of which is one of the job's (a DDP or compiled wrapper of the
model holds only the model's), and is not inside another candidate. Each is remembered when first seen by the sum
of its tensors' version counters (every in-place change moves one) and a few bytes of each (a change through .data
moves no counter: a momentum encoder's); one whose look has changed since keeps the job where it is. A frozen
teacher, loaded once and then only read, is not one; a copy the script refreshes from the model before each use
is, though a new process would refresh it alike: attaching it costs only checkpoint bytes.

A full look walks every object of the process (tens of milliseconds in a training script, more in a larger heap):
the process takes one at its first attach(), so that a module changed only after it is seen, and then at most once
a minute (less often where one takes longer than 0.3 s), for the reports or a move. A move in between looks again
at the modules already seen only (a fraction of a millisecond for a teacher on the CPU); one built since the last
full look is seen at the next.
"""
from __future__ import annotations

import gc
import time
import weakref
from itertools import zip_longest
from typing import Optional

import torch
from torch import nn

from . import metric_states

REPORT_SCAN_S = 60.0
SCAN_SHARE = 200        # a full look that took t seconds is taken again no sooner than 200 t later (at most 0.5%)

# id of a module seen outside a job's state -> (weak ref, its look then, Metric counts now, which summed over looks)
_versions: dict = {}
_last_scan: list = []       # when this process last took a full look (monotonic), and how long it took


def problem(job, fresh: bool = False) -> Optional[str]:
    """Why a module attach() was not given would come back otherwise in a new process (None: none seen). `fresh`:
    a move asks, and the modules seen are looked at again now; else this job's last answer, unless a full look is
    due (the process's last is REPORT_SCAN_S old, or it never took one)."""
    now = time.monotonic()
    full = not _last_scan or now - _last_scan[0] >= max(REPORT_SCAN_S, SCAN_SHARE * _last_scan[1])
    if not (full or fresh):
        return job.__dict__.get("_stray_module")       # (a report between looks: nothing walked)
    attached = {id(m) for top in job.tracked.modules for m in top.modules()}
    if full:
        candidates = [o for o in gc.get_objects() if issubclass(type(o), nn.Module) and id(o) not in attached]
        inside: set = set()
        for m in candidates:
            try:
                inside.update(id(c) for c in m.children())
            except Exception:           # (one half built: its __init__ failed before Module's)
                pass
        job.__dict__["_stray_module"] = _look(job, [m for m in candidates if id(m) not in inside], attached, True)
        _last_scan[:] = [now, time.monotonic() - now]
    else:
        seen = [m for m in (ref() for ref, *_ in list(_versions.values())) if m is not None and id(m) not in attached]
        job.__dict__["_stray_module"] = _look(job, seen, attached, False)
    return job.__dict__.get("_stray_module")


def _look(job, modules: list, attached: set, full: bool) -> Optional[str]:
    for key in attached & set(_versions):
        del _versions[key]          # (seen again outside a job's state, it is looked at anew)
    held = {_pointer(t) for t in job.tracked.tensors()}
    alive = set()
    why = None
    for m in modules:
        try:
            version = _state(m, held)
        except Exception:           # (a module whose parameters() fails: nothing gmux may raise into the script)
            continue
        if version is None:
            continue
        key = id(m)
        alive.add(key)
        ref, first, counts, sums = _versions.get(key, (None, None, None, ()))
        if ref is None or ref() is not m:            # (an id the collector gave to a new object)
            _versions[key] = (weakref.ref(m), version[:2], version[2], ())
            continue
        counting = _counting(version[2], counts, sums)
        _versions[key] = (ref, first, version[2], tuple(map(any, zip_longest(counting, sums))))
        if why is None and any(counting):
            why = (f"a torchmetrics {type(m).__name__} attach() was not given counts as the job trains: a new process "
                   f"builds it anew and would compute it over the batches after the move only, so the job stays "
                   f"where it is (suspend and resume still work); give it to attach(), which keeps its counts")
        elif why is None and version[:2] != first:
            why = (f"a module attach() was not given ({type(m).__name__}) is changed in place as the job trains (an "
                   f"EMA copy of the model?): a new process builds it anew and would train on without what it holds, "
                   f"so the job stays where it is (suspend and resume still work); give it to attach()")
    if full:
        for key in set(_versions) - alive:
            del _versions[key]
    return why


def _counting(counts: tuple, before: tuple, sums: tuple) -> list:
    """Which Metrics hold counts a new process would not have: changed since the last look, more than one update
    on either side of it (one reset at every step holds at most the step's), or one since a reset of a Metric seen
    summing before. Looks are a minute or more apart: an epoch's Metric reset at its end and counting again has
    fewer updates than at the last look (not more), or only the epoch's first."""
    return [n > 0 and n != was and (n > 1 or was > 1 or bool(summed))
            for n, was, summed in zip(counts, before, (*sums, *[False] * len(counts)))]


def _pointer(t: torch.Tensor) -> Optional[int]:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, ValueError, NotImplementedError):    # (a lazy module's uninitialized parameter, a sparse one)
        return None


def _state(m: nn.Module, held: set):
    """What `m`'s tensors that are not the job's hold, to compare with a later look: the sum of their version
    counters (every in-place change moves one), a few of their bytes (an in-place change through .data, or a
    .data assignment, moves none: a DINO or MoCo momentum encoder's update), and its torchmetrics Metrics' counts
    of updates (their states are no parameters or buffers), which _counting compares with the last look's.
    None: nothing to look at (no such tensor; an uninitialized lazy parameter, a sparse or meta one, an inference
    tensor: nothing a move loses)."""
    version, samples = 0, {}
    for t in (*m.parameters(), *m.buffers()):
        try:
            if t.layout != torch.strided or t.is_meta:
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() in held or storage.nbytes() == 0:
                continue
            version += t._version
        except (RuntimeError, ValueError, NotImplementedError):
            continue
        raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
        samples.setdefault(t.device, []).append(raw[::max(1, raw.numel() // _SAMPLE)][:_SAMPLE])
    counts = tuple(metric._update_count for _, metric in metric_states.metrics(m))
    if not (samples or counts):
        return None
    return version, tuple(bytes(torch.cat(s).cpu().numpy()) for s in samples.values()), counts


_SAMPLE = 64    # bytes of each tensor compared (spread over its storage): an EMA moves all of its elements
