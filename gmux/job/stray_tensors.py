"""Tensors shadowing an attached module that attach() was not given (explicit mode): an EMA of the weights kept as a
dict by the model's names (`ema = {k: v.clone() for k, v in model.state_dict().items()}`) or as a list shaped like
its parameters, updated as the job trains.

A move's new process builds such a container as the script builds it (from the model at its start) and went on with
another EMA (a run moved at step 7 of 36 ended with one up to 0.008 from an unmoved run's), while its reports said
movable. What the script holds beyond its attached objects gmux does not carry unasked (extras= takes such a dict),
but it sees one: a dict whose keys are names of an attached module's parameters and buffers (or of the module
torch.compile or DDP wraps), its tensors shaped like them, or a list or tuple as long as a module's parameters and
shaped like them, holding tensors none of which is the job's, whose tensors changed between two looks (made anew, or
changed in place: version counters and a few bytes) keeps the job where it is, naming why. (gmux.job.stray_modules
sees an EMA kept as a module.) A dict of per-parameter metrics for a log (a grad norm by each name) is not one: a
new process makes it anew from the model.

A look walks every object of the process (tens of milliseconds; 0.1 s among 300,000): at attach, at each move,
and for the reports at most once a minute (less often where one takes longer than 0.3 s). A dict takes no weak
reference, so a container is known by its id between looks: one the script makes anew at each step at the address
of the last (a copy of the gradients for a log) is seen changing too, and keeps the job where it is while it is
alive at the boundary. One made after attach is seen from the look after it: a move right after it is not refused.
"""
from __future__ import annotations

import gc
import time
import weakref
from collections import OrderedDict
from typing import Optional

import torch
from torch import nn

from .state import tensors_inside

REPORT_LOOK_S = 60.0
LOOK_SHARE = 200        # a look that took t seconds is taken again for the reports no sooner than 200 t later
_SAMPLE = 64        # bytes of each tensor compared (spread over its storage): an EMA moves all of its elements

_seen: dict = {}        # id of a container seen at the last look -> its look then
_last: list = []        # when this process last looked (monotonic), and how long it took


def problem(job, fresh: bool = False) -> Optional[str]:
    """Why a new process would go on without what a container of the script's holds (None: none seen). `fresh`: a
    move asks, and the process is looked at now; else the last look's answer, unless one is due."""
    if job.control != "explicit":
        return None
    now = time.monotonic()
    if fresh or not _last or now - _last[0] >= max(REPORT_LOOK_S, LOOK_SHARE * _last[1]):
        job.__dict__["_stray_tensors"] = _look(job)
        _last[:] = [now, time.monotonic() - now]
    return job.__dict__.get("_stray_tensors")


def _look(job) -> Optional[str]:
    names: dict = {}        # name of a module's parameter or buffer -> the shapes it has (modules may share names)
    shapes: dict = {}       # count of a module's parameters -> their shapes, in order
    for m in job.tracked.modules:
        # (and by the names of the module a wrapper holds: an EMA made from the model before torch.compile or DDP
        # wrapped it is keyed without their "_orig_mod." or "module.", and was not seen, its job said movable)
        for inner in {id(w): w for w in (m, getattr(m, "_orig_mod", None), getattr(m, "module", None))
                      if isinstance(w, nn.Module)}.values():
            for n, t in (*inner.named_parameters(), *inner.named_buffers()):
                names.setdefault(n, set()).add(_shape(t))
        params = [_shape(p) for p in m.parameters()]
        if params:
            shapes[len(params)] = params
    if not names:
        return None
    # (what state= holds is carried too: an EMA dict kept there is the job's)
    held = {_pointer(t) for t in (*job.tracked.tensors(), *tensors_inside(job.tracked.state))}
    found, why = {}, None
    most = len(names)
    for o in gc.get_objects():
        kind = type(o)
        if kind is dict or kind is OrderedDict:     # (state_dict() makes an OrderedDict: a deepcopy, the best epoch's)
            if not o or len(o) > most or next(iter(o)) not in names or \
                    not all(type(k) is str and k in names for k in o):
                continue
            tensors = list(o.values())
            # (a module's own table of its parameters is gmux.job.stray_modules' to look at, by the module: an
            # evaluation copy made each epoch, its table at the address of the last one's, is not a change)
            if any(type(t) is nn.Parameter for t in tensors):
                continue
            # (an EMA is shaped like the weights it follows: a dict of per-parameter metrics made for a log, a grad
            # norm by each name, is made anew from the model and holds nothing a new process lacks)
            if not all(_tensor(t) and _shape(t) in names[k] for k, t in o.items()):
                continue
        elif kind in (list, tuple):
            if len(o) not in shapes:
                continue
            tensors = list(o)
        else:
            continue
        if not all(map(_tensor, tensors)) or \
                (kind in (list, tuple) and [_shape(t) for t in tensors] != shapes[len(o)]) or \
                None in map(_shape, tensors):
            continue
        look = _state(tensors, held)
        if look is None:
            continue
        then = _seen.get(id(o))
        found[id(o)] = look
        if why is None and then is not None and not _same(then, look):
            what = f"a dict of {len(o)} tensors by the names of the job's module" if kind is not list and \
                kind is not tuple else \
                f"a {kind.__name__} of {len(o)} tensors shaped like the job's module's parameters"
            why = (f"{what}, which attach() was not given, changes as the job trains (an EMA of the weights?): a new "
                   f"process builds it anew and would train on without what it holds, so the job stays where it is "
                   f"(suspend and resume still work); pass it in extras= (a dict), or keep it as an attached module")
    _seen.clear()
    _seen.update(found)
    return why


def _state(tensors: list, held: set):
    """Each tensor (weakly), its version counter and a few of its bytes; None where one is the job's or holds no
    memory of its own to look at (a sparse or meta tensor, a view of the job's)."""
    refs, versions, samples = [], [], []
    for t in tensors:
        try:
            if t.layout != torch.strided or t.is_meta or t.is_inference():
                return None
            storage = t.untyped_storage()
            if storage.data_ptr() in held:
                return None
            refs.append(weakref.ref(t))
            versions.append(t._version)
        except (RuntimeError, ValueError, NotImplementedError, TypeError):
            return None
        raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
        samples.append(bytes(raw[::max(1, raw.numel() // _SAMPLE)][:_SAMPLE].cpu().numpy()))
    return refs, versions, samples


def _same(then, now) -> bool:
    refs, versions, samples = then
    return len(refs) == len(now[0]) and all(r() is not None and r() is s() for r, s in zip(refs, now[0])) and \
        versions == now[1] and samples == now[2]


def _tensor(o) -> bool:
    # (by its type: isinstance() asks a weak proxy its referent's class, and one whose referent is gone raised out
    # of attach() and the reports, in a list of them as long as the model's parameters)
    return issubclass(type(o), torch.Tensor)


def _shape(t: torch.Tensor) -> Optional[tuple]:
    """A tensor's shape; None for one that has none to read (a nested tensor, a lazy module's uninitialized
    parameter), which raised out of attach() and the reports for a script holding a list of nested tensors as
    long as its model's parameters (a batch's)."""
    try:
        return tuple(t.shape)
    except (RuntimeError, ValueError, NotImplementedError, TypeError):
        return None


def _pointer(t: torch.Tensor) -> Optional[int]:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, ValueError, NotImplementedError):    # (a lazy module's uninitialized parameter, a sparse one)
        return None
