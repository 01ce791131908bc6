"""The runtime demo: a real model trained, suspended, resumed and migrated to a new process, losing nothing.

    python -m gmux.examples.runtime_demo            (part of: make demo)

Runs the same deterministic training three ways, each in its own process:
  1. uninterrupted;
  2. suspended and resumed at several boundaries, then checkpointed mid-epoch and stopped (migration out);
  3. a new process restores that checkpoint and finishes (migration in).
and shows what moved, how long it took, and that the final weights are bit-identical.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from rich.console import Console
from rich.table import Table

from gmux.examples.compare import identical

STEPS = 60


def _train(*args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gmux.examples.train", "--steps", str(STEPS), *args], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0




def main() -> int:
    console = Console()
    console.rule("[bold]gmux: lossless suspend, resume and migration of a training job")
    with tempfile.TemporaryDirectory() as d:
        p = lambda name: os.path.join(d, name)
        console.print(f"Training a CNN (BatchNorm, dropout, Adam, StepLR, 2 loader workers) for {STEPS} steps.")
        solo_s = _train("--out", p("solo.pt"))
        console.print(f"  1. uninterrupted run: {solo_s:.1f} s")
        out_s = _train("--suspend-at", "5,11,17,23,29,31", "--migrate-at", "33", "--checkpoint", p("job.ckpt"),
                       "--report", p("first.json"))
        console.print(f"  2. suspended 6 times, checkpointed at step 33 and stopped: {out_s:.1f} s")
        in_s = _train("--restore", p("job.ckpt"), "--suspend-at", "45", "--out", p("migrated.pt"),
                      "--report", p("second.json"))
        console.print(f"  3. a new process restored the checkpoint and finished: {in_s:.1f} s")
        first, second = (json.load(open(p(n))) for n in ("first.json", "second.json"))
        cycles = first["cycles"] + second["cycles"]
        ckpt_bytes = os.path.getsize(p("job.ckpt"))
        solo, migrated = torch.load(p("solo.pt")), torch.load(p("migrated.pt"))

    table = Table(title="suspend / resume cycles (state moved to host and back)")
    for col in ("#", "tier", "bytes moved", "suspend ms", "  copy", "  release", "resume ms", "  alloc", "  copy"):
        table.add_column(col, justify="right")
    for i, c in enumerate(cycles, 1):
        s, r = c["suspend"], c["resume"]
        table.add_row(str(i), s.get("tier", "state"), f"{s['bytes']:,}", f"{s['total_s'] * 1e3:.2f}",
                      f"{s['copy_s'] * 1e3:.2f}", f"{s['release_s'] * 1e3:.2f}", f"{r['total_s'] * 1e3:.2f}",
                      f"{r['alloc_s'] * 1e3:.2f}", f"{r['copy_s'] * 1e3:.2f}")
    console.print(table)
    console.print(f"checkpoint: {ckpt_bytes:,} bytes; restore in the new process took "
                  f"{second['restore']['seconds'] * 1e3:.1f} ms")
    same = identical(solo["model"], migrated["model"]) and identical(solo["optimizer"], migrated["optimizer"])
    console.print(f"final loss: uninterrupted {solo['losses'][-1]:.6f}, interrupted {migrated['losses'][-1]:.6f}")
    console.print(f"final weights and optimizer state bit-identical: "
                  f"{'[green]yes' if same else '[red]NO'}[/] ({len(cycles)} suspends, 1 migration)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
