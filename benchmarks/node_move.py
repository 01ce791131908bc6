"""A move between two virtual GPUs of one machine, both ways, measured against two warm copies of the same bytes.

    .venv/bin/python benchmarks/node_move.py [--sizes 64,256] [--out benchmarks/results/node_move.json]

A real gmuxd with two virtual GPUs and one explicit-mode job (a script that attached itself, run by
gmux-launch --no-hook: weights, gradients and SGD momentum of the target size), moved by
`gmux migrate JOB --gpu 1` in two ways, each with a gmuxd and a job of its own:
  - in process (what a move between virtual GPUs is: gmux/node/moves.py): the job suspends at its next
    boundary (its state copied to host memory and freed), its seat moves to GPU 1, it resumes there (copied
    back) in the same process, its environment saying GPU 1;
  - new process (`--new-process`, the path a move between real GPUs takes): a checkpoint at the job's next
    boundary, the end of its run, the launcher executing itself again (same pid: a new interpreter, torch
    import, the model built), a restore and the first step on the other GPU.
The job writes the time of every boundary and the GPU it ran on (its GMUX_VIRTUAL_GPU) to a file, so that
downtime is exact: from its last boundary on GPU 0 to its first on GPU 1 (one mini-batch included: the step
after the move; `step_s` is the job's median mini-batch before it; for the in-process move, the job's own
suspend and resume times too, from its report). Baseline, in the same run: two copies of
the state's bytes into warm buffers (out and back), the floor for a move that copies the state twice.
Last line: `node_move: downtime_vs_two_copies=<r> new_process=<r>` (the largest size; r of the in-process move,
then of the new-process one).
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


def move(tmp: pathlib.Path, size_mib: int, new_process: bool) -> dict:
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
        reply = node.call("migrate", job=job, gpu=1, **({"new_process": True} if new_process else {}))
        node.wait_for(lambda: any(g == "1" for _, g, _ in boundaries(log)), 300, "job stepping on GPU 1")
        rows = boundaries(log)
        before = [t for t, g, _ in rows if g == "0"]
        last0 = max(before)
        first1 = min(t for t, g, _ in rows if g == "1")
        tiers = {}
        if not new_process:
            # The job's own suspend and resume times (its report, about once a second, sums them: this move's
            # are the only ones); the rest of the downtime is a mini-batch and gmuxd's part.
            report = node.wait_for(lambda: (lambda r: r if r.get("resume_s") else None)(node.job(job)["report"]),
                                   30, "the job's report after the move")
            tiers = {"suspend_s": report["suspend_s"], "resume_s": report["resume_s"]}
        info = node.job(job)
        per = size_mib * MiB // 12 // max(1, size_mib * MiB // 12 // (4 << 20))
        nbytes = 12 * per * max(1, size_mib * MiB // 12 // (4 << 20))   # as JOB builds it
        floor = two_copies_s(nbytes)
        return {"size_mib": size_mib, "path": reply["path"], "bytes": nbytes, "downtime_s": first1 - last0,
                "total_s": first1 - t_request, "step_s": statistics.median(b - a for a, b in zip(before, before[1:])),
                "two_copies_s": floor, "downtime_vs_two_copies": (first1 - last0) / floor,
                "same_pid": info.get("pid") == p.pid, **tiers}
    finally:
        node.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64,256", help="the job's state, MiB (default 64,256)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "node_move.json"))
    a = ap.parse_args()
    rows = []
    for size in [int(s) for s in a.sizes.split(",")]:
        for new_process in (False, True):
            with tempfile.TemporaryDirectory(prefix=f"gmux-node-move-{size}-") as d:
                r = move(pathlib.Path(d), size, new_process)
            rows.append(r)
            print(f"move {size:5d} MiB between virtual GPUs, {r['path']:>11}: downtime {r['downtime_s']:.3f} s (last "
                  f"boundary on GPU 0 to first on GPU 1; a mini-batch {r['step_s'] * 1e3:.0f} ms), total "
                  f"{r['total_s']:.2f} s from the request; two warm copies {r['two_copies_s'] * 1e3:.1f} ms; "
                  f"downtime / two copies {r['downtime_vs_two_copies']:.1f}; same pid {r['same_pid']}"
                  + (f"; the job's suspend {r['suspend_s'] * 1e3:.0f} ms, resume {r['resume_s'] * 1e3:.0f} ms"
                     if "suspend_s" in r else ""), flush=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"moves": rows}, f, indent=1)
    last = {r["path"]: r for r in rows if r["size_mib"] == rows[-1]["size_mib"]}
    print(f"node_move: downtime_vs_two_copies={last['in process']['downtime_vs_two_copies']:.1f} "
          f"new_process={last['new process']['downtime_vs_two_copies']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
