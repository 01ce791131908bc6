"""Sizes of memory as people write them ('16GiB', '512MiB') and as gmux prints them."""
from __future__ import annotations

import re
from typing import Optional

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000 ** 2, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1000 ** 3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000 ** 4, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """'16GiB' -> 17179869184. Binary units for K/M/G/T and KiB/..., decimal for KB/MB/GB/TB."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size; write e.g. 512MiB, 16GiB or 2000000000")
    if m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r}: {m.group(2)!r} is not a unit of size; write B, KiB, MiB, GiB or TiB (or KB, "
                         f"MB, GB, TB: powers of 1000)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not value < 1 << 64:    # also refuses inf, which int() would raise OverflowError on
        raise ValueError(f"{text!r} is more memory than any machine has")
    if value != int(value) and _UNITS[m.group(2).lower()] == 1:     # (1.1GiB is taken, to the byte below)
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


def format_size(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n}B"
