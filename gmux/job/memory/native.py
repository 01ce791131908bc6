"""The Python face of the native core (gmux._native): the virtual GPU's page pool, a job's allocator,
torch tensors placed in native memory, allocator-tier suspend/resume, and the CuPy CUDA hookup.

How a PyTorch CUDA job's allocations reach gmux, and why that way: torch_cuda.py.
On a virtual GPU (CPU) there is no allocator to hook: `place()` moves the job's tensor storages into
native memory in place (`Tensor.set_`, identity kept), and the same suspend path applies to them.
Mechanism only, like the C under it: whether a job uses any of this is decided in gmux/job/memory/__init__.py.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Iterable, Optional

try:
    from gmux import _native
except ImportError:  # not built (no compiler when installed): jobs get the state tier and the Python pool
    _native = None

MiB = 1 << 20
TAGS = {"weights": 0, "optimizer": 1, "activations": 2, "other": 3}
TAG_NAMES = {v: k for k, v in TAGS.items()}
ALIGN = 64


class NativeError(RuntimeError):
    """A native call failed; `code` is the gmux_status, the message says why."""

    def __init__(self, code: int, what: str, detail: str):
        self.code = code
        super().__init__(f"{what}: {detail}")


def available() -> bool:
    return _native is not None


def _require():
    if _native is None:
        raise RuntimeError("gmux._native is not built; reinstall gmux with a C compiler (pip install -e .)")
    return _native.ffi, _native.lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        ffi, lib = _native.ffi, _native.lib
        detail = (ffi.string(lib.gmux_last_error()).decode(errors="replace")
                  or ffi.string(lib.gmux_strerror(rc)).decode())
        raise NativeError(rc, what, detail)


def _tag(tag: str | int) -> int:
    if isinstance(tag, int) and tag in TAG_NAMES:
        return tag
    if tag not in TAGS:
        raise ValueError(f"unknown tag {tag!r}; expected one of {', '.join(TAGS)}")
    return TAGS[tag]


def copy_ranges(dsts, srcs, nbytes) -> bool:
    """Copies nbytes[i] bytes from address srcs[i] to dsts[i], for every i, in one native call (each column a
    sequence of ints or an integer numpy array); False (nothing copied) where gmux._native is not built."""
    if _native is None:
        return False
    import numpy as np
    n = len(dsts)
    cols = np.empty((3, n), dtype=np.uint64)
    cols[0], cols[1], cols[2] = dsts, srcs, nbytes
    first = _native.ffi.cast("uint64_t *", cols.ctypes.data)
    _native.lib.gmux_copy_ranges(first, first + n, first + 2 * n, n)
    return True


def native_path() -> str:
    """The shared object that exports gmux_alloc/gmux_free (for CUDAPluggableAllocator's dlopen)."""
    _require()
    return os.path.abspath(_native.__file__)


class Pool:
    """A virtual GPU's memory: chunks of a shared-memory file faulted in once, mapped by jobs on demand."""

    def __init__(self, handle, path: Optional[str]):
        self._h = handle
        self.path = path
        self._users: "weakref.WeakSet[Allocator]" = weakref.WeakSet()

    @classmethod
    def create(cls, size: int, chunk: int = 2 * MiB, path: Optional[str] = None) -> "Pool":
        ffi, lib = _require()
        if size <= 0 or chunk <= 0:
            raise ValueError(f"pool size and chunk must be positive, got {size} and {chunk}")
        out = ffi.new("gmux_pool **")
        _check(lib.gmux_pool_create(path.encode() if path else ffi.NULL, size, chunk, out), "creating the pool")
        return cls(out[0], path)

    @classmethod
    def open(cls, path: Optional[str] = None, fd: Optional[int] = None) -> "Pool":
        ffi, lib = _require()
        if (path is None) == (fd is None):
            raise ValueError("open a pool by exactly one of path= or fd=")
        out = ffi.new("gmux_pool **")
        if path is not None:
            _check(lib.gmux_pool_open(path.encode(), out), f"opening pool {path}")
        else:
            _check(lib.gmux_pool_open_fd(fd, out), f"opening pool fd {fd}")
        return cls(out[0], path)

    def _handle(self):
        if self._h is None:
            raise RuntimeError("the pool is closed")
        return self._h

    @property
    def fd(self) -> int:
        return _native.lib.gmux_pool_fd(self._handle())

    def info(self) -> dict:
        ffi, lib = _require()
        out = ffi.new("gmux_pool_info *")
        _check(lib.gmux_pool_info_get(self._handle(), out), "pool info")
        return {"chunk_bytes": out.chunk_bytes, "chunks": out.nchunks, "free_chunks": out.free_chunks,
                "bytes": out.chunk_bytes * out.nchunks, "free_bytes": out.chunk_bytes * out.free_chunks}

    @property
    def in_use(self) -> int:
        i = self.info()
        return i["bytes"] - i["free_bytes"]

    def reclaim(self) -> int:
        ffi, lib = _require()
        out = ffi.new("uint64_t *")
        _check(lib.gmux_pool_reclaim(self._handle(), out), "reclaiming chunks of dead jobs")
        return out[0]

    def close(self) -> None:
        if any(a._h is not None for a in self._users):
            raise RuntimeError("the pool still backs open allocators; close them first")
        if self._h is not None:
            _native.lib.gmux_pool_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Allocator:
    """A job's allocator: every allocation is an address range with physical memory mapped into it."""

    def __init__(self, handle, pool: Optional[Pool] = None):
        self._h = handle
        self.pool = pool  # keeps the pool open while the allocator maps its chunks
        # Re-entrant: a garbage collection inside a locked section may free a region (_release_region).
        self._lock = threading.RLock()
        if pool is not None:
            pool._users.add(self)

    @classmethod
    def host(cls, pool: Pool) -> "Allocator":
        ffi, lib = _require()
        out = ffi.new("gmux_allocator **")
        _check(lib.gmux_allocator_host(pool._handle(), out), "host allocator")
        return cls(out[0], pool)

    @classmethod
    def cuda(cls, device: int = 0) -> "Allocator":
        ffi, lib = _require()
        out = ffi.new("gmux_allocator **")
        _check(lib.gmux_allocator_cuda(device, out), f"CUDA allocator on device {device}")
        return cls(out[0])

    def _handle(self):
        if self._h is None:
            raise RuntimeError("the allocator is closed")
        return self._h

    @property
    def address(self) -> int:
        """The gmux_allocator* as an integer (CuPy's CFunctionAllocator param)."""
        return int(_native.ffi.cast("uintptr_t", self._handle()))

    @property
    def backend(self) -> str:
        return _native.ffi.string(_native.lib.gmux_allocator_backend(self._handle())).decode()

    @property
    def granularity(self) -> int:
        return _native.lib.gmux_allocator_granularity(self._handle())

    def malloc(self, size: int, tag: str | int = "other") -> int:
        ffi, lib = _require()
        out = ffi.new("void **")
        _check(lib.gmux_malloc(self._handle(), size, ffi.NULL, out), f"allocating {size} bytes")
        address = int(ffi.cast("uintptr_t", out[0]))
        if _tag(tag) != TAGS["other"]:
            self.set_tag(address, tag)
        return address

    def free(self, address: int, size: int = 0) -> None:
        _check(_native.lib.gmux_mfree(self._handle(), _native.ffi.cast("void *", address), size),
               f"free of 0x{address:x}")

    def set_tag(self, address: int, tag: str | int) -> None:
        _check(_native.lib.gmux_set_tag(self._handle(), _native.ffi.cast("void *", address), _tag(tag)), "set_tag")

    def set_default_tag(self, tag: str | int) -> None:
        _check(_native.lib.gmux_set_default_tag(self._handle(), _tag(tag)), "set_default_tag")

    def set_limit(self, nbytes: int) -> None:
        """Past `nbytes` (the spans of all allocations; 0: no limit) an allocation fails (GMUX_E_NOMEM)."""
        _check(_native.lib.gmux_set_limit(self._handle(), nbytes), "set_limit")

    def boundary(self) -> None:
        _check(_native.lib.gmux_boundary(self._handle()), "boundary")

    def stats(self) -> dict:
        ffi, lib = _require()
        s = ffi.new("gmux_stats *")
        _check(lib.gmux_stats_get(self._handle(), s), "stats")
        return {"live": s.live_total, "peak": s.peak_total, "at_boundary": s.at_boundary_total,
                "live_by_tag": {TAG_NAMES[i]: s.live[i] for i in range(4)},
                "peak_by_tag": {TAG_NAMES[i]: s.peak[i] for i in range(4)},
                "at_boundary_by_tag": {TAG_NAMES[i]: s.at_boundary[i] for i in range(4)},
                "mapped": s.mapped_bytes, "reserved": s.reserved_bytes, "allocations": s.allocations,
                "suspended": bool(s.suspended), "errors": s.errors,
                "limit": s.limit, "committed": s.committed, "refused": s.refused}

    def allocations(self) -> list[dict]:
        ffi, lib = _require()
        count = ffi.new("uint64_t *")
        _check(lib.gmux_list(self._handle(), ffi.NULL, 0, count), "listing allocations")
        buf = ffi.new("gmux_alloc_info[]", max(1, count[0] + 16))  # room for allocations made meanwhile
        _check(lib.gmux_list(self._handle(), buf, len(buf), count), "listing allocations")
        return [{"address": buf[i].address, "size": buf[i].size, "tag": TAG_NAMES[buf[i].tag]}
                for i in range(min(count[0], len(buf)))]

    def lookup(self, address: int) -> Optional[dict]:
        """The allocation containing `address`, or None."""
        ffi, lib = _require()
        out = ffi.new("gmux_alloc_info *")
        if lib.gmux_lookup(self._handle(), address, out) != 0:
            return None
        return {"address": out.address, "size": out.size, "tag": TAG_NAMES[out.tag]}

    @property
    def suspended(self) -> bool:
        return bool(_native.lib.gmux_is_suspended(self._handle()))

    def suspend(self, live: Optional[Iterable[tuple[int, int]]] = None) -> dict:
        """Copies `live` (address, length) ranges, or every allocation whole, to the host store and
        releases all physical memory; addresses stay reserved."""
        ffi, lib = _require()
        out = ffi.new("gmux_swap_stats *")
        if live is None:
            _check(lib.gmux_suspend(self._handle(), ffi.NULL, 0, out), "suspend")
        else:
            ranges = list(live)
            arr = ffi.new("gmux_range[]", max(1, len(ranges)))
            for i, (a, n) in enumerate(ranges):
                arr[i].address, arr[i].length = a, n
            _check(lib.gmux_suspend(self._handle(), arr, len(ranges), out), "suspend")
        return _swap_figures(out)

    def resume(self) -> dict:
        ffi, lib = _require()
        out = ffi.new("gmux_swap_stats *")
        _check(lib.gmux_resume(self._handle(), out), "resume")
        return _swap_figures(out)

    def peek(self, address: int, n: int) -> bytearray:
        """Saved bytes of a suspended job (for a checkpoint taken while suspended)."""
        buf = bytearray(n)
        ffi, lib = _require()
        _check(lib.gmux_peek(self._handle(), address, ffi.from_buffer(buf), n), f"reading saved bytes at 0x{address:x}")
        return buf

    def install(self, device: int) -> None:
        """Makes gmux_alloc/gmux_free on `device` (torch's pluggable-allocator entry points) use this allocator."""
        _check(_native.lib.gmux_install(self._handle(), device), f"installing on device {device}")

    def close(self) -> None:
        with self._lock:
            if self._h is not None:
                _check(_native.lib.gmux_allocator_destroy(self._h), "closing the allocator")
                self._h = None

    def __del__(self):
        # Unreachable means no placed region refers to it any more (each region's finalizer does).
        try:
            self.close()
        except Exception:
            pass

    def _release_region(self, ptr) -> None:
        with self._lock:
            if self._h is not None:  # closing the allocator already unmapped everything
                _native.lib.gmux_mfree(self._h, ptr, 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _swap_figures(s) -> dict:
    return {"bytes": s.bytes_copied, "mapped_bytes": s.bytes_mapped, "allocations": s.allocations, "units": s.units,
            "sync_s": s.sync_s, "stage_s": s.stage_s, "copy_s": s.copy_s, "map_s": s.map_s, "total_s": s.total_s}


# -- torch CPU tensors in native memory (virtual GPUs) -------------------------------------------------------
def place(allocator: Allocator, tensors: Iterable, tags: Optional[Iterable[str]] = None) -> dict:
    """Moves the storages of CPU `tensors` into native memory in place: each tensor keeps its identity,
    offset, shape and strides (`set_` under no_grad), tensors sharing a storage share the new one.
    Storages already in this allocator's memory are left alone. One allocation per tag and lifetime holds
    those storages (the pool's chunks are 2 MiB: one allocation per bias vector would waste most of them);
    it is freed when the last storage over it dies. Gradients get allocations of their own, since
    `zero_grad()` drops them every step while weights and optimizer state live on."""
    import torch

    ffi, _ = _require()
    tensors = list(tensors)
    grads = {id(t.grad) for t in tensors if isinstance(t, torch.nn.Parameter) and t.grad is not None}
    tags = list(tags) if tags is not None else [
        "weights" if isinstance(t, torch.nn.Parameter) else "other" for t in tensors]
    if len(tags) != len(tensors):
        raise ValueError(f"place: {len(tensors)} tensors but {len(tags)} tags")
    if allocator.suspended:
        raise RuntimeError("place: the allocator is suspended")
    groups: dict[int, tuple] = {}
    for t, tag in zip(tensors, tags):
        if t.device.type != "cpu" or t.layout != torch.strided:
            raise ValueError(f"place: only dense CPU tensors go to a virtual GPU's memory, got {t.device} {t.layout}")
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or allocator.lookup(storage.data_ptr()) is not None:
            continue
        entry = groups.setdefault(storage.data_ptr(), (storage, (_tag(tag), id(t) in grads), []))
        entry[2].append(t)
    by_kind: dict[tuple, list] = {}
    for storage, kind, views in groups.values():
        by_kind.setdefault(kind, []).append((storage, views))
    placed = 0
    from .limit import cpu_limit
    limiter = cpu_limit()   # the job's limit counts its storages wherever they live (limit.py)
    for (tag, _), items in by_kind.items():
        offsets, total = [], 0
        for storage, _ in items:
            offsets.append(total)
            total += (storage.nbytes() + ALIGN - 1) // ALIGN * ALIGN
        if limiter is not None:
            limiter.claim(total, check=False)   # moved, not grown: the heap storages go just below
        try:
            address = allocator.malloc(total, tag)
        except BaseException:
            if limiter is not None:
                limiter.release(total)
            raise
        region = ffi.gc(ffi.cast("void *", address), _releaser(allocator, limiter, total))
        buf = ffi.buffer(region, total)  # holds `region`; torch.frombuffer holds `buf`
        with torch.no_grad():
            for (storage, views), off in zip(items, offsets):
                fresh = torch.frombuffer(buf, dtype=torch.uint8, count=storage.nbytes(), offset=off).untyped_storage()
                torch.empty(0, dtype=torch.uint8).set_(fresh).copy_(
                    torch.empty(0, dtype=torch.uint8).set_(storage))
                for t in views:
                    if t.is_inference():
                        # (made under inference_mode: changed in place only under it, no accumulator to keep)
                        with torch.inference_mode():
                            t.set_(fresh, t.storage_offset(), t.size(), t.stride())
                    elif t.is_leaf and t.requires_grad:
                        # `.data =`, not set_(): set_() gives a trained leaf a new gradient accumulator, and the
                        # hooks on the old one (DDP's all-reduce, a script's own) would never fire again.
                        t.data = torch.empty(0, dtype=t.dtype).set_(fresh, t.storage_offset(), t.size(), t.stride())
                    else:
                        t.set_(fresh, t.storage_offset(), t.size(), t.stride())
        placed += total
    return {"bytes": placed, "storages": len(groups)}


def _releaser(allocator: Allocator, limiter, nbytes: int):
    """Frees a placed region when the last storage over it dies, and gives its bytes back to the job's count."""
    def release(ptr) -> None:
        allocator._release_region(ptr)
        if limiter is not None:
            limiter.release(nbytes)
    return release


def storage_ranges(tensors: Iterable) -> list[tuple[int, int]]:
    """(address, nbytes) of each distinct storage: what is live for a job whose tensors are all known."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        if s.nbytes():
            seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
    return sorted(seen.items())


# -- CuPy ----------------------------------------------------------------------------------------------------
def cupy_allocator(allocator: Allocator):
    """A CuPy allocator over gmux (`cupy.cuda.set_allocator(cupy_allocator(a).malloc)`)."""
    try:
        import cupy
    except ImportError as e:
        raise RuntimeError("cupy is not installed") from e
    ffi, lib = _require()
    fn = lambda name: int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
    return cupy.cuda.memory.CFunctionAllocator(allocator.address, fn("gmux_cupy_malloc"), fn("gmux_cupy_free"),
                                               allocator)
