"""Giving the heap's freed memory back to the system.

The C library keeps what a burst of allocations freed in its arenas, for the next burst: a connection flood left
gmuxd holding some 250 KB for each connection it had accepted, long after the guard had ended them all.
"""
from __future__ import annotations

import ctypes


def trim() -> bool:
    """Whether any memory went back (False too where the C library has no malloc_trim: not glibc)."""
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):
        return False
