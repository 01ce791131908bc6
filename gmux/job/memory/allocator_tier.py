"""The allocator tier: the counterpart of the state tier (state_tier.py), behind the same interface (tier.py).

Where the state tier repoints each tracked tensor at host memory and back, the allocator tier leaves every
pointer alone: the job's memory is native (gmux._native) address ranges, and suspend copies the live bytes
out and releases the physical memory under them; resume maps memory at the same addresses and copies back.
  * virtual GPU (CPU): the tracked tensors' storages are placed in native memory over the pool on first use
    (and any new storage, such as fresh gradients, on later suspends); live = those storages.
  * CUDA: all of the job's torch allocations already go through gmux (torch_cuda.route_torch_cuda); live =
    the caching allocator's active blocks, so tensors the runtime never heard of survive too.
The suspended bytes live in the native core's own host store, so this tier cannot spill them to a file.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import time
from typing import Iterable, Optional

import torch

from . import native
from .torch_cuda import torch_routing
from .tier import Tier, exact_device


class AllocatorTier(Tier):
    name = "allocator"

    def __init__(self, device: torch.device | str, pool: Optional[native.Pool] = None,
                 allocator: Optional[native.Allocator] = None):
        self.device = exact_device(device)
        self.pool = pool
        self.routing = None
        if self.device.type == "cuda":
            self.routing = torch_routing(self.device.index)
            if self.routing is None:
                raise RuntimeError(f"the allocator tier needs {self.device}'s allocations routed through gmux "
                                   "(gmux.job.memory.torch_cuda.route_torch_cuda) before the job allocates")
            self.allocator = self.routing.allocator
        elif self.device.type == "cpu":
            if allocator is None and pool is None:
                raise ValueError("the allocator tier on a virtual GPU needs a native Pool (or an Allocator over one)")
            self.allocator = allocator if allocator is not None else native.Allocator.host(pool)
        else:
            raise ValueError(f"the allocator tier supports cpu (virtual GPU) and cuda devices, not {self.device}")
        self._views: dict[int, torch.Tensor] = {}
        self._suspended_ids: set[int] = set()

    @property
    def suspended(self) -> bool:
        return self.allocator.suspended

    def suspend(self, tensors: list[torch.Tensor], tags: Optional[Iterable[str]] = None) -> dict:
        if self.suspended:
            raise RuntimeError("suspend: the job is already suspended")
        t0 = time.perf_counter()
        tensors = [t for t in tensors if t.device == self.device and t.layout == torch.strided]
        placed = {"bytes": 0, "storages": 0}
        if self.routing is None:
            placed = native.place(self.allocator, tensors, tags)
            if placed["bytes"]:
                _trim_heap()
            live = native.storage_ranges(tensors)
        else:
            live = self.routing.live_ranges()
        t1 = time.perf_counter()
        figures = self.allocator.suspend(live)
        self._suspended_ids = {id(t) for t in tensors}
        self._views.clear()
        return {"tier": "allocator", "bytes": figures["bytes"], "released_bytes": figures["mapped_bytes"],
                "allocations": figures["allocations"], "placed_bytes": placed["bytes"], "place_s": t1 - t0,
                "sync_s": figures["sync_s"], "host_alloc_s": figures["stage_s"], "copy_s": figures["copy_s"],
                "release_s": figures["map_s"], "total_s": time.perf_counter() - t0}

    def resume(self) -> dict:
        if not self.suspended:
            raise RuntimeError("resume: the job is not suspended")
        t0 = time.perf_counter()
        figures = self.allocator.resume()
        self._suspended_ids = set()
        self._views.clear()
        return {"tier": "allocator", "bytes": figures["bytes"], "mapped_bytes": figures["mapped_bytes"],
                "alloc_s": figures["map_s"], "stage_s": figures["stage_s"], "copy_s": figures["copy_s"],
                "total_s": time.perf_counter() - t0}

    def tidy(self) -> None:
        if self.routing is not None:
            self.routing.drain()

    def memory(self) -> dict:
        """The tracker's figures for the profiling report: live now, peak, live at this boundary, by tag."""
        self.allocator.boundary()
        s = self.allocator.stats()
        return {"native_live": s["live"], "native_peak": s["peak"], "native_at_boundary": s["at_boundary"],
                "native_by_tag": s["at_boundary_by_tag"], "native_peak_by_tag": s["peak_by_tag"], **super().memory()}

    def spill(self, path: str) -> dict:
        raise RuntimeError("spill: the allocator tier keeps suspended bytes in its own host store and cannot "
                           "spill them in-process; checkpoint and migrate the job instead")

    def on_device(self, tensor: torch.Tensor) -> bool:
        # On a virtual GPU a suspend gives back all of the job's pool memory: nothing of it can be residue.
        return self.device.type != "cpu" and tensor.device == self.device

    def host_view(self, tensor: torch.Tensor) -> Optional[torch.Tensor]:
        """A host copy of a suspended tensor (its memory is unmapped: touching it would fault), or None."""
        if not self.suspended or id(tensor) not in self._suspended_ids:
            return None
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self._views:
            raw = self.allocator.peek(key, storage.nbytes())
            self._views[key] = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        host = self._views[key].untyped_storage()
        return torch.empty(0, dtype=tensor.dtype).set_(host, tensor.storage_offset(), tensor.size(), tensor.stride())


def _trim_heap() -> None:
    # Storages just moved out of torch's CPU heap (fresh gradients, mostly) leave free but resident pages
    # behind: glibc keeps them for reuse. Hand them back, or the job's RSS would not drop by what it moved.
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if hasattr(_libc, "malloc_trim"):
        _libc.malloc_trim(0)


_libc = None
