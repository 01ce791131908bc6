"""Rebinding a suspended job's CUDA state to another GPU of this machine, in the job's own process.

A job on a real GPU sees it as device 0 (gmuxd pins it with CUDA_VISIBLE_DEVICES), and its CUDA context, its
allocator's reservations and its tensors belong to that GPU. The CUDA driver can move all of that from outside
the process: its checkpoint API (cuCheckpointProcessLock, Checkpoint, Restore, Unlock; driver 570 and later,
with GPU remapping on restore from CUDA 13.0, driver 580) locks the process's CUDA calls, copies what it holds
on its GPU into host memory and releases the GPU, then restores it onto another GPU of the same chip at the same
device addresses. The process keeps its interpreter, its model and its data position; device 0 is the new GPU.

gmuxd asks for this only once the job has suspended at a mini-batch boundary (gmux.node.moves): its memory tier
has already copied its tensors to host memory, so what the driver moves is its context and what little it still
holds, and it resumes on the target through its memory tier as after any time slice. The driver's calls block
(the copy-out, the restore), so gmuxd makes them on a thread of their own.

If anything fails after the lock, the process is put back by the state the driver reports: restored without
remapping (onto its old GPU) if it is checkpointed, then unlocked (`RebindError.where == "source"`). Where the
driver failed it, or would not say, its state is unknown (`where == "unknown"`), and gmuxd holds the job rather
than resume it. Not covered: a restore with GPU pairs that fails having half-moved the process to the target (it
is unlocked where it is, and reported as on its source); and a gmuxd restarted without --rebind-gpus does not
look for processes its predecessor left locked. The driver's calls need the caller to be allowed to act on the
process (its owner, or root) and a driver that has the API; `CudaDriver.load` says why not where it cannot be
used, and gmuxd then moves jobs between real GPUs with a new process, as before.
"""
from __future__ import annotations

import functools
import re
import threading
import time
from typing import Callable, Optional, Protocol

MIN_DRIVER = 13000          # cuDriverGetVersion's number for CUDA 13.0: its restore takes GPU pairs
LOCK_TIMEOUT_MS = 10_000    # the job is idle at its boundary; a lock that takes longer means it is not

RUNNING, LOCKED, CHECKPOINTED, FAILED = range(4)     # CUprocessState
STATE_NAMES = {RUNNING: "running", LOCKED: "locked", CHECKPOINTED: "checkpointed", FAILED: "failed"}

_CDEF = """
typedef int CUresult;
typedef struct { unsigned char bytes[16]; } CUuuid;
typedef struct { unsigned int timeoutMs; unsigned int reserved0; uint64_t reserved1[7]; } CUcheckpointLockArgs;
typedef struct { uint64_t reserved[8]; } CUcheckpointCheckpointArgs;
typedef struct { CUuuid oldUuid; CUuuid newUuid; } CUcheckpointGpuPair;
typedef struct { CUcheckpointGpuPair *gpuPairs; unsigned int gpuPairsCount; char reserved[52];
                 } CUcheckpointRestoreArgs;
typedef struct { uint64_t reserved[8]; } CUcheckpointUnlockArgs;
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuGetErrorName(CUresult error, const char **name);
CUresult cuCheckpointProcessGetState(int pid, int *state);
CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args);
CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args);
CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args);
CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args);
"""


class Unavailable(Exception):
    """This machine's CUDA driver cannot rebind processes (no driver, too old, or the API refused)."""


class DriverError(Exception):
    """One driver call failed; the message names the call and the driver's error."""


class RebindError(Exception):
    """A rebind did not happen. `where`: "source" (the process runs on its old GPU, unlocked, as before) or
    "unknown" (putting it back failed too)."""

    def __init__(self, message: str, where: str):
        super().__init__(message)
        self.where = where


class Driver(Protocol):
    """The driver calls a rebind makes (CudaDriver; tests give a stand-in that records them)."""
    def state(self, pid: int) -> int: ...
    def lock(self, pid: int, timeout_ms: int) -> None: ...
    def checkpoint(self, pid: int) -> None: ...
    def restore(self, pid: int, pairs: list) -> None: ...
    def unlock(self, pid: int) -> None: ...


def uuid_bytes(uuid: str) -> bytes:
    """NVML's "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as the driver's 16 bytes."""
    m = re.fullmatch(r"GPU-([0-9a-fA-F]{8})-([0-9a-fA-F]{4})-([0-9a-fA-F]{4})-([0-9a-fA-F]{4})-([0-9a-fA-F]{12})",
                     uuid or "")
    if m is None:
        raise ValueError(f"{uuid!r} is not a whole GPU's UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx); a MIG "
                         f"instance or a GPU listed without its UUID cannot be remapped")
    return bytes.fromhex("".join(m.groups()))


class CudaDriver:
    """libcuda's checkpoint API, through cffi (ABI mode: nothing to compile)."""

    def __init__(self, ffi, lib):
        self.ffi, self.lib = ffi, lib

    @classmethod
    @functools.cache
    def load(cls, path: str = "libcuda.so.1") -> "CudaDriver":
        """The driver, initialised (a restore needs cuInit in the calling process); Unavailable says why not."""
        try:
            import cffi
        except ImportError:
            raise Unavailable("the cffi package is not installed (gmux binds the driver with it)") from None
        ffi = cffi.FFI()
        ffi.cdef(_CDEF)
        try:
            lib = ffi.dlopen(path)
        except OSError as e:
            raise Unavailable(f"no CUDA driver ({path}: {e})") from None
        try:
            lib.cuCheckpointProcessRestore   # noqa: B018 - (an older driver has no checkpoint API)
        except AttributeError:
            raise Unavailable("this CUDA driver has no checkpoint API (driver 570 or later has it)") from None
        driver = cls(ffi, lib)
        driver._check("cuInit", lib.cuInit(0))
        version = ffi.new("int *")
        driver._check("cuDriverGetVersion", lib.cuDriverGetVersion(version))
        if version[0] < MIN_DRIVER:
            raise Unavailable(f"this CUDA driver supports CUDA {version[0] // 1000}.{version[0] % 1000 // 10}; "
                              f"restoring a process onto another GPU needs CUDA 13.0 or later (driver 580+)")
        return driver

    def _error(self, call: str, rc: int) -> str:
        name = self.ffi.new("const char **")
        known = self.lib.cuGetErrorName(rc, name) == 0 and name[0] != self.ffi.NULL
        return f"{call} failed: {self.ffi.string(name[0]).decode() if known else 'CUDA error'} ({rc})"

    def _check(self, call: str, rc: int) -> None:
        if rc != 0:
            if call in ("cuInit", "cuDriverGetVersion"):
                raise Unavailable(self._error(call, rc))
            raise DriverError(self._error(call, rc))

    def state(self, pid: int) -> int:
        out = self.ffi.new("int *")
        self._check("cuCheckpointProcessGetState", self.lib.cuCheckpointProcessGetState(pid, out))
        return out[0]

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = self.ffi.new("CUcheckpointLockArgs *", {"timeoutMs": timeout_ms})
        self._check("cuCheckpointProcessLock", self.lib.cuCheckpointProcessLock(pid, args))

    def checkpoint(self, pid: int) -> None:
        self._check("cuCheckpointProcessCheckpoint",
                    self.lib.cuCheckpointProcessCheckpoint(pid, self.ffi.new("CUcheckpointCheckpointArgs *")))

    def restore(self, pid: int, pairs: list) -> None:
        args = self.ffi.new("CUcheckpointRestoreArgs *")
        if pairs:
            gpu_pairs = self.ffi.new("CUcheckpointGpuPair[]", len(pairs))
            for i, (old, new) in enumerate(pairs):
                gpu_pairs[i].oldUuid.bytes = old
                gpu_pairs[i].newUuid.bytes = new
            args.gpuPairs, args.gpuPairsCount = gpu_pairs, len(pairs)
        self._check("cuCheckpointProcessRestore", self.lib.cuCheckpointProcessRestore(pid, args))

    def unlock(self, pid: int) -> None:
        self._check("cuCheckpointProcessUnlock",
                    self.lib.cuCheckpointProcessUnlock(pid, self.ffi.new("CUcheckpointUnlockArgs *")))


def rebind(driver: Driver, pid: int, old_uuid: str, new_uuid: str,
           lock_timeout_ms: int = LOCK_TIMEOUT_MS) -> dict:
    """Moves process `pid`'s CUDA state from GPU `old_uuid` to `new_uuid` (NVML's UUIDs); returns each step's
    seconds. Raises RebindError with the process back on its old GPU where it could be put back."""
    pairs = [(uuid_bytes(old_uuid), uuid_bytes(new_uuid))]
    try:
        state = driver.state(pid)
    except DriverError as e:
        raise RebindError(f"{e} (is pid {pid} a CUDA process gmuxd may act on?)", "source") from None
    if state != RUNNING:
        raise RebindError(f"its CUDA state is {STATE_NAMES.get(state, state)}, not running: someone else is "
                          f"checkpointing it", "source")
    times, t = {}, time.perf_counter()
    try:
        driver.lock(pid, lock_timeout_ms)
    except DriverError as e:
        raise RebindError(f"{e}: nothing changed", "source") from None
    times["lock_s"] = time.perf_counter() - t
    step = "checkpoint"
    try:
        t = time.perf_counter()
        driver.checkpoint(pid)
        times["checkpoint_s"] = time.perf_counter() - t
        step, t = "restore", time.perf_counter()
        driver.restore(pid, pairs)
        times["restore_s"] = time.perf_counter() - t
    except BaseException as e:   # noqa: BLE001 - whatever failed, the process must not stay locked
        why = f"{_said(e)}{f' onto GPU {new_uuid}' if step == 'restore' else ''}"
        try:
            put_back(driver, pid)
            where = "source"
        except BaseException:   # noqa: BLE001 - reported as unknown
            where = "unknown"
        raise RebindError(f"{why}; " + ("it is back on its GPU, as it was" if where == "source" else
                                        "putting it back failed too: its CUDA state is unknown"), where) from None
    t = time.perf_counter()
    for attempt in (1, 2):
        try:
            driver.unlock(pid)
            break
        except BaseException as e:   # noqa: BLE001
            if attempt == 2:
                raise RebindError(f"restored onto GPU {new_uuid}, then {_said(e)} (twice): its CUDA state is "
                                  f"unknown", "unknown") from None
    times["unlock_s"] = time.perf_counter() - t
    return times


def _said(e: BaseException) -> str:
    return str(e) if isinstance(e, DriverError) else f"{type(e).__name__}: {e}"


def put_back(driver: Driver, pid: int) -> int:
    """A process a rebind left locked or checkpointed (it failed, or its gmuxd died): restored onto its old GPU if
    checkpointed, then unlocked. Returns the state it was found in; raises DriverError where it does not run now
    (the driver failed it)."""
    state = driver.state(pid)
    if state == CHECKPOINTED:
        driver.restore(pid, [])
    if state in (LOCKED, CHECKPOINTED):
        driver.unlock(pid)
    elif state != RUNNING:
        raise DriverError(f"its CUDA state is {STATE_NAMES.get(state, state)}")
    return state


class Rebinding:
    """One rebind made on a thread of its own (the driver's calls block for the copy); `done()` and `result()`
    are read by gmuxd's loop."""

    def __init__(self, work: Callable[[], dict]):
        self._result: Optional[dict] = None
        self._error: Optional[BaseException] = None
        self._done = threading.Event()
        self.started = time.monotonic()

        def run():
            try:
                self._result = work()
            except BaseException as e:      # noqa: BLE001 - handed to gmuxd's loop, which reports it
                self._error = e
            finally:
                self._done.set()
        threading.Thread(target=run, name="gmux-rebind", daemon=True).start()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._done.wait(timeout)

    def result(self) -> dict:
        """Each step's seconds; raises what the rebind raised."""
        if self._error is not None:
            raise self._error
        return self._result or {}
