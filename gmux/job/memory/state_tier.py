"""The state tier: the job's tracked tensors leave the device and come back, in place. Any torch device.

Every tracked tensor keeps its Python identity, its TensorImpl and its autograd nodes: suspend copies each
distinct storage into one host buffer, then frees the device memory under it; resume takes device memory
again and copies back. A Parameter stays the same object, optimizer state stays keyed by it, and hooks on its
gradient accumulator (AccumulateGrad) keep firing: DistributedDataParallel registers its gradient-ready hooks
there. Never `set_()` a parameter: autograd then gives it a new accumulator node and every hook on the old
one is silently lost (after one cycle DDP stopped all-reducing; tests/test_ddp_hooks.py).

Two ways to free, per storage:
- in place, where the device memory is torch's own (a GPU, or the heap of a CPU job with no pool): the
  storage itself is resized to 0 and back (`untyped_storage().resize_`). Storage objects stay, so every alias
  stays one: DDP's `gradient_as_bucket_view` grads and their bucket, views the runtime was not told about.
- re-pointed, where the memory must come from the Python DevicePool (a virtual GPU) or the storage cannot be
  resized (over foreign memory, e.g. from_numpy): each tracked tensor is pointed at an empty tensor and, at
  resume, at a fresh storage with its old offset, shape and strides, through `.data =` (set_data), which
  keeps the TensorImpl, its hooks and its accumulator node. Tracked tensors that shared a storage share the
  new one; an untracked alias keeps the old memory, and the residue scan names it. resize_ cannot serve the
  pool: its memory would come from the heap, faulted in at every resume (~3.5x the copy into warm pages).

The host buffer is allocated once per job and reused for every cycle (pinned on CUDA, where pinning fresh
memory is slower still than faulting it): only growth of the tracked state reallocates it, and a spill
(spill.py), which hands it to a file. On a virtual GPU, fresh "device" memory comes from the job's pool
(a native Pool's host allocator is the allocator tier's; this tier takes the Python DevicePool, or the heap).
Nothing is released until every copy has finished, and nothing is repointed until all device memory for the
resume has been obtained, so a failure leaves the job either running or suspended with its state intact.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from .copier import Copier
from .limit import host_memory
from .python_pool import DevicePool
from .spill import SpillFile
from .tier import Tier

COPY_CHUNK = 64 << 20  # bytes per CUDA copy on the side stream, so release can overlap the next chunk
ALIGN = 64


@dataclass
class _Storage:
    nbytes: int
    host_offset: int
    views: list  # (tensor, storage_offset, size, stride)
    in_place: Optional[torch.UntypedStorage]  # the storage resized to 0 and back; None: re-pointed (see above)


def _bytes_of(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """A flat uint8 tensor over a whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (storage.nbytes(),), (1,))


class StateTier(Tier):
    name = "state"

    def __init__(self, device: torch.device | str, pool: DevicePool | None = None):
        self.device = torch.device(device)
        self.pool = pool
        self._host: torch.Tensor | None = None
        self._storages: list[_Storage] = []
        self._host_views: dict[int, torch.Tensor] = {}
        self.suspended = False
        self._cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._copier = None if self._cuda else Copier()
        self._spill: Optional[SpillFile] = None   # while the host copy is on disk

    # -- suspend -----------------------------------------------------------------------------------------
    def suspend(self, tensors: list[torch.Tensor]) -> dict:
        if self.suspended:
            raise RuntimeError("suspend: the job is already suspended")
        t0 = time.perf_counter()
        groups: dict[int, tuple[torch.UntypedStorage, list]] = {}
        for t in tensors:
            if t.device != self.device or t.is_sparse:
                continue
            storage = t.untyped_storage()
            if storage.nbytes() == 0:
                continue
            key = storage.data_ptr()
            groups.setdefault(key, (storage, []))[1].append((t, t.storage_offset(), t.size(), t.stride()))
        total = 0
        plan = []
        for storage, views in groups.values():
            plan.append((storage, _Storage(storage.nbytes(), total, views,
                                           storage if self._resizes(storage) else None)))
            total += (storage.nbytes() + ALIGN - 1) // ALIGN * ALIGN
        grew = self._ensure_host(total)
        t1 = time.perf_counter()
        self._copy_out(plan)
        t2 = time.perf_counter()
        # Every byte is on the host: only now let go of device memory.
        for storage, entry in plan:
            if entry.in_place is not None:
                storage.resize_(0)
                continue
            for t, *_ in entry.views:
                t.data = torch.empty(0, dtype=t.dtype, device=self.device)
        self._storages = [entry for _, entry in plan]
        del plan, groups
        if self._cuda:
            torch.cuda.empty_cache()
        t3 = time.perf_counter()
        self.suspended = True
        self._host_views.clear()
        return {"bytes": total, "storages": len(self._storages), "tensors": sum(len(s.views) for s in self._storages),
                "host_alloc_s": t1 - t0 if grew else 0.0, "copy_s": t2 - t1, "release_s": t3 - t2,
                "total_s": t3 - t0}

    def _resizes(self, storage: torch.UntypedStorage) -> bool:
        """Whether `storage` is freed in place: its memory is torch's allocator's, and a resume takes it there."""
        return storage.resizable() and not (self.pool is not None and self.device.type == "cpu")

    def _ensure_host(self, total: int, fault_in: bool = True) -> bool:
        if self._host is not None and self._host.numel() >= total:
            return False
        # Growth is rare (optimizer state appears after the first step); leave headroom for the next one.
        size = max(total, int(total * 1.125))
        self._host = None
        with host_memory():   # host memory: not counted against the job's device memory limit (limit.py)
            self._host = torch.empty(size, dtype=torch.uint8, pin_memory=self._cuda)
        if fault_in:
            self._host.fill_(0)  # fault the pages in now, not inside the first timed copy
        return True

    def _copy_out(self, plan) -> None:
        if not self._cuda:
            base = self._host.data_ptr()
            self._copier.copy([(base + e.host_offset, storage.data_ptr(), e.nbytes) for storage, e in plan])
            return
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for storage, entry in plan:
                src = _bytes_of(storage, self.device)
                for lo in range(0, entry.nbytes, COPY_CHUNK):
                    hi = min(entry.nbytes, lo + COPY_CHUNK)
                    self._host[entry.host_offset + lo:entry.host_offset + hi].copy_(src[lo:hi], non_blocking=True)
        stream.synchronize()

    # -- resume ------------------------------------------------------------------------------------------
    def resume(self) -> dict:
        if not self.suspended:
            raise RuntimeError("resume: the job is not suspended")
        t0 = time.perf_counter()
        unspill_s = self._unspill()
        fresh = []
        try:
            for entry in self._storages:
                if entry.in_place is not None:
                    entry.in_place.resize_(entry.nbytes)
                    fresh.append(entry.in_place)
                else:
                    fresh.append(self._device_storage(entry.nbytes))
        except Exception:
            # Out of device memory: give back what was taken, so the job stays suspended as it was.
            for entry in self._storages:
                if entry.in_place is not None:
                    entry.in_place.resize_(0)
            fresh.clear()
            raise
        t1 = time.perf_counter()
        self._copy_in(fresh)
        t2 = time.perf_counter()
        for storage, entry in zip(fresh, self._storages):
            if entry.in_place is not None:
                continue
            for t, offset, size, stride in entry.views:
                t.data = torch.empty(0, dtype=t.dtype, device=self.device).set_(storage, offset, size, stride)
        nbytes = sum(s.nbytes for s in self._storages)
        self._storages = []
        self._host_views.clear()
        self.suspended = False
        t3 = time.perf_counter()
        return {"bytes": nbytes, "unspill_s": unspill_s, "alloc_s": t1 - t0 - unspill_s, "copy_s": t2 - t1,
                "total_s": t3 - t0}

    def _device_storage(self, nbytes: int) -> torch.UntypedStorage:
        if self.pool is not None and self.device.type == "cpu":
            return self.pool.storage(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device).untyped_storage()

    def _copy_in(self, fresh) -> None:
        if not self._cuda:
            base = self._host.data_ptr()
            self._copier.copy([(storage.data_ptr(), base + e.host_offset, e.nbytes)
                               for storage, e in zip(fresh, self._storages)])
            return
        stream = self._stream
        with torch.cuda.stream(stream):
            for storage, entry in zip(fresh, self._storages):
                dst = _bytes_of(storage, self.device)
                for lo in range(0, entry.nbytes, COPY_CHUNK):
                    hi = min(entry.nbytes, lo + COPY_CHUNK)
                    dst[lo:hi].copy_(self._host[entry.host_offset + lo:entry.host_offset + hi], non_blocking=True)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        stream.synchronize()

    # -- spill: the host copy to disk and back ----------------------------------------------------------------
    def spill(self, path: str) -> dict:
        if not self.suspended:
            raise RuntimeError("spill: the job is not suspended")
        if self._spill is not None:
            return {"bytes": 0, "seconds": 0.0, "already": True}
        t0 = time.perf_counter()
        used = max((e.host_offset + e.nbytes for e in self._storages), default=0)
        self._spill = SpillFile.write(path, self._host[:used].numpy())
        self._host = None
        self._host_views.clear()
        if self._cuda and hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()   # pinned blocks are cached by torch, not freed, unless asked
        return {"bytes": used, "seconds": time.perf_counter() - t0, "path": path}

    def _unspill(self) -> float:
        """Reads a spilled host copy back into a host buffer; the file goes once it is back."""
        if self._spill is None:
            return 0.0
        t0 = time.perf_counter()
        self._spill.check_size()                               # before allocating a buffer for it
        self._ensure_host(self._spill.nbytes, fault_in=False)  # the read writes every byte: no pass to fault pages in
        self._spill.read_into(self._host[:self._spill.nbytes].numpy())
        self._spill = None
        return time.perf_counter() - t0

    # -- reading suspended state (a checkpoint taken while suspended) --------------------------------------
    def host_view(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The host copy of a suspended tensor, with its shape and strides, or None if it is not suspended."""
        if not self.suspended:
            return None
        self._unspill()
        if not self._host_views:
            for entry in self._storages:
                for t, offset, size, stride in entry.views:
                    # host offsets are 64-byte aligned, so they are whole elements of any dtype
                    start = entry.host_offset // t.element_size() + offset
                    view = torch.empty(0, dtype=t.dtype).set_(self._host.untyped_storage(), start, size, stride)
                    self._host_views[id(t)] = view
        return self._host_views.get(id(tensor))

    def on_device(self, tensor: torch.Tensor) -> bool:
        if self.device.type == "cpu":
            # A virtual GPU's device memory is its pool; any other CPU tensor is host memory, not residue.
            return self.pool is not None and self.pool.holds(tensor.untyped_storage().data_ptr())
        return tensor.device == self.device
