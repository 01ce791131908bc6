"""State-tier suspend and resume against the honest baselines, measured side by side in one run.

For tracked state of 64 MiB, 256 MiB and 1 GiB (parameters, gradients and Adam state of a real model):
median suspend and resume over several cycles after a first, warming cycle (reported apart), split into
copy phases and giving device memory back / taking it again; against (a) copying the same bytes into a warm
preallocated buffer, twice (out and back), and (b) what a user does today, torch.save + torch.load of the same
state. Also the cost of a boundary with nothing pending. And the per-tensor cost: a model of many small tensors
(1,600 tracked tensors, 5.5 MB: 160 Linear(46, 46) layers under Adam) on the heap (freed in place, as on a GPU)
and on the Python pool (re-pointed), against one copy of the same bytes into a warm buffer in the same run.
Prints tables, writes JSON; the last lines are
    suspend_resume_many: suspend_vs_copy=<ratio> resume_vs_copy=<ratio> (heap; the pool's beside it)
    suspend_resume_1GiB: copy_vs_warm_copy=<ratio> end_to_end_vs_save_load=<ratio>

On a machine with no GPU the device is a virtual GPU: CPU tensors whose memory comes from a pool of pages
faulted in once (gmux.job.DevicePool). With --device cuda the same runs on a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch import nn

import gmux.job as gj

MiB = 1 << 20


def build_state(total_bytes: int, device: str):
    """A model whose parameters, gradients and two Adam moments add up to `total_bytes`."""
    per_tensor = 16 * MiB
    param_bytes = total_bytes // 4
    shapes = [per_tensor // 4] * (param_bytes // per_tensor) or [param_bytes // 4]
    model = nn.ParameterList([nn.Parameter(torch.randn(n, device=device) * 0.01) for n in shapes])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model:
        p.grad = torch.randn_like(p)
    opt.step()
    return model, opt


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def warm_copy_s(nbytes: int, device: str, repeats: int) -> float:
    """One copy of `nbytes` from device memory into a warm preallocated host buffer: the median of the
    faster of torch's (multi-threaded) copy_ and a plain memcpy, so the baseline is the best one can do."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device == "cuda")
    dst.fill_(0)
    ways = {"torch": lambda: dst.copy_(src, non_blocking=device == "cuda")}
    if device == "cpu":
        ways["memcpy"] = lambda: np.copyto(dst.numpy(), src.numpy())
    best = float("inf")
    for copy in ways.values():
        times = []
        for _ in range(repeats + 1):
            sync(device)
            t0 = time.perf_counter()
            copy()
            sync(device)
            times.append(time.perf_counter() - t0)
        best = min(best, statistics.median(times[1:]))
    return best


def save_load_s(model, opt, directory: str, repeats: int = 3) -> tuple[float, float]:
    """(save, load) seconds of the round trip whose total is the median of `repeats`: one sample was noisy."""
    runs = sorted((save_load_once(model, opt, directory) for _ in range(repeats)), key=sum)
    return runs[len(runs) // 2]


def save_load_once(model, opt, directory: str) -> tuple[float, float]:
    path = os.path.join(directory, "state.pt")
    t0 = time.perf_counter()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    t1 = time.perf_counter()
    loaded = torch.load(path, map_location=next(iter(model.parameters())).device)
    model.load_state_dict(loaded["model"])
    opt.load_state_dict(loaded["opt"])
    sync(str(next(iter(model.parameters())).device.type))
    t2 = time.perf_counter()
    os.unlink(path)
    return t1 - t0, t2 - t1


def hook_cost_us(n: int = 200_000) -> float:
    job = gj.attach(nn.Linear(2, 2))
    t0 = time.perf_counter()
    for _ in range(n):
        job.boundary()
    return (time.perf_counter() - t0) / n * 1e6


def measure(size: int, device: str, cycles: int, scratch: str) -> dict:
    model, opt = build_state(size, device)
    pool = gj.DevicePool(int(size * 1.1) + 64 * MiB) if device == "cpu" else None
    job = gj.attach(model, opt, pool=pool)
    warm_s, warm_r = job.suspend(), job.resume()
    sus, res = [], []
    for _ in range(cycles):
        sus.append(job.suspend())
        res.append(job.resume())
    med = lambda rows, k: statistics.median(r[k] for r in rows)
    warm = warm_copy_s(warm_s["bytes"], device, max(3, cycles))
    save_s, load_s = save_load_s(model, opt, scratch)
    row = {
        "bytes": warm_s["bytes"],
        "first_suspend_s": warm_s["total_s"], "first_resume_s": warm_r["total_s"],
        "suspend_copy_s": med(sus, "copy_s"), "suspend_release_s": med(sus, "release_s"),
        "suspend_s": med(sus, "total_s"),
        "resume_alloc_s": med(res, "alloc_s"), "resume_copy_s": med(res, "copy_s"), "resume_s": med(res, "total_s"),
        "warm_copy_s": warm, "save_s": save_s, "load_s": load_s,
    }
    row["copy_vs_warm_copy"] = (row["suspend_copy_s"] + row["resume_copy_s"]) / (2 * warm)
    row["end_to_end_vs_save_load"] = (save_s + load_s) / (row["suspend_s"] + row["resume_s"])
    # What any suspend that copies the bytes out and back could reach: save+load over two warm copies.
    row["copying_ceiling_vs_save_load"] = (save_s + load_s) / (2 * warm)
    row["suspend_GBps"] = row["bytes"] / row["suspend_copy_s"] / 1e9
    row["resume_GBps"] = row["bytes"] / row["resume_copy_s"] / 1e9
    del job, model, opt, pool
    return row


def build_many(device: str, layers: int = 160, width: int = 46):
    """1,600 tracked tensors (weights, biases, their grads, Adam's two moments and step counts), ~5.5 MB."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, width, device=device)).sum().backward()
    opt.step()
    return model, opt


def tier_at(rev: str):
    """The StateTier class of gmux/job/memory/state_tier.py at git revision `rev`, loaded beside this one."""
    import subprocess
    import sys
    import types
    src = subprocess.run(["git", "show", f"{rev}:gmux/job/memory/state_tier.py"], capture_output=True, text=True,
                         check=True).stdout
    mod = types.ModuleType(f"gmux.job.memory.state_tier_at_{abs(hash(rev))}")
    mod.__package__ = "gmux.job.memory"
    sys.modules[mod.__name__] = mod          # dataclasses look their module up
    exec(compile(src, f"state_tier.py@{rev}", "exec"), mod.__dict__)
    return mod.StateTier


def measure_many(device: str, pooled: bool, cycles: int, tier_class=None) -> dict:
    """The tier's suspend and resume of many small tensors (median of `cycles`), the walk over the tracked
    objects that finds them (the job's part, apart), and one warm copy of the same bytes (the baseline).
    With `tier_class`, that state tier instead of the current one (--against)."""
    model, opt = build_many(device)
    pool = gj.DevicePool(64 * MiB) if pooled else None
    job = gj.attach(model, opt, pool=pool)
    if tier_class is not None:
        job.tier = tier_class(device, pool)
    job.suspend(), job.resume()          # the first cycle allocates and faults the host buffer
    sus, res, walk, cpu = [], [], [], []
    for _ in range(cycles):
        t0 = time.perf_counter()
        tensors = job.tracked.tensors()
        walk.append(time.perf_counter() - t0)
        c0 = time.thread_time()
        sus.append(job.tier.suspend(tensors))
        c1 = time.thread_time()
        res.append(job.tier.resume())
        cpu.append((c1 - c0, time.thread_time() - c1))
    med = lambda rows, k: statistics.median(r[k] for r in rows)
    row = {"tensors": sus[0]["tensors"], "storages": sus[0]["storages"], "bytes": sus[0]["bytes"],
           "tier": type(job.tier).__name__, "suspend_s": med(sus, "total_s"), "resume_s": med(res, "total_s"),
           "suspend_copy_s": med(sus, "copy_s"), "resume_copy_s": med(res, "copy_s"),
           "walk_s": statistics.median(walk), "warm_copy_s": warm_copy_s(sus[0]["bytes"], device, cycles)}
    # CPU time of this thread (least of the cycles), against one single-threaded memcpy's: on a machine whose
    # cores other work keeps busy, wall time mostly measures the wait for a core, and this the work itself.
    row["suspend_cpu_s"], row["resume_cpu_s"] = min(c for c, _ in cpu), min(r for _, r in cpu)
    row["copy_cpu_s"] = copy_cpu_s(sus[0]["bytes"], cycles) if device == "cpu" else None
    if row["copy_cpu_s"]:
        row["suspend_cpu_vs_copy"] = row["suspend_cpu_s"] / row["copy_cpu_s"]
        row["resume_cpu_vs_copy"] = row["resume_cpu_s"] / row["copy_cpu_s"]
    row["suspend_vs_copy"] = row["suspend_s"] / row["warm_copy_s"]
    row["resume_vs_copy"] = row["resume_s"] / row["warm_copy_s"]
    row["us_per_tensor"] = (row["suspend_s"] + row["resume_s"]) / row["tensors"] * 1e6
    del job, model, opt, pool
    return row


def copy_cpu_s(nbytes: int, repeats: int) -> float:
    """This thread's CPU time for one memcpy of `nbytes` into a warm buffer, the least of `repeats`."""
    src, dst = np.ones(nbytes, dtype=np.uint8), np.zeros(nbytes, dtype=np.uint8)
    best = float("inf")
    for _ in range(repeats + 1):
        c0 = time.thread_time()
        np.copyto(dst, src)
        best = min(best, time.thread_time() - c0)
    return best


def print_many(many: dict, device: str, cycles: int) -> None:
    ms = lambda s: f"{s * 1e3:.2f}"
    table = Table(title=f"many small tensors, state tier, device={device} (median of {cycles} cycles; ms)")
    for col in ("memory", "tensors", "bytes", "suspend (copy)", "resume (copy)", "warm copy", "suspend/copy",
                "resume/copy", "µs/tensor", "walk (job)", "CPU: susp/res/copy", "CPU ratios"):
        table.add_column(col, justify="right")
    for name, r in many.items():
        table.add_row(name, str(r["tensors"]), f"{r['bytes'] / 1e6:.2f} MB",
                      f"{ms(r['suspend_s'])} ({ms(r['suspend_copy_s'])})",
                      f"{ms(r['resume_s'])} ({ms(r['resume_copy_s'])})", ms(r["warm_copy_s"]),
                      f"{r['suspend_vs_copy']:.1f}", f"{r['resume_vs_copy']:.1f}", f"{r['us_per_tensor']:.2f}",
                      ms(r["walk_s"]),
                      f"{ms(r['suspend_cpu_s'])}/{ms(r['resume_cpu_s'])}/{ms(r['copy_cpu_s'] or 0)}",
                      f"{r.get('suspend_cpu_vs_copy', 0):.1f}/{r.get('resume_cpu_vs_copy', 0):.1f}")
    Console(width=max(160, Console().width)).print(table)
    print("walk: TrackedState.tensors(), finding the tensors (the job's part, before the tier's suspend)")
    for name, r in many.items():
        print(f"suspend_resume_many_{name}: suspend_vs_copy={r['suspend_vs_copy']:.1f} "
              f"resume_vs_copy={r['resume_vs_copy']:.1f} us_per_tensor={r['us_per_tensor']:.2f} "
              f"cpu_suspend_vs_copy={r.get('suspend_cpu_vs_copy', 0):.1f} "
              f"cpu_resume_vs_copy={r.get('resume_cpu_vs_copy', 0):.1f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--sizes-mib", default="64,256,1024", help="tracked state sizes (default 64,256,1024)")
    p.add_argument("--cycles", type=int, default=5)
    p.add_argument("--json", default="benchmarks/results/suspend_resume.json")
    p.add_argument("--many-only", action="store_true", help="only the many-small-tensors rows (~10 s)")
    p.add_argument("--against", help="also measure the state tier of this git revision (before/after)")
    p.add_argument("--rounds", type=int, default=1, help="many-small-tensors rounds; the least disturbed is kept")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available here")
    try:
        sizes = [int(s) * MiB for s in a.sizes_mib.split(",")]
    except ValueError:
        p.error(f"--sizes-mib takes comma-separated integers, got {a.sizes_mib!r}")
    many_cycles = max(a.cycles, 15)
    memories = [("heap", False)] + ([("pool", True)] if a.device == "cpu" else [])
    many = {}
    old = tier_at(a.against) if a.against else None
    for _ in range(a.rounds):          # interleaved with --against, so that both see the same machine
        for name, pooled in memories:
            runs = [(name, None)] + ([(f"{name}@{a.against}", old)] if old else [])
            for label, cls in runs:
                row = measure_many(a.device, pooled, many_cycles, cls)
                if label not in many or row["suspend_cpu_s"] + row["resume_cpu_s"] < \
                        many[label]["suspend_cpu_s"] + many[label]["resume_cpu_s"]:
                    many[label] = row       # the least disturbed of the rounds
    print_many(many, a.device, many_cycles)
    if a.many_only:
        _write(a.json, {"device": a.device, "torch": torch.__version__, "many": many})
        return 0
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        for size in sizes:
            rows[f"{size // MiB}MiB"] = measure(size, a.device, a.cycles, scratch)
    hook = hook_cost_us()
    ms = lambda s: f"{s * 1e3:.1f}"
    table = Table(title=f"suspend/resume, state tier, device={a.device} (median of {a.cycles} cycles; ms)")
    for col in ("state", "first susp/res", "suspend copy", "release", "suspend", "resume alloc", "resume copy",
                "resume", "warm copy", "save+load", "copy/warm", "save+load / ours", "ceiling"):
        table.add_column(col, justify="right")
    for name, r in rows.items():
        table.add_row(name, f"{ms(r['first_suspend_s'])}/{ms(r['first_resume_s'])}", ms(r["suspend_copy_s"]),
                      ms(r["suspend_release_s"]), ms(r["suspend_s"]), ms(r["resume_alloc_s"]),
                      ms(r["resume_copy_s"]), ms(r["resume_s"]), ms(r["warm_copy_s"]),
                      ms(r["save_s"] + r["load_s"]), f"{r['copy_vs_warm_copy']:.2f}",
                      f"{r['end_to_end_vs_save_load']:.1f}x", f"{r['copying_ceiling_vs_save_load']:.1f}x")
    Console(width=max(160, Console().width)).print(table)
    print("ceiling: save+load over two warm copies, the most any suspend that copies the bytes out and back "
          "could show")
    print(f"boundary with nothing pending: {hook:.2f} µs")
    _write(a.json, {"device": a.device, "torch": torch.__version__, "rows": rows, "hook_us": hook, "many": many})
    last = rows.get("1024MiB") or rows[list(rows)[-1]]
    label = "1GiB" if "1024MiB" in rows else list(rows)[-1]
    print(f"suspend_resume_{label}: copy_vs_warm_copy={last['copy_vs_warm_copy']:.2f} "
          f"end_to_end_vs_save_load={last['end_to_end_vs_save_load']:.1f}")
    return 0


def _write(path: str, figures: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(figures, f, indent=2)


if __name__ == "__main__":
    raise SystemExit(main())
