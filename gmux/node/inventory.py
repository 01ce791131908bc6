"""The GPUs of this machine: real ones through NVML, or virtual ones whose memory is a budget gmuxd enforces.

`--virtual-gpus 2x16GiB` gives two virtual GPUs of 16 GiB; with no flag, NVML is asked and, when it finds
no GPU (or no driver), gmuxd falls back to virtual GPUs so the same code runs on a laptop or CI machine.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Optional

from gmux.util.sizes import parse_size

log = logging.getLogger("gmux.inventory")

def parse_virtual_gpus(spec: str) -> list[int]:
    """'2x16GiB' -> [16 GiB, 16 GiB]; '8GiB,16GiB' -> two of different sizes."""
    sizes: list[int] = []
    for part in spec.split(","):
        alone = re.fullmatch(r"\s*(\d+)\s*x?\s*", part)      # a count alone (2, 2x) is not 2 bytes
        if alone:
            raise ValueError(f"{spec!r}: say each virtual GPU's memory too, e.g. {alone.group(1)}x16GiB for "
                             f"{alone.group(1)} GPUs of 16 GiB")
        m = re.fullmatch(r"\s*(?:(\d+)\s*x\s*)?(.+)", part)
        if not m:
            raise ValueError(f"{spec!r}: write virtual GPUs as COUNTxSIZE, e.g. 2x16GiB")
        count = int(m.group(1) or 1)
        if not 1 <= count <= 64:
            raise ValueError(f"{spec!r}: between 1 and 64 virtual GPUs")
        size = parse_size(m.group(2))
        if size < 1 << 20:
            raise ValueError(f"{spec!r}: a virtual GPU has at least 1MiB of memory")
        sizes += [size] * count
    return sizes


def gpu_list(indexes) -> str:
    """'GPU 0 only', 'GPUs 0, 1': a machine's GPUs in a message (a bare '0' read as a count of none)."""
    ids = sorted(indexes)
    return f"GPU {ids[0]} only" if len(ids) == 1 else "GPUs " + ", ".join(map(str, ids)) if ids else "no GPU"


@dataclass
class Gpu:
    index: int
    name: str
    mem_total: int
    virtual: bool
    uuid: str = ""
    # Filled by NVML on real GPUs: memory used by all processes (ours and others') right now.
    mem_used: Optional[int] = None
    processes: list = field(default_factory=list)

    def env(self) -> dict:
        """What a job on this GPU gets in its environment."""
        if self.virtual:
            # No device to expose: the job computes on the CPU and its memory budget is this GPU's.
            return {"CUDA_VISIBLE_DEVICES": "", "GMUX_VIRTUAL_GPU": str(self.index),
                    "GMUX_GPU_MEM": str(self.mem_total)}
        return {"CUDA_VISIBLE_DEVICES": self.uuid or str(self.index), "GMUX_GPU_MEM": str(self.mem_total)}


def env_for(gpus: list) -> dict:
    """What a job holding several GPUs gets: all of them, listed as CUDA_VISIBLE_DEVICES lists devices (a
    virtual GPU list in GMUX_VIRTUAL_GPU), and the smallest one's memory as its per-GPU budget."""
    if len(gpus) == 1:
        return gpus[0].env()
    env = {"GMUX_GPU_MEM": str(min(g.mem_total for g in gpus))}
    if all(g.virtual for g in gpus):
        env.update(CUDA_VISIBLE_DEVICES="", GMUX_VIRTUAL_GPU=",".join(str(g.index) for g in gpus))
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid or str(g.index) for g in gpus)
    return env


def nvml_gpus() -> list[Gpu]:
    """Real GPUs through NVML; [] when there is no driver or no GPU."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as e:  # no libnvidia-ml, no driver: a normal state on CPU machines
        log.info("NVML unavailable (%s)", e)
        return []
    gpus = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            gpus.append(Gpu(i, name.decode() if isinstance(name, bytes) else name, int(mem.total), False,
                            uuid.decode() if isinstance(uuid, bytes) else uuid, int(mem.used)))
    finally:
        pynvml.nvmlShutdown()
    return gpus


class Readings:
    """What NVML says of real GPUs now: the memory in use on each (ours and other programs'), for `gmux ps`, and
    which processes hold them. Read when asked, at most once every `every_s` (a script calling ps in a loop
    must not hold gmuxd's loop on the driver), with NVML left open between reads (nvmlInit loads the driver's
    state, which can take a second where no process keeps it loaded). A read that fails leaves the figures
    unknown (None), never a stale one shown as now. Virtual GPUs are left alone."""

    def __init__(self, gpus: list[Gpu], every_s: float = 1.0):
        self.gpus = [g for g in gpus if not g.virtual]
        self.every_s = every_s
        self.read_at: Optional[float] = None
        self._open = False
        self._failing = False

    def refresh(self, now: float) -> None:
        if not self.gpus or (self.read_at is not None and now - self.read_at < self.every_s):
            return
        self.read_at = now
        try:
            import pynvml
            if not self._open:
                pynvml.nvmlInit()
                self._open = True
            for g in self.gpus:
                h = pynvml.nvmlDeviceGetHandleByIndex(g.index)
                g.mem_used = int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
                g.processes = [{"pid": p.pid, "mem": p.usedGpuMemory}
                               for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
        except Exception as e:
            for g in self.gpus:
                g.mem_used, g.processes = None, []
            if not self._failing:      # once, not at every ps while the driver is away
                log.warning("NVML cannot be read (%s): GPU memory in use is shown as unknown", e)
            self._failing = True
            self._close()
            return
        if self._failing:
            log.warning("NVML can be read again")
        self._failing = False

    def _close(self) -> None:
        if self._open:
            self._open = False
            try:
                import pynvml
                pynvml.nvmlShutdown()
            except Exception:      # (a driver gone away: nothing left to shut)
                pass


def discover(virtual_spec: Optional[str] = None, default_virtual: str = "2x16GiB") -> list[Gpu]:
    """The machine's GPUs: the virtual ones asked for, else NVML's, else `default_virtual` ones."""
    if virtual_spec:
        return [Gpu(i, "virtual", size, True) for i, size in enumerate(parse_virtual_gpus(virtual_spec))]
    gpus = nvml_gpus()
    if gpus:
        return gpus
    log.warning("no GPU found through NVML: using virtual GPUs %s (jobs compute on the CPU)", default_virtual)
    return [Gpu(i, "virtual", size, True) for i, size in enumerate(parse_virtual_gpus(default_virtual))]
