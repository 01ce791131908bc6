"""What a Lightning run's epoch metrics have summed so far, carried to the process a move continues it in.

`self.log("train_loss", loss, on_epoch=True)` in training keeps a running sum (and the batches counted, for a mean;
the extreme, for max and min) in the training loop's result collection, which Lightning's checkpoint leaves out. A
run moved mid-epoch logged `train_loss_epoch` over the batches after the move only, and a ModelCheckpoint,
EarlyStopping or ReduceLROnPlateau that monitors it decided otherwise than unmoved. gmux keeps each sum as a
number; in the new process, the first time the same key is logged, its sum starts from the kept one, so each later
addition is the one the unmoved run made, bit for bit. A key not logged again before the epoch ends is given up.
A torchmetrics Metric logged by object keeps its counts in the object, which gmux.job.metric_states carries.
"""
from __future__ import annotations

from typing import Optional

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64}
MAX_KEYS = 1024


def epoch_sums(trainer) -> dict:
    """{key: {"value": the sum (or extreme) so far, "dtype": its dtype, "batches": the batches a mean counts}}."""
    out = {}
    for key, metric in (getattr(trainer.fit_loop.epoch_loop, "_results", None) or {}).items():
        meta = getattr(metric, "meta", None)
        if (meta is None or not getattr(metric, "is_tensor", False) or metric.has_reset or not meta.on_epoch
                or meta.is_custom_reduction or len(out) >= MAX_KEYS):
            continue
        dtype = str(metric.value.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            continue
        entry = {"value": float(metric.value.item()), "dtype": dtype}
        if meta.is_mean_reduction:
            entry["batches"] = int(metric.cumulated_batch_size.item())
        out[key] = entry
    return out


def carry_epoch_sums(trainer, saved: Optional[dict], path: str) -> None:
    """In a restored process, at the start of its fit: each kept sum seeds its key's first update this epoch."""
    check_epoch_sums(saved, path)
    if not saved:
        return
    results, epoch, pending = trainer.fit_loop.epoch_loop._results, trainer.current_epoch, dict(saved)
    update = results.update_metrics

    def seeded(key, value, batch_size):
        entry = pending.pop(key, None) if trainer.current_epoch == epoch else None
        metric = results[key]
        if entry is not None and metric.is_tensor:
            metric.value = torch.tensor(entry["value"], dtype=DTYPES[entry["dtype"]], device=metric.value.device)
            if "batches" in entry and hasattr(metric, "cumulated_batch_size"):
                metric.cumulated_batch_size = torch.tensor(entry["batches"], device=metric.value.device)
        if not pending or trainer.current_epoch != epoch:
            del results.update_metrics          # (the collection's own again)
        return update(key, value, batch_size)
    results.update_metrics = seeded


def check_epoch_sums(saved, path: str) -> None:
    """Refuses kept sums that are not what gmux keeps (they come from a file); None: a checkpoint from before."""
    from gmux.job.checkpoint import CheckpointError
    if saved is None:
        return
    if not isinstance(saved, dict) or len(saved) > MAX_KEYS:
        raise CheckpointError(path, "state 'epoch_sums' is not a mapping of logged keys")
    for key, entry in saved.items():
        batches = entry.get("batches", 0) if isinstance(entry, dict) else None
        if not (isinstance(key, str) and len(key) <= 512 and isinstance(entry, dict)
                and set(entry) <= {"value", "dtype", "batches"} and type(entry.get("value")) is float
                and entry.get("dtype") in DTYPES and type(batches) is int and batches >= 0):
            raise CheckpointError(path, f"state 'epoch_sums' {str(key)[:60]!r} is not what gmux keeps")
