"""GMUX_RESTORE_WAIT (set by a cluster start; by hand, checked): how long a job's restore waits for a checkpoint
still arriving on this machine. Read by attach() and, before the script and torch are imported, by gmux-launch."""
from __future__ import annotations

import math
import os
from typing import Mapping


def restore_wait(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds to wait for a checkpoint still arriving, 0 (unset) for one that is there; ValueError naming the
    variable where it is no number of seconds."""
    text = environ.get("GMUX_RESTORE_WAIT")
    try:
        value = float(text) if text else 0.0
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:    # (nan waited for ever)
        raise ValueError(f"GMUX_RESTORE_WAIT={text!r}: expected the seconds to wait for a checkpoint still "
                         f"arriving, a number of at least 0")
    return value
