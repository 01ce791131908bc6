"""What a job asks of a way of suspending it: the one interface of the state tier and the allocator tier.

The job (gmux/job/job.py) holds one `Tier` and never asks which one it is: it hands the tier its tracked
tensors at a suspend, asks for them back at a resume, for host copies of suspended tensors when a checkpoint is
taken while suspended, for extra memory figures in its reports, and for a spill when gmuxd's host-RAM budget
for suspended jobs runs out. Which tier a job gets is decided in one place: `gmux.job.memory.choose_tier`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

import torch


def exact_device(device: torch.device | str) -> torch.device:
    """The device with its index: torch.device("cuda") is not equal to its tensors' torch.device("cuda:0"), so a
    tier given the first would find none of the job's tensors on it."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class Tier(ABC):
    name: str                      # "state" or "allocator": what summaries and benchmarks call it
    device: torch.device           # where the job's state lives
    pool = None                    # the virtual GPU's memory it draws from (CPU only), or None
    suspended: bool = False        # between a successful suspend and a successful resume

    @abstractmethod
    def suspend(self, tensors: list[torch.Tensor]) -> dict:
        """Frees the device memory under `tensors` (the job's tracked state) with their bytes kept on the host;
        returns figures ({"bytes", "total_s", ...}). On failure the job is still running, intact."""

    @abstractmethod
    def resume(self) -> dict:
        """Device memory again, the bytes copied back, every tensor valid; returns figures. On failure the job
        stays suspended, intact."""

    @abstractmethod
    def host_view(self, tensor: torch.Tensor) -> Optional[torch.Tensor]:
        """While suspended: a host tensor with the values, shape and strides of a suspended `tensor`, or None."""

    @abstractmethod
    def spill(self, path: str) -> dict:
        """While suspended: moves the host copy to a file at `path` (spill.py), freeing its host memory; resume
        reads it back. A tier that cannot raises, saying what to do instead."""

    def tidy(self) -> None:
        """Called at a boundary about once a second, between mini-batches: upkeep the tier's memory needs (none
        by default)."""

    def memory(self) -> dict:
        """Figures for the job's report beyond what the profiler measures (the native tracker's, for one):
        the job's memory limit, what counts against it, and its exact peak where it is counted (limit.py)."""
        from .limit import enforced
        limit = enforced()
        return limit.figures() if limit is not None else {}

    @abstractmethod
    def on_device(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`'s memory is the job's device memory, which a suspend should have freed: what the
        residue scan (gmux/job/residue.py) names when something the runtime was not told about keeps it."""
