"""Naming what stays on the device after a suspend, so that no memory stays there unexplained.

Suspend frees every tracked storage; what remains is held by something the runtime was not told about:
a `loss` kept in a variable, a tensor in a user's list, a view of a parameter. This scan finds those
tensors (through the garbage collector, so only when asked) and names each by what refers to it.
"""
from __future__ import annotations

import gc
import sys

import torch


def _locals() -> dict[int, str]:
    """Tensors held in local variables of any thread's stack (frames are not visible as gc referrers)."""
    names: dict[int, str] = {}
    for frame in sys._current_frames().values():
        while frame is not None:
            for k, v in frame.f_locals.items():
                if issubclass(type(v), torch.Tensor):
                    names.setdefault(id(v), f"local '{k}' in {frame.f_code.co_name}()")
            frame = frame.f_back
    return names


def _name(t: torch.Tensor, scratch: list, local_names: dict[int, str]) -> str:
    if id(t) in local_names:
        return local_names[id(t)]
    fallback = "an unnamed tensor"
    for ref in gc.get_referrers(t):
        if ref is scratch:
            continue
        if isinstance(ref, dict):
            for k, v in ref.items():
                if v is t:
                    return f"'{k}'"
        elif isinstance(ref, (list, tuple)):
            fallback = f"item of a {type(ref).__name__} of {len(ref)}"
    return fallback


def residue(job) -> dict:
    pool = job.tier.pool if job.device.type == "cpu" else None
    if job.device.type == "cpu" and pool is None:
        return {"tensors": [], "tensor_bytes": 0}   # CPU tensors on the heap are host memory, never residue
    on_device = job.tier.on_device   # what counts as the job's device memory is the tier's to say
    tracked = {id(t) for t in job.tracked.tensors()}
    held: dict[int, tuple[str, int]] = {}
    # By type(), as hook.py finds modules: isinstance() reads __class__ through a weakref.proxy (torch.compile
    # leaves dead ones about, which raise) and through deprecated lazy proxies (which warn).
    candidates = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]
    local_names = _locals()
    for obj in candidates:
        try:
            if id(obj) in tracked or not on_device(obj):
                continue
            storage = obj.untyped_storage()
            ptr, size = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):
            # (no memory of its own to read: torch.compile's FakeTensors, a nested or functional tensor; the scan
            # raised on one left in the process)
            continue
        if size == 0 or ptr in held:
            continue
        held[ptr] = (f"{_name(obj, candidates, local_names)}: {tuple(obj.shape)} {obj.dtype}", size)
    out = {"tensors": sorted(held.values(), key=lambda x: -x[1]),
           "tensor_bytes": sum(n for _, n in held.values())}
    if pool is not None:
        out["pool_bytes"] = pool.in_use
    if job.device.type == "cuda":
        out["reserved_bytes"] = torch.cuda.memory_reserved(job.device)
        out["allocated_bytes"] = torch.cuda.memory_allocated(job.device)
    return out
