"""Naming what stays on the device after a suspend, so that no memory stays there unexplained.

Suspend frees every tracked storage; what remains is held by something the runtime was not told about:
a `loss` kept in a variable, a tensor in a user's list, a view of a parameter. This scan finds those
tensors (through the garbage collector, so only when asked) and names each by what refers to it.
"""
from __future__ import annotations

import gc
import types
import warnings

import torch


def _name(t: torch.Tensor) -> str:
    for ref in gc.get_referrers(t):
        if isinstance(ref, types.FrameType):
            for k, v in ref.f_locals.items():
                if v is t:
                    return f"local '{k}' in {ref.f_code.co_name}()"
        elif isinstance(ref, dict):
            for k, v in ref.items():
                if v is t:
                    return f"'{k}'"
        elif isinstance(ref, (list, tuple)):
            return f"item of a {type(ref).__name__} of {len(ref)}"
    return "an unnamed tensor"


def residue(job) -> dict:
    pool = job.tier.pool if job.device.type == "cpu" else None
    if job.device.type == "cpu" and pool is None:
        return {"tensors": [], "tensor_bytes": 0}
    # A virtual GPU's device memory is its pool; any other CPU tensor is host memory, not residue.
    on_device = (lambda t: pool.holds(t.untyped_storage().data_ptr())) if pool is not None \
        else (lambda t: t.device == job.device)
    tracked = {id(t) for t in job.tracked.tensors()}
    held: dict[int, tuple[str, int]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on deprecated lazy module proxies warns
        candidates = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for obj in candidates:
        if id(obj) in tracked or not on_device(obj):
            continue
        storage = obj.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in held:
            continue
        held[storage.data_ptr()] = (f"{_name(obj)}: {tuple(obj.shape)} {obj.dtype}", storage.nbytes())
    out = {"tensors": sorted(held.values(), key=lambda x: -x[1]),
           "tensor_bytes": sum(n for _, n in held.values())}
    if pool is not None:
        out["pool_bytes"] = pool.in_use
    if job.device.type == "cuda":
        out["reserved_bytes"] = torch.cuda.memory_reserved(job.device)
        out["allocated_bytes"] = torch.cuda.memory_allocated(job.device)
    return out
