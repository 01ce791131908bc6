"""The in-job runtime on a real GPU: bit-identity on CUDA and suspend/resume speed against pinned memcpy.

    python benchmarks/gpu/runtime_cuda.py      (skips, saying so, where no GPU exists)

1. Trains the CNN on cuda four ways (uninterrupted; 20 suspend/resume cycles; 20 in place, as a cross-machine
   move suspends, a checkpoint taken from live device memory in some; two migrations into new processes) and
   checks that the final weights and optimizer state are bit-identical. Then a move's stream that leaves out
   what its target holds (a frozen table), restored on cuda and trained on: bit-identical, the table not sent.
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
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from gmux.examples.compare import identical  # noqa: E402


def run(*args):
    # (ahead of what PYTHONPATH held: wheels carried to a GPU machine are found there)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
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


def held_move(device: str = "cuda") -> bool:
    """A move's stream that leaves out what its target holds (gmux.job.holdings), within one process: a model
    with a frozen table on `device`, its checkpoint streamed through a pipe with a fresh twin's offer, restored
    into the twin, both trained on; bit-identical, and the table not sent."""
    import io
    import threading
    import gmux.job as gj
    from gmux.job import holdings

    def build():
        torch.manual_seed(0)
        table = torch.nn.Embedding(1 << 16, 64).to(device).requires_grad_(False)     # 16 MiB, frozen
        body = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
        model = torch.nn.ModuleDict({"table": table, "body": body})
        opt = torch.optim.Adam(body.parameters(), lr=1e-3)
        return model, opt, gj.attach(model, opt, device=device)

    def step(model, opt, i):
        g = torch.Generator(device=device).manual_seed(i)
        rows = torch.randint(0, 1 << 16, (32,), device=device, generator=g)
        loss = model["body"](model["table"](rows)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    src_model, src_opt, src = build()
    for i in range(5):
        step(src_model, src_opt, i)
    dst_model, dst_opt, dst = build()
    offer = holdings.Offer.of(dst.tracked.modules)
    with tempfile.TemporaryDirectory() as d:
        pipe, out = f"{d}/stream", []
        os.mkfifo(pipe)
        reader = threading.Thread(target=lambda: out.append(open(pipe, "rb").read()))
        reader.start()
        src.checkpoint(pipe, offer.wire())
        reader.join()
    data = out[0][8:]                               # (after the size announced first)
    dst.restore(io.BytesIO(data), fresh=True, offer=offer)
    for i in range(5, 10):
        step(src_model, src_opt, i)
        step(dst_model, dst_opt, i)
    good = all(torch.equal(a, b) for a, b in zip(src.tracked.tensors(), dst.tracked.tensors()))
    sent_small = len(data) < 4 << 20
    print(f"{device} move leaving out what the target holds: {len(data) / 2**20:.2f} MiB sent of a 16 MiB frozen "
          f"table and its net, bit-identical after 5 more steps: {'yes' if good else 'NO'}"
          f"{'' if sent_small else ' (the table was SENT)'}")
    return good and sent_small


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
    ok = True
    for step in (bit_identity, lambda: held_move("cuda"), speeds):
        try:             # each step on its own: one that fails does not hide what the others measure
            ok &= step()
        except Exception:    # noqa: BLE001 - reported, and the script fails
            traceback.print_exc()
            ok = False
    return 0 if ok else 1


def speeds() -> bool:
    out = os.path.join(ROOT, "benchmarks/results/suspend_resume_cuda.json")
    run("benchmarks/suspend_resume.py", "--device", "cuda", "--json", out)
    rows = json.load(open(out))["rows"]
    for name, r in rows.items():
        ref = pinned_memcpy_gbps(r["bytes"])
        print(f"{name}: suspend {r['suspend_GBps']:.1f} GB/s, resume {r['resume_GBps']:.1f} GB/s, "
              f"pinned cudaMemcpy D2H (cupy) {ref:.1f} GB/s, suspend/memcpy {r['suspend_GBps'] / ref:.2f}; "
              f"suspend {r['suspend_s'] * 1e3:.1f} ms, resume {r['resume_s'] * 1e3:.1f} ms, "
              f"save+load {(r['save_s'] + r['load_s']) * 1e3:.0f} ms")
    return True


if __name__ == "__main__":
    sys.exit(main())
