"""A job's GPU memory limit (`gmux-launch --mem SIZE`, `gmux submit --mem SIZE`): enforced, not only declared.

gmuxd admits jobs onto a GPU by their declared memory; a job that took more would take what its neighbours
were promised. So past its limit the job's own allocation fails, with torch's out-of-memory error (a script's
`except torch.OutOfMemoryError` catches it) whose text names the job, the limit and how to raise it; nothing
of any other job is touched. The mechanisms, chosen here:
  * virtual GPU (the job computes on the CPU): csrc/cpu_limit.cpp takes the place of torch's CPU allocator and
    counts every byte the job's tensors hold from the moment its runtime starts; the pools that may hold a
    job's state (python_pool.DevicePool, the native Pool through native.place) claim their bytes from the
    same count (`claim`/`release`), so a storage moved into a pool is counted once, wherever it lives.
  * GPU, allocations routed through gmux (torch_cuda.route_torch_cuda): the native allocator refuses past the
    limit (gmux_set_limit), counting the segments the job's pool holds, cached or in use (torch frees no
    cached segment of a pool on its way to the error, as it would of its default one); torch's caching allocator
    raises its OutOfMemoryError, and an out-of-memory observer adds gmux's words to the job's log. Not routed
    (GMUX_NATIVE=0, torch < 2.8, expandable_segments): torch's own per-process memory fraction, set to the limit.
`GMUX_MEM_SOFT=1` (gmux-launch --mem-soft) keeps the old meaning, a declaration for admission only: the job's
memory is still counted and reported, never refused.
"""
from __future__ import annotations

import ctypes
import importlib
import glob
import os
import sys
import threading
from contextlib import contextmanager
from typing import Optional

from gmux.util.sizes import format_size

SOFT_ENV = "GMUX_MEM_SOFT"
HOW = "Raise it with gmux-launch --mem SIZE (or gmux submit --mem SIZE), or make the job use less"


def soft_from_env(environ=None) -> bool:
    return (os.environ if environ is None else environ).get(SOFT_ENV, "") not in ("", "0")


def describe(limit: int, job: Optional[str] = None, name: Optional[str] = None) -> str:
    """'gmux: job j3 (hog) is over its GPU memory limit of 64.0 MiB': the first half of every refusal."""
    who = f"job {job}" + (f" ({name})" if name else "") if job else "this job"
    return f"gmux: {who} is over its GPU memory limit of {format_size(limit)}"


def _library_path() -> Optional[str]:
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # gmux/
    found = sorted(glob.glob(os.path.join(here, "_cpu_limit*.so")))
    return found[0] if found else None


class CpuLimit:
    """The counting CPU allocator of csrc/cpu_limit.cpp (one per process: torch has one CPU allocator)."""

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        lib.gmux_cpu_limit_install.argtypes = [ctypes.c_uint64]
        lib.gmux_cpu_limit_set.argtypes = [ctypes.c_uint64]
        lib.gmux_cpu_limit_text.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        lib.gmux_cpu_limit_stats.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
        lib.gmux_cpu_limit_claim.argtypes = [ctypes.c_uint64, ctypes.c_int]
        lib.gmux_cpu_limit_release.argtypes = [ctypes.c_uint64]
        lib.gmux_cpu_limit_adopt.argtypes = [ctypes.c_void_p]
        lib.gmux_cpu_limit_adopt.restype = ctypes.c_uint64
        self.what = "gmux: over the job's GPU memory limit"

    def install(self, limit: int, what: str, how: str = HOW) -> None:
        self.what = what
        self._lib.gmux_cpu_limit_text(what.encode(), how.encode())
        if self._lib.gmux_cpu_limit_install(limit) != 0:
            raise RuntimeError("torch's CPU allocator has no raw interface to wrap")

    def set(self, limit: int) -> None:
        self._lib.gmux_cpu_limit_set(limit)

    def stats(self, reset_peak: bool = False) -> dict:
        out = (ctypes.c_uint64 * 4)()
        self._lib.gmux_cpu_limit_stats(out, int(reset_peak))
        return {"limit": out[0], "in_use": out[1], "peak": out[2], "refused": out[3]}

    def claim(self, nbytes: int, check: bool = True) -> None:
        """Counts `nbytes` a pool hands the job, or raises torch.OutOfMemoryError past the limit. Without
        `check`, counts them whatever the limit: storages moving into a pool are not growth (their old memory
        is released just after), and a suspend must not fail for the limit."""
        if self._lib.gmux_cpu_limit_claim(nbytes, int(check)) != 0:
            import torch
            s = self.stats()
            raise torch.OutOfMemoryError(f"{self.what}: tried to allocate {format_size(nbytes)} with "
                                         f"{format_size(s['in_use'])} in use. {HOW}")

    def release(self, nbytes: int) -> None:
        self._lib.gmux_cpu_limit_release(nbytes)

    def adopt(self, tensors) -> int:
        """Counts the storages of `tensors` that were allocated as host memory and are the job's now (a
        restore's buffers kept as optimizer state); returns the bytes adopted."""
        seen, adopted = set(), 0
        for t in tensors:
            s = t.untyped_storage()
            if s._cdata not in seen:
                seen.add(s._cdata)
                adopted += self._lib.gmux_cpu_limit_adopt(s._cdata)
        return adopted

    @contextmanager
    def host(self):
        """Allocations of this thread inside are host memory (the runtime's copies of suspended state), not
        the job's device memory: not counted."""
        self._lib.gmux_cpu_host_enter()
        try:
            yield
        finally:
            self._lib.gmux_cpu_host_leave()


_cpu: Optional[CpuLimit] = None
_cpu_lock = threading.Lock()


def cpu_limit() -> Optional[CpuLimit]:
    """The process's CPU limiter once installed (`enforce` on a virtual GPU), else None."""
    return _cpu


def _load_cpu() -> CpuLimit:
    importlib.import_module("torch")   # loads libc10, which the library links against
    path = _library_path()
    if path is None:
        raise RuntimeError("gmux/_cpu_limit is not built (reinstall gmux with a C++ compiler and torch present: "
                           "pip install --no-build-isolation -e .)")
    try:
        return CpuLimit(ctypes.CDLL(path))
    except OSError as e:   # built against another torch: its symbols do not resolve
        raise RuntimeError(f"{path} does not load with this torch ({e}); rebuild gmux") from e


@contextmanager
def host_memory():
    """Host copies made inside are not the job's device memory (no-op without a CPU limiter)."""
    limiter = _cpu
    if limiter is None:
        yield
        return
    with limiter.host():
        yield


def adopt(tensors) -> int:
    """What the job keeps of memory made in `host_memory()` counts from now on (no-op without a CPU limiter)."""
    return _cpu.adopt(tensors) if _cpu is not None else 0


def explain(error: BaseException) -> Optional[str]:
    """The exit reason for a job that ended with `error`, when it is torch's CUDA out-of-memory error for an
    allocation gmux's routed allocator refused at the job's limit (torch's words do not say so); else None."""
    e = _enforced
    if e is None or e.allocator is None or type(error).__name__ != "OutOfMemoryError" or str(error).startswith("gmux:"):
        return None
    if not e.allocator.stats()["refused"]:
        return None
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    return f"OutOfMemoryError: {e.what}. {HOW} (torch: {first})"


class Enforced:
    """What a job's runtime holds about its limit: the figures for its reports."""

    def __init__(self, limit: Optional[int], soft: bool, how: str, cpu: Optional[CpuLimit] = None,
                 allocator=None, device: Optional[int] = None, what: str = ""):
        self.limit, self.soft, self.how, self.what = limit, soft, how, what
        self.cpu, self.allocator, self.device = cpu, allocator, device

    def figures(self) -> dict:
        """mem_limit (0: none), mem_limit_soft, mem_in_use (what counts against it) and, where counted
        exactly, mem_peak since the previous report."""
        out = {"mem_limit": self.limit or 0, "mem_limit_soft": self.soft, "mem_enforced": self.how}
        if self.cpu is not None:
            s = self.cpu.stats(reset_peak=True)
            out.update(mem_in_use=s["in_use"], mem_peak=s["peak"], mem_refused=s["refused"])
        elif self.allocator is not None:
            s = self.allocator.stats()
            out.update(mem_in_use=s["committed"], mem_refused=s["refused"])
        elif self.device is not None:
            import torch
            out["mem_in_use"] = torch.cuda.memory_reserved(self.device)
        return out


_enforced: Optional[Enforced] = None


def enforced() -> Optional[Enforced]:
    """The limit `enforce` set up in this process, if any (the runtime's reports read it)."""
    return _enforced


def enforce(limit: Optional[int], *, job: Optional[str] = None, name: Optional[str] = None,
            soft: Optional[bool] = None, cuda: Optional[bool] = None) -> Optional[Enforced]:
    """Sets the job's limit before its script allocates anything. `limit` None or 0: no limit; on a virtual
    GPU its memory is still counted, so that its reported peak is its tensors' (the process's resident size,
    the only other measure, counts every import and library: ten times as much for a small model), and on a GPU
    torch's own statistics measure it. `soft` (default: GMUX_MEM_SOFT): count and report, never refuse. Returns
    what was set up; a mechanism that cannot work here is reported on stderr and the job runs without a
    limit."""
    global _enforced
    if cuda is None:
        import torch
        cuda = torch.cuda.is_available()
    if not limit:
        return None if cuda else _measure_cpu()
    soft = soft_from_env() if soft is None else soft
    what = describe(limit, job, name)
    try:
        if cuda:
            _enforced = _enforce_cuda(limit, what, soft)
        else:
            _enforced = Enforced(limit, soft, "counted" if soft else "enforced",
                                 cpu=_install_cpu(0 if soft else limit, what))
    except RuntimeError as e:
        print(f"gmux: the memory limit of {format_size(limit)} is not enforced: {e}", file=sys.stderr)
        _enforced = Enforced(limit, True, "not enforced")
    return _enforced


def _install_cpu(limit: int, what: str) -> CpuLimit:
    """The process's counting CPU allocator, installed (once) with `limit` (0: none); RuntimeError if it cannot."""
    global _cpu
    with _cpu_lock:
        if _cpu is None:
            _cpu = _load_cpu()
    _cpu.install(limit, what)
    return _cpu


def _measure_cpu() -> Optional[Enforced]:
    global _enforced
    try:
        _enforced = Enforced(None, False, "measured", cpu=_install_cpu(0, "gmux: this job"))
    except RuntimeError:
        return None     # nothing was asked for: the profiler's estimate stands
    return _enforced


def _enforce_cuda(limit: int, what: str, soft: bool) -> Enforced:
    import torch

    from .torch_cuda import torch_routing
    device = torch.cuda.current_device()
    routing = torch_routing(device)
    if routing is not None:
        routing.allocator.set_limit(0 if soft else limit)
        if not soft:
            _observe_oom(what, routing.allocator)
        return Enforced(limit, soft, "counted" if soft else "enforced", allocator=routing.allocator, what=what)
    if soft:
        return Enforced(limit, True, "counted", device=device)
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
    _observe_oom(what, None)
    return Enforced(limit, False, "enforced (torch memory fraction)", device=device)


def _observe_oom(what: str, allocator) -> None:
    """torch's CUDA out-of-memory error has torch's words; the job's log gets gmux's too, just before it."""
    import torch

    seen = {"refused": 0}

    # torch passes (device, bytes asked, the device's total or its allowed maximum, the device's free bytes).
    def observer(device, alloc, device_total, device_free):
        held = ""
        if allocator is not None:
            stats = allocator.stats()
            if stats["refused"] == seen["refused"]:
                return   # no refusal of gmux's since the last error: the GPU itself is full, not the job's limit
            seen["refused"] = stats["refused"]
            held = f" with {format_size(stats['committed'])} of it held"
        print(f"{what}: tried to allocate {format_size(alloc)}{held}. {HOW}", file=sys.stderr, flush=True)
    if hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):
        torch._C._cuda_attach_out_of_memory_observer(observer)
