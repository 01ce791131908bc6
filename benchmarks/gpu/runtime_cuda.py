"""The in-job runtime on a real GPU: bit-identity on CUDA and suspend/resume speed against pinned memcpy.

    python benchmarks/gpu/runtime_cuda.py      (skips, saying so, where no GPU exists)

1. Trains the CNN on cuda four ways (uninterrupted; 20 suspend/resume cycles; 20 in place, as a cross-machine
   move suspends, a checkpoint taken from live device memory in some; two migrations into new processes) and
   checks that the final weights and optimizer state are bit-identical.
2. Runs benchmarks/suspend_resume.py --device cuda (state tier; 64 MiB to 1 GiB) and reports suspend and
   resume GB/s against a pinned cudaMemcpy of the same bytes, measured with CuPy (independently of torch)
   in the same run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from gmux.examples.compare import identical  # noqa: E402


def run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, *args], check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)


def bit_identity() -> bool:
    train = ["-m", "gmux.examples.train", "--device", "cuda", "--steps", "60"]
    with tempfile.TemporaryDirectory() as d:
        run(*train, "--out", f"{d}/solo.pt")
        run(*train, "--suspend-at", ",".join(str(s) for s in range(2, 60, 3)), "--out", f"{d}/sus.pt")
        run(*train, "--suspend-at", ",".join(str(s) for s in range(2, 60, 3)), "--in-place", "--out", f"{d}/held.pt")
        run(*train, "--migrate-at", "17", "--checkpoint", f"{d}/a.ckpt")
        run(*train, "--restore", f"{d}/a.ckpt", "--migrate-at", "41", "--checkpoint", f"{d}/b.ckpt")
        run(*train, "--restore", f"{d}/b.ckpt", "--out", f"{d}/mig.pt")
        solo, sus, held, mig = (torch.load(f"{d}/{n}.pt", map_location="cpu") for n in ("solo", "sus", "held", "mig"))
    ok = True
    for name, other in (("20 suspends", sus), ("20 suspends in place", held), ("2 migrations", mig)):
        good = identical(solo["model"], other["model"]) and identical(solo["optimizer"], other["optimizer"])
        print(f"cuda bit-identity after {name}: {'yes' if good else 'NO'}")
        ok &= good
    return ok


def pinned_memcpy_gbps(nbytes: int) -> float:
    import cupy
    src = cupy.ones(nbytes, dtype=cupy.uint8)
    host = cupy.cuda.alloc_pinned_memory(nbytes)
    best = float("inf")
    for _ in range(5):
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        cupy.cuda.runtime.memcpy(host.ptr, src.data.ptr, nbytes, cupy.cuda.runtime.memcpyDeviceToHost)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def main() -> int:
    if not torch.cuda.is_available():
        print("runtime_cuda: skipped, no CUDA device here (torch.cuda.is_available() is False)")
        return 0
    print(f"device: {torch.cuda.get_device_name()} torch {torch.__version__}")
    ok = bit_identity()
    out = os.path.join(ROOT, "benchmarks/results/suspend_resume_cuda.json")
    run("benchmarks/suspend_resume.py", "--device", "cuda", "--json", out)
    rows = json.load(open(out))["rows"]
    for name, r in rows.items():
        ref = pinned_memcpy_gbps(r["bytes"])
        print(f"{name}: suspend {r['suspend_GBps']:.1f} GB/s, resume {r['resume_GBps']:.1f} GB/s, "
              f"pinned cudaMemcpy D2H (cupy) {ref:.1f} GB/s, suspend/memcpy {r['suspend_GBps'] / ref:.2f}; "
              f"suspend {r['suspend_s'] * 1e3:.1f} ms, resume {r['resume_s'] * 1e3:.1f} ms, "
              f"save+load {(r['save_s'] + r['load_s']) * 1e3:.0f} ms")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
