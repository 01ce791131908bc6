"""A PyTorch CUDA job's allocations routed through gmux's native allocator (`route_torch_cuda`), and why this way:
  * `torch.cuda.memory.change_current_allocator` would route every allocation, but it must run before CUDA
    is initialised and it *replaces* the caching allocator: every tensor becomes a driver call, and
    `torch.cuda.memory_stats()` / `memory_allocated()` stop working (the runtime's reports need them).
  * `torch.cuda.MemPool(CUDAPluggableAllocator)` keeps the caching allocator on top (stats keep working,
    segments are cached, gmux sees segment-sized calls), but `torch.cuda.use_mem_pool` routes only the
    *current thread*, and backward runs on autograd's device threads: their gradients would bypass gmux.
  * So: the MemPool, entered with `torch._C._cuda_beginAllocateToPool(device, pool.id)`, whose filter
    accepts every stream from every thread (torch >= 2.8; use_mem_pool uses the current-thread variant). Forward,
    backward and optimizer all land in gmux memory, and the caching allocator still keeps the stats.
    Costs: `expandable_segments` cannot serve a pool (refused here with a clear error), and while the pool
    is entered the caching allocator defers freeing blocks that were used on a second stream
    (record_stream), as it does during graph capture: cross-stream jobs hold that memory a little longer.
  * Pools begun after gmux's must go ahead of it: a CUDA graph's capture (`torch.cuda.graph`: torch.compile's
    "reduce-overhead" cudagraph trees, `make_graphed_callables`), `use_mem_pool` (FSDP2's and symmetric memory's
    NCCL pools, a script's own), inductor's warm-up in its graph pool. Had gmux's pool taken a capture's
    intermediate tensors, it would give them back when the capture ends and hand them out again to eager tensors
    that every replay then overwrites. torch from 2.10 or so gives an allocation to the pool begun *last* whose
    filter takes its stream, which is right as it is; torch 2.8 and 2.9 to the *first*, gmux's. Which one this
    torch does is measured when the routing starts (`latest_pool_wins`: one byte under a throwaway `use_mem_pool`
    beside a throwaway every-stream pool); where the first wins, each time another pool is begun on a routed
    device gmux's entry is taken out and begun again, behind it (`_yield_to_later_pools`). A library that
    imported torch's bindings by name before the routing started keeps the unwrapped ones. What other pools
    hold is theirs, as the script asked: a suspend does not copy it out, and it stays on the device.
  * Not handled: a `torch.cuda.MemPool` object the script destroys while the routing is on. Its destructor
    empties the pool and syncs its events, which the caching allocator refuses while any pool is being
    allocated to (an internal assertion, raised in a destructor: the process aborts). gmux's pool always is.
  * Suspend copies only the caching allocator's *active* blocks (from `torch.cuda.memory_snapshot()`), not
    the free space cached inside segments; every segment keeps its address, so every tensor, known to the
    runtime or not, is valid after resume.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Callable, Optional

from .native import Allocator, native_path


class CannotRoute(RuntimeError):
    """This job's allocations cannot be routed through gmux; it runs on torch's own allocator (state tier)."""


def live_ranges_from_snapshot(snapshot: list[dict], owns) -> list[tuple[int, int]]:
    """Active blocks of the caching allocator's segments that `owns(segment_address)`: the bytes a job
    really uses, without the free space cached inside its segments."""
    ranges = []
    for seg in snapshot:
        if not owns(seg["address"]):
            continue
        at = seg["address"]
        for block in seg.get("blocks", []):
            addr = block.get("address", at)
            if block["state"] in ("active_allocated", "active_pending_free"):
                ranges.append((addr, block["size"]))
            at = addr + block["size"]
    return ranges


class TorchCudaRouting:
    """All of one device's torch allocations, on every thread, through `allocator` (see the module notes)."""

    def __init__(self, allocator: Allocator, device: int = 0):
        import torch

        check_routable()
        self.allocator, self.device = allocator, device
        allocator.install(device)
        self._pluggable = torch.cuda.memory.CUDAPluggableAllocator(native_path(), "gmux_alloc", "gmux_free")
        self.pool = torch.cuda.MemPool(self._pluggable.allocator())
        # Never destroyed, not even when the interpreter exits: a MemPool's destructor empties its pool, which
        # the caching allocator refuses while the pool is being allocated to (and torch 2.8's asserts it holds
        # the only reference), both from a destructor, where an error aborts the process after the script
        # finished. The process's end gives the memory back.
        for keep in (self._pluggable, self.pool):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(keep))
        # Measured before gmux's pool is begun: a MemPool destroyed while any pool is being allocated to trips
        # the caching allocator's assertion that no capture is under way (its destructor syncs the pool's events).
        self.latest_pool_wins = latest_pool_wins(device)
        torch._C._cuda_beginAllocateToPool(device, self.pool.id)
        self.active = True
        if not self.latest_pool_wins:
            _yield_to_later_pools()

    def owns(self, address: int) -> bool:
        return self.allocator.lookup(address) is not None

    def go_last(self) -> None:
        """Behind every other pool being allocated to on the device."""
        self._begin_again()

    def _begin_again(self, meanwhile: Optional[Callable[[], object]] = None) -> None:
        """Out of the allocator's list of pools being allocated to (`meanwhile` runs then), and begun again at its
        end through torch's own binding; the begin's reference to the pool is released, so its count stays."""
        import torch

        with _lock:
            if not self.active:
                return
            torch._C._cuda_endAllocateToPool(self.device, self.pool.id)
            try:
                if meanwhile is not None:
                    meanwhile()
            finally:
                begin = torch._C._cuda_beginAllocateToPool
                getattr(begin, "__wrapped__", begin)(self.device, self.pool.id)
                torch._C._cuda_releasePool(self.device, self.pool.id)

    def drain(self) -> None:
        """Lets torch recycle what the job freed after using it on a second stream (record_stream: collectives,
        side streams). torch up to 2.12 takes any pool being allocated to for a CUDA graph's capture and defers
        that until none is, and gmux's always is: a leak, growing every mini-batch. So, between mini-batches (no
        capture under way), gmux's pool leaves the list for one allocation, which processes the deferred frees,
        and is begun again (the allocation's 2 MiB segment is torch's own, kept cached). Begun again, it is the
        last begun: where the last begun is served first, a pool a script keeps open across mini-batches (an
        NCCL `use_mem_pool` around the whole loop) loses its allocations to gmux's from then on. Also, while
        out, another thread's allocation goes to torch's default pool. Neither is handled.
        torch.cuda.empty_cache() frees nothing while gmux's pool is begun (torch skips it during captures)."""
        import torch

        if not torch.cuda.is_current_stream_capturing():
            self._begin_again(lambda: torch.empty(1, dtype=torch.uint8, device=f"cuda:{self.device}"))

    def live_ranges(self) -> list[tuple[int, int]]:
        """torch's active blocks inside its segments, plus every other allocation of this allocator whole
        (CuPy arrays, for instance, which have no cached free space)."""
        import torch

        mine = {a["address"]: a["size"] for a in self.allocator.allocations()}
        snapshot = [seg for seg in torch.cuda.memory_snapshot() if seg["address"] in mine]
        torch_segments = {seg["address"] for seg in snapshot}
        others = [(addr, size) for addr, size in mine.items() if addr not in torch_segments]
        return live_ranges_from_snapshot(snapshot, lambda address: True) + others

    def stop(self) -> None:
        import torch

        if self.active:
            torch._C._cuda_endAllocateToPool(self.device, self.pool.id)
            self.active = False


_routings: dict[int, TorchCudaRouting] = {}


def latest_pool_wins(device: int) -> bool:
    """Whether this torch gives an allocation to the pool begun last, of those whose filters take its stream (see
    the module notes): one byte is allocated under `use_mem_pool(second)` while `first` takes every stream, and
    the segment it lands in says whose it is. Both pools are gone again before this returns."""
    import torch

    first, second = torch.cuda.MemPool(), torch.cuda.MemPool()
    torch._C._cuda_beginAllocateToPool(device, first.id)
    try:
        with torch.cuda.use_mem_pool(second, device=device):
            one = torch.empty(1, dtype=torch.uint8, device=f"cuda:{device}")
    finally:
        torch._C._cuda_endAllocateToPool(device, first.id)
        torch._C._cuda_releasePool(device, first.id)     # its count back to the MemPool's own reference
    at = one.data_ptr()
    pool = next((seg.get("segment_pool_id") for seg in torch.cuda.memory_snapshot()
                 if seg["address"] <= at < seg["address"] + seg["total_size"]), None)
    del one
    if pool is None:        # (a torch whose snapshot does not name pools: LIFO came with 2.10)
        return tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 10)
    return tuple(pool) == tuple(second.id)


def check_routable() -> None:
    """Raises CannotRoute, saying why, where this process's torch allocations cannot be routed."""
    import torch

    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
    if "expandable_segments:true" in conf.replace(" ", "").lower():
        raise CannotRoute("expandable_segments is set (PYTORCH_CUDA_ALLOC_CONF), and the caching allocator does "
                          "not serve memory pools from them")
    # Before torch 2.8 the binding named _cuda_beginAllocateToPool was the *current-thread* one (2.8 renamed it
    # _cuda_beginAllocateCurrentThreadToPool and gave the old name the every-stream filter). Without the new
    # name, the old one would silently miss backward's threads.
    if not (hasattr(torch._C, "_cuda_beginAllocateToPool") and
            hasattr(torch._C, "_cuda_beginAllocateCurrentThreadToPool")):
        raise CannotRoute(f"torch {torch.__version__} cannot route every thread's allocations to a pool (needs "
                          f"torch >= 2.8)")


def route_torch_cuda(device: int = 0, allocator: Optional[Allocator] = None) -> TorchCudaRouting:
    """Starts routing `device`'s torch allocations through gmux (once per device; later calls return it).
    Raises CannotRoute before anything is set up where that cannot work."""
    if device not in _routings:
        check_routable()
        _routings[device] = TorchCudaRouting(allocator or Allocator.cuda(device), device)
    return _routings[device]


def torch_routing(device: int) -> Optional[TorchCudaRouting]:
    r = _routings.get(device)
    return r if r is not None and r.active else None


# -- where the first pool begun wins, gmux's goes behind each later one (module notes) ------------------------------
_lock = threading.RLock()
_wrapped = False


def _yield_to_later_pools() -> None:
    """Wraps the ways torch begins allocating to a pool, once per process: inductor calls the bindings on
    torch._C, use_mem_pool the names torch.cuda.memory imported from it, and a graph's capture begins its pool
    inside CUDAGraph's methods (C++), on the current device: at its start, and again at each conditional node."""
    global _wrapped
    import torch
    import torch.cuda.memory as cuda_memory
    from torch.cuda import graphs

    with _lock:
        if _wrapped:
            return
        _wrapped = True

    def behind(device) -> None:
        routing = torch_routing(device)
        if routing is None:
            return
        try:
            routing.go_last()
        except RuntimeError as e:
            print(f"gmux: could not put this job's memory pool behind the one just begun ({e}); allocations "
                  f"meant for it may come from gmux's pool", file=sys.stderr)

    def wrap(begin):
        def begin_then_yield(device, pool_id, *args, **kwargs):
            out = begin(device, pool_id, *args, **kwargs)
            routing = torch_routing(_index(device))
            if routing is not None and tuple(pool_id) != tuple(routing.pool.id):
                behind(_index(device))
            return out
        begin_then_yield.__wrapped__ = begin
        return begin_then_yield

    for name in ("_cuda_beginAllocateCurrentThreadToPool", "_cuda_beginAllocateToPool",
                 "_cuda_beginAllocateCurrentStreamToPool"):
        if hasattr(torch._C, name):
            wrapped = wrap(getattr(torch._C, name))
            setattr(torch._C, name, wrapped)
            if hasattr(cuda_memory, name):
                setattr(cuda_memory, name, wrapped)

    def then_yield(method):
        def method_then_yield(self, *args, **kwargs):
            out = method(self, *args, **kwargs)
            behind(torch.cuda.current_device())
            return out
        method_then_yield.__wrapped__ = method
        return method_then_yield

    for name in ("capture_begin", "begin_capture_to_if_node", "begin_capture_to_while_loop_node",
                 "end_capture_to_conditional_node"):
        if hasattr(graphs.CUDAGraph, name):
            setattr(graphs.CUDAGraph, name, then_yield(getattr(graphs.CUDAGraph, name)))


def _index(device) -> int:
    import torch
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index
