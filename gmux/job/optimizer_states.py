"""The per-parameter state each built-in optimizer creates at its first step, which a checkpoint's optimizer state
is checked against (gmux.job.restore_check) before a restore touches the job."""
from __future__ import annotations

from typing import Optional

import torch

PARAM, SCALAR = "like the parameter", "a scalar"


def fresh_state(opt: torch.optim.Optimizer, group: dict) -> Optional[dict]:
    """The per-parameter state a built-in optimizer creates at its first step, key by key (PARAM: shaped and
    typed like the parameter; SCALAR: a floating-point scalar); None for an optimizer not known here, whose
    state is only checked to be tensors, numbers and lists of them (`Fit.any_state`)."""
    t = type(opt)
    if t in (torch.optim.Adam, torch.optim.AdamW):
        keys = {"step": SCALAR, "exp_avg": PARAM, "exp_avg_sq": PARAM}
        if group.get("amsgrad"):
            keys["max_exp_avg_sq"] = PARAM
        return keys
    if t is torch.optim.SGD:
        return {"momentum_buffer": PARAM} if group.get("momentum") else {}
    if t is torch.optim.RMSprop:
        keys = {"step": SCALAR, "square_avg": PARAM}
        if group.get("momentum"):
            keys["momentum_buffer"] = PARAM
        if group.get("centered"):
            keys["grad_avg"] = PARAM
        return keys
    if t is torch.optim.Adagrad:
        return {"step": SCALAR, "sum": PARAM}
    return None
