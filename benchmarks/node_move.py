"""A move between two virtual GPUs of one machine, measured against two warm copies of the same bytes.

    .venv/bin/python benchmarks/node_move.py [--sizes 64,256] [--out benchmarks/results/node_move.json]

A real gmuxd with two virtual GPUs and one explicit-mode job (a script that attached itself, run by
gmux-launch --no-hook: weights, gradients and SGD momentum of the target size); `gmux migrate JOB --gpu 1`
moves it. Today that is a checkpoint at the job's next boundary, the end of its run, the launcher executing
itself again (same pid: a new interpreter, torch import, the model built), a restore and the first step on
the other GPU (issue 15, item 4, asks for a move in the same process where possible; not built yet).
The job writes the time of every boundary and the GPU it ran on to a file, so that downtime is exact: from
its last boundary on GPU 0 to its first on GPU 1. Baseline, in the same run: two copies of the checkpoint's
bytes into warm buffers (out and back), the floor for a move that copies the state twice.
Last line: `node_move: downtime_vs_two_copies=<r>` (the largest size).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "node"))

MiB = 1 << 20

# The job: its state is `size` bytes (weights, gradients, momentum: a third each); each boundary's time and GPU
# go to a file (one short line, flushed: the move's cost is measured from these).
JOB = """
import os, sys, time, torch, gmux.job
size, log, steps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
n = max(1, size // 12 // (4 << 20))
params = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(size // 12 // n)) for _ in range(n)])
opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
progress = {"step": 0}
job = gmux.job.attach(params, opt, state=progress)
out = open(log, "a", buffering=1)
while progress["step"] < steps:
    opt.zero_grad()
    sum(p.square().sum() for p in params).backward()
    opt.step()
    progress["step"] += 1
    time.sleep(0.01)
    out.write(f"{time.time():.6f} {os.environ.get('GMUX_VIRTUAL_GPU')} {progress['step']}\\n")
    job.boundary()
"""


def two_copies_s(nbytes: int, repeats: int = 5) -> float:
    src, dst, back = (np.ones(nbytes, dtype=np.uint8), np.zeros(nbytes, dtype=np.uint8),
                      np.zeros(nbytes, dtype=np.uint8))
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        np.copyto(back, dst)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def boundaries(log: pathlib.Path) -> list:
    rows = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            rows.append((float(parts[0]), parts[1], int(parts[2])))
    return rows


def move(tmp: pathlib.Path, size_mib: int) -> dict:
    from node_harness import Node
    script, log = tmp / "job.py", tmp / "boundaries.log"
    script.write_text(JOB)
    gpu_mib = max(1024, size_mib * 3)
    node = Node(tmp, "--virtual-gpus", f"2x{gpu_mib}MiB", "--quantum", "600")
    try:
        p = node.launch(str(script), str(size_mib * MiB), str(log), "1000000", opts=["--no-hook"])
        job = node.job_of(p.pid, 60)
        node.wait_for(lambda: log.exists() and len(boundaries(log)) > 20, 300, "job training")
        t_request = time.time()
        node.call("migrate", job=job, gpu=1)
        node.wait_for(lambda: any(g == "1" for _, g, _ in boundaries(log)), 300, "job stepping on GPU 1")
        rows = boundaries(log)
        last0 = max(t for t, g, _ in rows if g == "0")
        first1 = min(t for t, g, _ in rows if g == "1")
        info = node.job(job)
        per = size_mib * MiB // 12 // max(1, size_mib * MiB // 12 // (4 << 20))
        nbytes = 12 * per * max(1, size_mib * MiB // 12 // (4 << 20))   # as JOB builds it
        floor = two_copies_s(nbytes)
        return {"size_mib": size_mib, "bytes": nbytes, "downtime_s": first1 - last0, "total_s": first1 - t_request,
                "two_copies_s": floor, "downtime_vs_two_copies": (first1 - last0) / floor,
                "same_pid": info.get("pid") == p.pid}
    finally:
        node.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64,256", help="the job's state, MiB (default 64,256)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "node_move.json"))
    a = ap.parse_args()
    rows = []
    for size in [int(s) for s in a.sizes.split(",")]:
        with tempfile.TemporaryDirectory(prefix=f"gmux-node-move-{size}-") as d:
            r = move(pathlib.Path(d), size)
        rows.append(r)
        print(f"move {size:5d} MiB between virtual GPUs: downtime {r['downtime_s']:.2f} s (last boundary on GPU 0 "
              f"to first on GPU 1), total {r['total_s']:.2f} s from the request; two warm copies "
              f"{r['two_copies_s'] * 1e3:.1f} ms; downtime / two copies {r['downtime_vs_two_copies']:.0f}; "
              f"same pid {r['same_pid']}", flush=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"moves": rows}, f, indent=1)
    print(f"node_move: downtime_vs_two_copies={rows[-1]['downtime_vs_two_copies']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
