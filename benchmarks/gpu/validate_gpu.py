"""GPU validation of the allocator tier (run by validate.sh). On a machine without CUDA it runs only its
CPU-side self-checks and says the GPU checks were skipped; it never reports a GPU figure it did not measure.

On a GPU: routes every torch allocation (and CuPy's, when installed) through gmux, trains a small real
model, suspends it and shows with cudaMemGetInfo that >= 99% of the job's device memory other than the CUDA
context (and library handles) was released, resumes it with unchanged data pointers and bit-identical
tensors, checks that torch.cuda.memory_stats() kept working and that every segment (backward's too) is a
gmux allocation, and reports suspend/resume GB/s against pinned cudaMemcpy measured with CuPy. Then a CUDA graph
captured beside gmux's pool and a use_mem_pool block keep their own allocations (other_pools).
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from gmux.job.memory import native as na  # noqa: E402
from gmux.job.memory import torch_cuda  # noqa: E402
from gmux.job.memory.allocator_tier import AllocatorTier  # noqa: E402

failures: list[str] = []
results: dict = {}


def check(ok: bool, what: str) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}")
    if not ok:
        failures.append(what)


def cpu_side() -> None:
    print("== CPU-side checks")
    check(na.available(), "gmux._native is built and imports")
    snap = [{"address": 4096, "blocks": [{"size": 512, "state": "active_allocated"}, {"size": 512, "state": "inactive"}]}]
    check(torch_cuda.live_ranges_from_snapshot(snap, lambda a: True) == [(4096, 512)], "live ranges from a snapshot")
    try:
        na.Allocator.cuda(0).close()
        check(torch.cuda.is_available(), "CUDA backend opens only where a GPU is")
    except na.NativeError as e:
        check(not torch.cuda.is_available(), f"without a GPU the CUDA backend refuses cleanly: {e}")


def used_bytes() -> int:
    free, total = torch.cuda.mem_get_info()
    return total - free


def cupy_pinned_baseline(nbytes: int) -> dict:
    """Pinned cudaMemcpy D2H/H2D bandwidth, with CuPy's raw runtime calls (independent of torch)."""
    import cupy

    rt = cupy.cuda.runtime
    dev = rt.malloc(nbytes)  # raw cudaMalloc: not through any allocator
    host = cupy.cuda.alloc_pinned_memory(nbytes)
    out = {}
    for name, kind, dst, src in (("d2h", rt.memcpyDeviceToHost, host.ptr, dev), ("h2d", rt.memcpyHostToDevice, dev, host.ptr)):
        rt.memcpy(dst, src, nbytes, kind)  # warm
        rt.deviceSynchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            rt.memcpy(dst, src, nbytes, kind)
        rt.deviceSynchronize()
        out[name + "_GBps"] = 3 * nbytes / (time.perf_counter() - t0) / 1e9
    rt.free(dev)
    return out


def gpu_side() -> None:
    print("== GPU checks")
    torch.cuda.init()
    torch.matmul(torch.ones(8, 8, device="cuda"), torch.ones(8, 8, device="cuda"))  # context + cuBLAS handle
    torch.cuda.synchronize()
    # The warm-up's memory came from torch's default pool: give it back (cuBLAS keeps its workspace cached
    # otherwise), so that everything the job allocates from here on is routed through gmux.
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    check(torch.cuda.memory_reserved() == 0, "nothing left in torch's default pool before routing starts")
    routing = torch_cuda.route_torch_cuda(0)
    try:
        import cupy
        cupy.cuda.set_allocator(na.cupy_allocator(routing.allocator).malloc)
    except ImportError:
        cupy = None
    baseline = used_bytes()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 8192), torch.nn.GELU(),
                                torch.nn.Linear(8192, 4096)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x, y = torch.randn(512, 4096, device="cuda"), torch.randn(512, 4096, device="cuda")
    arr = cupy.arange(64 << 20, dtype=cupy.float32) if cupy is not None else None
    for _ in range(5):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    check(stats.get("allocated_bytes.all.current", 0) == torch.cuda.memory_allocated() > 0, "torch.cuda.memory_stats() keeps working")
    gm = routing.allocator.stats()
    reserved = torch.cuda.memory_reserved()
    cupy_bytes = arr.nbytes if arr is not None else 0
    check(gm["live"] >= reserved + cupy_bytes and gm["errors"] == 0,
          f"every torch segment (forward, backward threads, optimizer) is a gmux allocation: gmux {gm['live'] >> 20} MiB, "
          f"torch reserved {reserved >> 20} MiB, cupy {cupy_bytes >> 20} MiB")
    running = used_bytes()
    job_bytes = running - baseline
    tensors = list(model.parameters()) + [p.grad for p in model.parameters()] + \
        [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.is_cuda]
    pointers = [t.data_ptr() for t in tensors]
    reference = [t.detach().cpu() for t in tensors]
    cupy_ref = arr.get() if arr is not None else None

    tier = AllocatorTier("cuda:0")
    tier.suspend(tensors)  # first cycle pins the host store once
    tier.resume()
    s = tier.suspend(tensors)
    suspended = used_bytes()
    # Against what gmux allocated: the driver also grows the context lazily while the job trains (kernel modules
    # loaded on first use, local memory), which no suspend can give back; that part is reported, not judged.
    owned = gm["live"]
    released = (running - suspended) / owned if owned else 0.0
    check(released >= 0.99, f"released {released:.2%} of the {owned >> 20} MiB gmux allocated for the job "
                            f"(the job grew the GPU's use by {job_bytes >> 20} MiB in all, context included)")
    r = tier.resume()
    check([t.data_ptr() for t in tensors] == pointers, "data pointers unchanged across suspend/resume")
    check(all(torch.equal(t.detach().cpu(), ref) for t, ref in zip(tensors, reference)), "tensors bit-identical after resume")
    if arr is not None:
        check(bool((arr.get() == cupy_ref).all()), "CuPy array bit-identical after resume")
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    check(bool(torch.isfinite(loss)), "training continues after resume")
    results.update({"job_bytes": job_bytes, "released_fraction": released, "live_bytes": s["bytes"],
                    "suspend_copy_GBps": s["bytes"] / s["copy_s"] / 1e9, "resume_copy_GBps": r["bytes"] / r["copy_s"] / 1e9,
                    "suspend_ms": s["total_s"] * 1e3, "resume_ms": r["total_s"] * 1e3, "release_ms": s["release_s"] * 1e3,
                    "map_ms": r["alloc_s"] * 1e3})
    if cupy is not None:
        results.update({"pinned_" + k: v for k, v in cupy_pinned_baseline(min(s["bytes"], 1 << 30)).items()})
    else:
        print("  (cupy not installed: no pinned cudaMemcpy baseline measured)")
    for k, v in results.items():
        print(f"  {k}: {v:.3f}" if isinstance(v, float) else f"  {k}: {v}")


def other_pools() -> None:
    """Pools begun after gmux's (a CUDA graph's capture, use_mem_pool) keep their allocations (torch_cuda.py).
    Had gmux's pool taken a capture's intermediate tensors, it would give them back when the capture ends and
    hand them out again: eager tensors made after it on the capture's stream (a free block is reused on its own
    stream) would be overwritten by every replay."""
    print("== CUDA graphs and other pools beside gmux's")
    routing = torch_cuda.torch_routing(0)
    results["latest_pool_wins"] = routing.latest_pool_wins
    print(f"  this torch gives an allocation to the {'last' if routing.latest_pool_wins else 'first'} pool begun")
    n = 2048
    x, w = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda") / n ** 0.5
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.relu(x @ w) @ w          # warm-up on the capture's stream (cuBLAS workspaces)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        y = torch.relu(x @ w) @ w          # relu(x @ w) is an intermediate, freed inside the capture
    check(not routing.owns(y.data_ptr()), "a capture's tensors come from the graph's own pool, not gmux's")
    with torch.cuda.stream(side):
        eager = [torch.full((n, n), float(i), device="cuda") for i in range(8)]
    torch.cuda.synchronize()
    check(all(routing.owns(t.data_ptr()) for t in eager), "eager tensors after the capture are gmux's again")
    x.copy_(torch.randn(n, n, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    check(all(bool((t == i).all()) for i, t in enumerate(eager)), "eager tensors made after a capture survive its replay")
    check(torch.allclose(y, torch.relu(x @ w) @ w, rtol=1e-3, atol=1e-3), "the replay computes what eager code does")
    tier = AllocatorTier("cuda:0")
    tier.suspend([x, w] + eager)
    tier.resume()
    x.copy_(torch.randn(n, n, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    check(torch.allclose(y, torch.relu(x @ w) @ w, rtol=1e-3, atol=1e-3) and
          all(bool((t == i).all()) for i, t in enumerate(eager)), "a graph replays correctly after a suspend and resume")
    pool = torch.cuda.MemPool()
    # Kept for good: destroyed while gmux's pool is being allocated to, torch's allocator would assert in its
    # destructor and abort the process (torch_cuda.py, "Not handled").
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(pool))
    with torch.cuda.use_mem_pool(pool):
        mine = torch.ones(1 << 20, device="cuda")
    after = torch.ones(1 << 20, device="cuda")
    check(not routing.owns(mine.data_ptr()) and routing.owns(after.data_ptr()),
          "use_mem_pool's allocations go to its pool, and gmux's resume after it")
    del graph, y, mine
    # Blocks freed after use on a second stream (record_stream): torch defers them while any pool is being
    # allocated to; the job's boundaries drain them (AllocatorTier.tidy). Without it each round adds a segment.
    side2, before = torch.cuda.Stream(), routing.allocator.stats()["committed"]
    for _ in range(40):
        t = torch.zeros(32 << 20, dtype=torch.uint8, device="cuda")
        side2.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side2):
            t.add_(1)
        t.record_stream(side2)
        del t
        AllocatorTier("cuda").tidy()       # ("cuda" without an index: the tier finds device 0)
    torch.cuda.synchronize()
    AllocatorTier("cuda").tidy()
    grown = routing.allocator.stats()["committed"] - before
    results["record_stream_growth_bytes"] = grown
    check(grown <= 96 << 20, f"blocks freed after use on a second stream are recycled: gmux holds {grown >> 20} MiB "
                             f"more after 40 rounds of 32 MiB (1280 MiB if none were)")


def main() -> int:
    cpu_side()
    if torch.cuda.is_available():
        try:
            gpu_side()
            other_pools()
        except Exception as e:  # noqa: BLE001 - what was checked before it is still reported and written
            traceback.print_exc()
            failures.append(f"the GPU checks stopped: {e!r}")
    else:
        print("== GPU checks SKIPPED: no CUDA device here (nothing measured)")
    out = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "gpu_validate.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                   "results": results, "failures": failures}, f, indent=2)
    print("validate: " + ("FAILED: " + "; ".join(failures) if failures else "all checks passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
