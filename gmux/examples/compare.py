"""Bit-for-bit comparison of saved training state (nested dicts, lists and tensors), for the demo and checks."""
from __future__ import annotations

import torch


def identical(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b))
    return a == b
