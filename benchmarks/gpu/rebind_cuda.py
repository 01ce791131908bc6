"""A training process moved between GPUs by the CUDA driver (gmux.node.cuda_rebind, gmuxd --rebind-gpus).

    python benchmarks/gpu/rebind_cuda.py [--mib 1024]     (skips, saying so, where no GPU or no such driver exists)

A child process trains a deterministic MLP on cuda with about --mib MiB of weights, gradients and optimizer
state, and pauses after step 5 (as a job waits at its boundary). This process then rebinds it with gmux's
binding, the way gmuxd does: lock, checkpoint, restore onto the target GPU, unlock. The target is another GPU of
the same chip where there is one, else the same GPU (the driver's remap path, onto itself). Twice:
  - held: the child's state is still on the GPU (the driver copies all of it out and back);
  - suspended: the child has moved its tensors to host memory first, as gmux's memory tier does before gmuxd
    rebinds it (the driver moves the context and what the allocator still caches).
Each run is compared with the same training uninterrupted: its weights must be bit-identical. NVML must then list
the child on the target GPU. The table gives each step's time, against a pinned host-to-device copy of the same
bytes measured in the same run (torch, to and from pinned memory).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

CHILD = r"""
import hashlib, sys, torch
mib, pause, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
width = 1024
layers = max(1, (mib << 20) // (width * width * 4 * 4))      # weights + grads + two Adam moments, fp32
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
g = torch.Generator(device="cpu").manual_seed(1)
for step in range(10):
    x = torch.randn(64, width, generator=g).cuda()
    opt.zero_grad(set_to_none=False)
    model(x).square().mean().backward()
    opt.step()
    if step == pause:
        torch.cuda.synchronize()
        if mode == "suspended":
            model.cpu()
            for s in opt.state.values():
                for k, v in s.items():
                    if torch.is_tensor(v) and v.is_cuda:
                        s[k] = v.cpu()
            torch.cuda.empty_cache()     # (Module.cpu moved the gradients with their parameters)
        print("paused", torch.cuda.memory_reserved(), flush=True)
        sys.stdin.readline()
        if mode == "suspended":
            model.cuda()
            for s in opt.state.values():
                for k, v in s.items():
                    if torch.is_tensor(v) and not v.is_cuda and k != "step":
                        s[k] = v.cuda()
torch.cuda.synchronize()
h = hashlib.sha256()
for t in list(model.state_dict().values()):
    h.update(t.cpu().numpy().tobytes())
print("hash", h.hexdigest(), sum(p.numel() * 4 for p in model.parameters()), flush=True)
"""


def child(mib: int, pause: int, mode: str, gpu_uuid: str) -> subprocess.Popen:
    # on the GPU the rebind names (CUDA's device order need not be NVML's); deterministic cuBLAS
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu_uuid, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    return subprocess.Popen([sys.executable, "-c", CHILD, str(mib), str(pause), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)


class ChildFailed(Exception):
    pass


def finish(p: subprocess.Popen, say: str = "") -> tuple[str, int]:
    """The child's final hash and weight bytes, once it has trained on; ChildFailed where it gave none."""
    try:
        out, _ = p.communicate(say, timeout=90)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise ChildFailed("the child did not finish within 90 s") from None
    lines = [x.split() for x in out.splitlines() if x.startswith("hash ")]
    if not lines:
        raise ChildFailed(f"the child ended (exit status {p.returncode}) without its result; its stderr is above")
    return lines[-1][1], int(lines[-1][2])


def paused(c: subprocess.Popen) -> int:
    """The device bytes the child holds at its pause."""
    line = c.stdout.readline().split()
    if not line or line[0] != "paused":
        c.kill()
        c.wait()
        raise ChildFailed(f"the child ended (exit status {c.returncode}) before its pause; its stderr is above")
    return int(line[1])


def gpus_listing(gpus: list, pid: int) -> list[str]:
    """The UUIDs of the GPUs on which NVML lists `pid` now."""
    from gmux.node.inventory import Readings
    Readings(gpus).refresh(0.0)
    return [g.uuid for g in gpus if any(p["pid"] == pid for p in g.processes)]


def pinned_copy_s(nbytes: int) -> float:
    import torch
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev.copy_(host)
    torch.cuda.synchronize()
    t = time.perf_counter()
    host.copy_(dev)
    dev.copy_(host)
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=1024)
    a = p.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("rebind_cuda: skipped, no CUDA device here")
        return 0
    from gmux.node.cuda_rebind import CudaDriver, RebindError, Unavailable, rebind
    from gmux.node.inventory import nvml_gpus
    try:
        driver = CudaDriver.load()
    except Unavailable as e:
        print(f"rebind_cuda: skipped, the driver cannot rebind processes here: {e}")
        return 0
    gpus = nvml_gpus()
    if not gpus:
        print("rebind_cuda: FAILED: torch sees a GPU but NVML lists none")
        return 1
    src = gpus[0]
    dst = next((g for g in gpus[1:] if g.name == src.name), src)
    where = "another GPU" if dst is not src else "the same GPU (one GPU of this chip here)"
    print(f"rebind_cuda: {src.name}, from {src.uuid} to {where} {dst.uuid}")
    try:
        want, weights = finish(child(a.mib, 5, "none", src.uuid), "go\n")
    except ChildFailed as e:
        print(f"rebind_cuda: FAILED: the uninterrupted run: {e}")
        return 1
    rows, ok = [], True
    for mode in ("held", "suspended"):
        c = child(a.mib, 5, mode, src.uuid)
        try:
            reserved = paused(c)
        except ChildFailed as e:
            rows.append({"state": mode, "device_bytes_at_pause": 0, "total_s": float("nan"), "bit_identical": False,
                         "nvml_lists_it_on_target": None, "error": str(e)})
            ok = False
            continue
        t = time.perf_counter()
        try:
            steps = rebind(driver, c.pid, src.uuid, dst.uuid)
            error = None
        except RebindError as e:
            steps, error = {}, f"{e} (where: {e.where})"
        total = time.perf_counter() - t
        listed = gpus_listing(gpus, c.pid)
        try:
            got, _ = finish(c, "go\n")
        except ChildFailed as e:
            got, error = None, f"{error}; {e}" if error else str(e)
        same = got == want
        # NVML names host pids: in a container with a pid namespace of its own it lists the child nowhere
        on_target = listed == [dst.uuid] if listed else None
        ok &= error is None and same and on_target is not False
        rows.append({"state": mode, "device_bytes_at_pause": reserved, "total_s": round(total, 4),
                     **{k: round(v, 4) for k, v in steps.items()}, "bit_identical": same,
                     "nvml_lists_it_on_target": on_target, "error": error})
    copy = pinned_copy_s(weights * 4)
    print(f"{'state':<10} {'on GPU at pause':>16} {'lock':>8} {'checkpoint':>11} {'restore':>9} {'unlock':>8} "
          f"{'total':>8} {'bit-identical':>14} {'on target':>10}")
    for r in rows:
        print(f"{r['state']:<10} {r['device_bytes_at_pause'] / 2**20:>12.0f} MiB "
              + " ".join(f"{r.get(k, float('nan')):>{w}.3f}" for k, w in
                         (("lock_s", 8), ("checkpoint_s", 11), ("restore_s", 9), ("unlock_s", 8), ("total_s", 8)))
              + f" {'yes' if r['bit_identical'] else 'NO':>14} "
              + f"{ {True: 'yes', False: 'NO', None: 'not listed'}[r['nvml_lists_it_on_target']]:>10}"
              + (f"\n    error: {r['error']}" if r["error"] else ""))
    held = next(r for r in rows if r["state"] == "held")
    print(f"pinned copy out and back of the same {weights * 4 / 2**20:.0f} MiB: {copy:.3f} s")
    print(f"rebind: held_vs_pinned_copy={held['total_s'] / copy:.1f} ok={'yes' if ok else 'NO'}")
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "benchmarks", "results", "rebind_cuda.json"), "w") as f:
        json.dump({"gpu": src.name, "to": where, "rows": rows, "pinned_copy_s": copy, "ok": ok}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
