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
The bookkeeping is batched: a suspend's plan is a few columns (lists: one row per storage, one per tensor)
filled and walked with map() and comprehensions that call torch's C methods directly, with no Python object or
loop body per tensor, and small copies run through map() too. Per-row objects and loops cost ~5-10 µs per
tensor, tens of milliseconds for a model of a few thousand small tensors, ~20x its bytes' copy time (the
"many small tensors" rows in benchmarks/README.md). On the Python pool, a resume takes one block for all the
re-pointed storages, laid out like the host buffer, so that the copy back is one memcpy; each storage is still
its own storage (a slice of the block), so an alias is one only where it was one before.
Nothing is released until every copy has finished, and nothing is repointed until all device memory for the
resume has been obtained, so a failure leaves the job either running or suspended with its state intact.
"""
from __future__ import annotations

import ctypes
import time
from collections import deque
from itertools import repeat
from typing import Optional

import numpy as np
import torch

from . import native
from .copier import Copier
from .limit import host_memory
from .python_pool import DevicePool
from .spill import SpillFile
from .tier import Tier, exact_device

COPY_CHUNK = 64 << 20  # bytes per CUDA copy on the side stream, so release can overlap the next chunk
ALIGN = 64

# torch's C methods, called through map(): no Python frame per tensor.
_storage_of = torch.Tensor.untyped_storage
_set_data = torch.Tensor.data.__set__


def _repoint(ts: list, srcs) -> None:
    """`t.data = src` for each, in C. A tensor made under torch.inference_mode (a teacher loaded that way) is
    re-pointed with set_() under inference_mode instead: `.data =` would leave it unusable there, and it has no
    gradient accumulator to keep."""
    if not any(map(torch.Tensor.is_inference, ts)):
        _each(_set_data, ts, srcs)
        return
    for t, src in zip(ts, srcs):
        if t.is_inference():
            with torch.inference_mode():
                t.set_(src)
        else:
            _set_data(t, src)


def _each(fn, *columns) -> None:
    """fn over the columns, for its effect, looped in C."""
    deque(map(fn, *columns), maxlen=0)


def _copy_small(dsts: np.ndarray, srcs: np.ndarray, nbytes: np.ndarray) -> None:
    """Small copies by address: one native call for many (a model of small layers), else memmove per range."""
    if len(dsts) < 16 or not native.copy_ranges(dsts, srcs, nbytes):
        _each(ctypes.memmove, dsts.tolist(), srcs.tolist(), nbytes.tolist())


def _addresses(storages: list) -> np.ndarray:
    return np.fromiter(map(torch.UntypedStorage.data_ptr, storages), dtype=np.int64, count=len(storages))


def _bytes_of(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """A flat uint8 tensor over a whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (storage.nbytes(),), (1,))


class _Plan:
    """One suspend, kept until its resume, as columns: per storage (row) and per tensor."""
    __slots__ = ("tensors", "owner", "dtypes", "layouts", "storages", "nbytes", "offsets", "in_place", "used",
                 "small", "small_end", "sizes", "at")

    def __init__(self, tensors, owner, storages, nbytes, in_place):
        self.tensors = tensors          # tracked tensors on the device, each once
        self.owner = owner              # per tensor: the row of its storage
        self.storages = storages        # per row: the storage, kept only where freed in place (else None)
        self.nbytes = nbytes            # per row
        self.in_place = in_place        # per row: resized to 0 and back, or re-pointed (module docstring)
        # Host offsets: small rows first, packed, so that on the pool they come back as one block (resume).
        sizes = np.asarray(nbytes, dtype=np.int64)
        aligned = (sizes + ALIGN - 1) // ALIGN * ALIGN
        small = sizes < Copier.SMALL
        order = np.concatenate([np.flatnonzero(small), np.flatnonzero(~small)])
        ends = np.cumsum(aligned[order])
        offsets = np.empty_like(aligned)
        offsets[order] = ends - aligned[order]
        self.offsets = offsets.tolist()            # per row: where its bytes sit in the host buffer
        self.sizes, self.at = sizes, offsets       # the same two columns as arrays, for the copies
        self.used = int(ends[-1]) if len(ends) else 0
        self.small = small.tolist()                # per row: below Copier.SMALL
        self.small_end = int(ends[int(small.sum()) - 1]) if small.any() else 0
        self.dtypes = None              # per tensor, for the re-pointed ones: set at release
        self.layouts = None             # per tensor (storage offset, size, stride), likewise

    def moved(self) -> list[int]:
        """The tensors whose storage is re-pointed, by index."""
        in_place = self.in_place
        return [i for i, row in enumerate(self.owner) if not in_place[row]]


class StateTier(Tier):
    name = "state"

    def __init__(self, device: torch.device | str, pool: DevicePool | None = None):
        self.device = exact_device(device)
        self.pool = pool
        self._host: torch.Tensor | None = None
        self._plan: Optional[_Plan] = None
        self._host_views: dict[int, torch.Tensor] = {}
        self.suspended = False
        self._cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._copier = None if self._cuda else Copier()
        self._spill: Optional[SpillFile] = None   # while the host copy is on disk
        self._empty: dict[torch.dtype, torch.Tensor] = {}   # what a re-pointed tensor holds while suspended

    # -- suspend -----------------------------------------------------------------------------------------
    def suspend(self, tensors: list[torch.Tensor]) -> dict:
        if self.suspended:
            raise RuntimeError("suspend: the job is already suspended")
        t0 = time.perf_counter()
        plan = self._make_plan(tensors)
        grew = self._ensure_host(plan.used)
        t1 = time.perf_counter()
        self._copy_out(plan)
        t2 = time.perf_counter()
        # Every byte is on the host: only now let go of device memory.
        self._release(plan)
        self._plan = plan
        if self._cuda:
            torch.cuda.empty_cache()
        t3 = time.perf_counter()
        self.suspended = True
        self._host_views.clear()
        return {"bytes": plan.used, "storages": len(plan.nbytes), "tensors": len(plan.tensors),
                "host_alloc_s": t1 - t0 if grew else 0.0, "copy_s": t2 - t1, "release_s": t3 - t2,
                "total_s": t3 - t0}

    def _make_plan(self, tensors: list[torch.Tensor]) -> _Plan:
        device, strided = self.device, torch.strided
        ts = [t for t in tensors if t.device == device and t.layout == strided]
        storages = list(map(_storage_of, ts))
        # Shared memory (`model.share_memory()`, Hogwild) stays where it is: other processes map it, so a suspend
        # would not free it, moving it would cut them off, and torch crashes resizing it. (On a GPU every
        # storage says it is shared.)
        shared = device.type == "cpu" and any(map(torch.UntypedStorage.is_shared, storages))
        if shared or 0 in map(torch.UntypedStorage.nbytes, storages):   # an empty tensor: nothing to move
            keep = [i for i, s in enumerate(storages) if s.nbytes() and not (shared and s.is_shared())]
            ts, storages = [ts[i] for i in keep], [storages[i] for i in keep]
        keys = list(map(torch.UntypedStorage.data_ptr, storages))
        # Tensors over one storage share its row: the dict keeps first-seen order, one storage object per key.
        unique = dict(zip(keys, storages))
        rows = {key: row for row, key in enumerate(unique)}
        owner = list(map(rows.__getitem__, keys))
        kept = list(unique.values())
        nbytes = list(map(torch.UntypedStorage.nbytes, kept))
        if self.pool is not None and self.device.type == "cpu":
            in_place = [False] * len(kept)   # the pool's memory: a resume must take it from the pool
        else:
            in_place = list(map(torch.UntypedStorage.resizable, kept))
        return _Plan(ts, owner, kept, nbytes, in_place)

    def _release(self, plan: _Plan) -> None:
        _each(torch.UntypedStorage.resize_, [s for s, ip in zip(plan.storages, plan.in_place) if ip], repeat(0))
        moved = plan.moved()
        if moved:
            ts = [plan.tensors[i] for i in moved]
            dtypes = [t.dtype for t in ts]
            plan.dtypes = dtypes
            plan.layouts = list(zip(map(torch.Tensor.storage_offset, ts), map(torch.Tensor.size, ts),
                                    map(torch.Tensor.stride, ts)))
            empty = self._empty
            for dt in set(dtypes).difference(empty):
                empty[dt] = torch.empty(0, dtype=dt, device=self.device)
            _repoint(ts, map(empty.__getitem__, dtypes))
            # The plan must not keep a re-pointed storage alive: that memory is what the suspend gives back.
            plan.storages = [s if ip else None for s, ip in zip(plan.storages, plan.in_place)]

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

    def _host_copy(self, dsts: np.ndarray, srcs: np.ndarray, nbytes: np.ndarray) -> None:
        """CPU copies by address (columns of int64). Small ones in one native call: each costs more to dispatch
        than to copy, and the Copier's own per-range loop would double that; large ones go to the Copier's
        threads."""
        small = nbytes < Copier.SMALL
        if small.all():
            _copy_small(dsts, srcs, nbytes)
            return
        if small.any():
            _copy_small(dsts[small], srcs[small], nbytes[small])
        large = ~small
        self._copier.copy(list(zip(dsts[large].tolist(), srcs[large].tolist(), nbytes[large].tolist())))

    def _copy_out(self, plan: _Plan) -> None:
        if not self._cuda:
            self._host_copy(self._host.data_ptr() + plan.at, _addresses(plan.storages), plan.sizes)
            return
        stream = self._stream
        # The whole device, not the current stream alone: a side stream or a collective's may still be writing
        # these tensors, and their memory is freed right after the copy.
        torch.cuda.synchronize(self.device)
        with torch.cuda.stream(stream):
            for storage, offset, nbytes in zip(plan.storages, plan.offsets, plan.nbytes):
                self._chunks(self._host[offset:offset + nbytes], _bytes_of(storage, self.device), nbytes)
        stream.synchronize()

    @staticmethod
    def _chunks(dst: torch.Tensor, src: torch.Tensor, nbytes: int) -> None:
        for lo in range(0, nbytes, COPY_CHUNK):
            hi = min(nbytes, lo + COPY_CHUNK)
            dst[lo:hi].copy_(src[lo:hi], non_blocking=True)

    # -- resume ------------------------------------------------------------------------------------------
    def resume(self) -> dict:
        if not self.suspended:
            raise RuntimeError("resume: the job is not suspended")
        t0 = time.perf_counter()
        unspill_s = self._unspill()
        plan = self._plan
        try:
            fresh, block = self._take_device_memory(plan)
        except Exception:
            # Out of device memory: give back what was taken, so the job stays suspended as it was.
            _each(torch.UntypedStorage.resize_, [s for s, ip in zip(plan.storages, plan.in_place) if ip], repeat(0))
            raise
        t1 = time.perf_counter()
        self._copy_in(plan, fresh, block)
        t2 = time.perf_counter()
        if plan.layouts is not None:
            # new() of the empty tensor it holds: same dtype and device, without parsing them again per tensor
            empty, ts, owner = self._empty, plan.tensors, plan.owner
            for i, dtype, (offset, size, stride) in zip(plan.moved(), plan.dtypes, plan.layouts):
                _repoint([ts[i]], [empty[dtype].new().set_(fresh[owner[i]], offset, size, stride)])
        self._plan = None
        self._host_views.clear()
        self.suspended = False
        t3 = time.perf_counter()
        return {"bytes": plan.used, "unspill_s": unspill_s, "alloc_s": t1 - t0 - unspill_s, "copy_s": t2 - t1,
                "total_s": t3 - t0}

    def _take_device_memory(self, plan: _Plan) -> tuple[list, Optional[torch.UntypedStorage]]:
        """Per row, the storage its bytes go back into; and the pool block under them all, if there is one."""
        _each(torch.UntypedStorage.resize_, [s for s, ip in zip(plan.storages, plan.in_place) if ip],
              [n for n, ip in zip(plan.nbytes, plan.in_place) if ip])
        if self.pool is None or self.device.type != "cpu" or not plan.nbytes:
            return [s if ip else self._device_storage(n)
                    for s, n, ip in zip(plan.storages, plan.nbytes, plan.in_place)], None
        # On the pool every row is re-pointed. The small rows share one block, laid out as in the host buffer
        # (one region to take, one memcpy back); each is still its own storage over its slice, which keeps
        # the block alive (through a ctypes array, not a tensor, which the residue scan would name). Large
        # rows take their own region, so that a view a user kept pins only its own storage's memory.
        block = None
        if plan.small_end:
            block = self.pool.storage(plan.small_end)
            window = (ctypes.c_char * plan.small_end).from_address(block.data_ptr())
            window.block = block
            memory = memoryview(window).cast("B")
        return [torch.frombuffer(memory[off:off + n], dtype=torch.uint8).untyped_storage() if small
                else self.pool.storage(n) for off, n, small in zip(plan.offsets, plan.nbytes, plan.small)], block

    def _device_storage(self, nbytes: int) -> torch.UntypedStorage:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device).untyped_storage()

    def _copy_in(self, plan: _Plan, fresh: list, block: Optional[torch.UntypedStorage]) -> None:
        if not self._cuda:
            base = self._host.data_ptr()
            if block is None:
                self._host_copy(_addresses(fresh), base + plan.at, plan.sizes)
                return
            large = [(s.data_ptr(), base + off, n) for s, off, n, small
                     in zip(fresh, plan.offsets, plan.nbytes, plan.small) if not small]
            dsts, srcs, nbytes = zip(*large) if large else ((), (), ())
            self._host_copy(*(np.array(col, dtype=np.int64) for col in
                              ([block.data_ptr(), *dsts], [base, *srcs], [plan.small_end, *nbytes])))
            return
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))   # the fresh blocks were allocated on it
        with torch.cuda.stream(stream):
            for storage, offset, nbytes in zip(fresh, plan.offsets, plan.nbytes):
                self._chunks(_bytes_of(storage, self.device), self._host[offset:offset + nbytes], nbytes)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        stream.synchronize()

    # -- spill: the host copy to disk and back ----------------------------------------------------------------
    def spill(self, path: str) -> dict:
        if not self.suspended:
            raise RuntimeError("spill: the job is not suspended")
        if self._spill is not None:
            return {"bytes": 0, "seconds": 0.0, "already": True}
        t0 = time.perf_counter()
        used = self._plan.used
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
            plan, host = self._plan, self._host.untyped_storage()
            # A tensor freed in place kept its metadata; a re-pointed one's was recorded at release.
            layouts = {i: (dt, *layout) for i, dt, layout in zip(plan.moved(), plan.dtypes or (), plan.layouts or ())}
            for i, (t, row) in enumerate(zip(plan.tensors, plan.owner)):
                dtype, offset, size, stride = layouts.get(i) or (t.dtype, t.storage_offset(), t.size(), t.stride())
                # host offsets are 64-byte aligned, so they are whole elements of any dtype
                start = plan.offsets[row] // dtype.itemsize + offset
                self._host_views[id(t)] = torch.empty(0, dtype=dtype).set_(host, start, size, stride)
        return self._host_views.get(id(tensor))

    def on_device(self, tensor: torch.Tensor) -> bool:
        if self.device.type == "cpu":
            # A virtual GPU's device memory is its pool; any other CPU tensor is host memory, not residue.
            return self.pool is not None and self.pool.holds(tensor.untyped_storage().data_ptr())
        return tensor.device == self.device
