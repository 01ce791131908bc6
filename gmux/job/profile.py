"""What a job reports about itself: mini-batch times and memory footprint at the boundary and at the peak.

The boundary path only appends a duration; memory is read when a report is due (about once a second),
because walking the tracked tensors costs far more than the 20 µs a boundary may take.
"""
from __future__ import annotations

import statistics
from collections import deque

import torch


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


class Profile:
    def __init__(self, device: torch.device):
        self.device = device
        self.batch_s: deque[float] = deque(maxlen=256)
        self.steps = 0
        self.suspends = 0
        self.spills = 0
        self.suspend_s = 0.0
        self.resume_s = 0.0
        self.bytes_moved = 0
        self.last_suspend: dict = {}
        self.last_resume: dict = {}
        self._cpu_base_kib = _rss_kib("VmRSS:")
        _reset_peak_rss()

    def memory(self, tracked_bytes: int) -> dict:
        """Memory at this boundary and the peak since the previous call."""
        if self.device.type == "cuda":
            at = torch.cuda.memory_allocated(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return {"mem_boundary": at, "mem_peak": max(peak, at)}
        # On the CPU the working set above tracked state is estimated from the process's peak RSS growth.
        growth = max(0, _rss_kib("VmHWM:") - self._cpu_base_kib) * 1024
        _reset_peak_rss()
        return {"mem_boundary": tracked_bytes, "mem_peak": max(tracked_bytes, growth)}

    def report(self, tracked_bytes: int) -> dict:
        times = list(self.batch_s)
        median = statistics.median(times) if times else None
        return {"step": self.steps, "batch_s": median, "rate": (1.0 / median) if median else None,
                **self.memory(tracked_bytes), "suspends": self.suspends, "spills": self.spills,
                "suspend_s": self.suspend_s, "resume_s": self.resume_s, "bytes_moved": self.bytes_moved}
