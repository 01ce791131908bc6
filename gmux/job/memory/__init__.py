"""A job's device memory and how it is suspended: one interface, two tiers, their backing stores, one choice.

    tier.py            the interface a job uses (Tier): suspend, resume, host_view, spill, memory, on_device
    state_tier.py      the state tier: tracked tensors to a reused host buffer and back, in place (any device)
    allocator_tier.py  the allocator tier: the live bytes of native address ranges out and back, pointers kept
    native.py          the binding to the C core (gmux._native): the native Pool, a job's Allocator, tensors
                       placed in native memory
    torch_cuda.py      torch's CUDA allocations routed through a job's native Allocator
    python_pool.py     DevicePool, a virtual GPU's memory in pure Python: the fallback where gmux._native is
                       not built (or a job is run with --no-native)
    spill.py           a suspended job's host copy to a file and back, checked
    limit.py           the job's memory limit (--mem), enforced: its policy and its figures for reports
    copier.py          the state tier's host copy engine (virtual GPUs)

The choices are made here and nowhere else: which device memory a job gets before its script runs, with its
limit (`device_memory`), and which tier suspends its state (`choose_tier`). Policy here, mechanism below (the C core
and its binding decide nothing). This module imports torch only when asked to choose, so that gmux-launch can
import its way to a registered job without paying for torch first.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .tier import Tier


def device_memory(pool_bytes: int = 0, native: bool = True, limit: int | None = None, *, job: str | None = None,
                  name: str | None = None):
    """Sets up a job's device memory before its script allocates any (a runner calls this first).

    On a GPU: with `native` allowed and gmux._native built, routes every torch CUDA allocation of the job
    through gmux (so its state gets the allocator tier; where routing cannot work, the job is told why on
    stderr and keeps torch's allocator, the state tier); returns None. On the CPU: a virtual GPU of `pool_bytes`,
    the native Pool where it can be (allocator tier), else the Python DevicePool (state tier); None for no pool
    (pool_bytes 0: tensors stay on the heap, state tier). With `limit` (bytes; the job's --mem), an allocation
    past it fails with torch.OutOfMemoryError naming the job (`job`, `name`) and the limit (limit.py; a soft
    limit, GMUX_MEM_SOFT=1, only counts)."""
    import torch

    from . import native as core
    from .limit import enforce
    from .torch_cuda import route_torch_cuda

    if torch.cuda.is_available():
        if native and core.available():
            try:
                route_torch_cuda(torch.cuda.current_device())
            except RuntimeError as e:   # CannotRoute, or the native CUDA allocator failing to start
                print(f"gmux: this job's memory is not routed through gmux: {e}. It runs on torch's own "
                      f"allocator, and a suspend moves the tensors gmux tracks (the state tier).", file=sys.stderr)
        enforce(limit, job=job, name=name, cuda=True)   # after routing: the routed allocator enforces it
        return None
    enforce(limit, job=job, name=name, cuda=False)     # before any pool: its regions count too
    if not pool_bytes:
        return None
    if native and core.available():
        return core.Pool.create(pool_bytes)
    from .python_pool import DevicePool
    return DevicePool(pool_bytes)


def choose_tier(device: "torch.device | str", pool=None) -> "Tier":
    """The tier for a job's state on `device` with `pool` (from device_memory, or given by the script): the
    allocator tier where it applies (gmux._native built, and a native Pool on a virtual GPU or torch's CUDA
    allocations routed through gmux), the state tier otherwise (over a Python DevicePool, if given one)."""
    from . import native
    from .allocator_tier import AllocatorTier
    from .state_tier import StateTier
    from .tier import exact_device
    from .torch_cuda import torch_routing

    device = exact_device(device)
    if native.available():
        if device.type == "cpu" and isinstance(pool, native.Pool):
            return AllocatorTier(device, pool)
        if device.type == "cuda" and torch_routing(device.index) is not None:
            return AllocatorTier(device)
    return StateTier(device, None if isinstance(pool, native.Pool) else pool)
