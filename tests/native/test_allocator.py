"""The Python face of the native core: pools, allocators, placement of CPU tensors, errors, tier choice."""
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from gmux.job.memory import native as na
from gmux.job.memory import torch_cuda

pytestmark = pytest.mark.skipif(not na.available(), reason="gmux._native is not built")


@pytest.fixture
def pool():
    p = na.Pool.create(64 << 20)
    yield p
    p.close()


def test_misuse_raises_with_code_and_message(pool):
    with na.Allocator.host(pool) as a:
        addr = a.malloc(1000, "weights")
        assert a.stats()["live_by_tag"]["weights"] == 1000
        a.free(addr)
        with pytest.raises(na.NativeError, match="already freed") as e:
            a.free(addr)
        assert e.value.code == -3
        with pytest.raises(na.NativeError, match="not suspended") as e:
            a.resume()
        assert e.value.code == -4
        with pytest.raises(ValueError, match="unknown tag"):
            a.malloc(10, "gradients")
        with pytest.raises(na.NativeError, match="exhausted"):
            a.malloc(1 << 30)
    with pytest.raises(RuntimeError, match="closed"):
        a.malloc(10)
    b = na.Allocator.host(pool)
    with pytest.raises(RuntimeError, match="close them first"):
        pool.close()
    b.close()
    with pytest.raises(na.NativeError, match="not a gmux pool"):
        na.Pool.open(path=__file__)


def test_place_keeps_identity_sharing_and_values(pool):
    a = na.Allocator.host(pool)
    torch.manual_seed(0)
    m = torch.nn.Linear(16, 8)
    view = m.weight[2:4]  # shares the weight's storage
    before = m.weight.detach().clone(), m.bias.detach().clone()
    weight = m.weight
    out = na.place(a, [m.weight, m.bias, view])
    assert out["storages"] == 2
    assert m.weight is weight and m.weight.is_leaf and m.weight.requires_grad
    assert torch.equal(m.weight, before[0]) and torch.equal(m.bias, before[1])
    assert a.lookup(m.weight.data_ptr()) is not None and a.lookup(m.bias.data_ptr()) is not None
    assert view.untyped_storage().data_ptr() == m.weight.untyped_storage().data_ptr()
    with torch.no_grad():
        m.weight[2, 0] = 42.0
    assert view[0, 0].item() == 42.0
    assert na.place(a, [m.weight])["bytes"] == 0  # already native: left alone
    # The region goes back when the last storage over it dies.
    del m, view, weight, out
    import gc
    gc.collect()
    assert a.stats()["allocations"] == 0


def test_suspend_releases_and_restores_in_place(pool):
    a = na.Allocator.host(pool)
    t = torch.arange(1 << 20, dtype=torch.float32)
    na.place(a, [t])
    ptr = t.data_ptr()
    free_running = pool.info()["free_chunks"]
    figures = a.suspend(na.storage_ranges([t]))
    assert figures["bytes"] == 4 << 20
    assert pool.info()["free_chunks"] == pool.info()["chunks"] > free_running
    assert bytes(a.peek(ptr + 4, 4)) == torch.tensor([1.0]).numpy().tobytes()
    a.resume()
    assert t.data_ptr() == ptr and torch.equal(t, torch.arange(1 << 20, dtype=torch.float32))


def test_touching_a_suspended_tensor_faults():
    code = textwrap.dedent("""
        import torch
        from gmux.job.memory import native as na
        a = na.Allocator.host(na.Pool.create(8 << 20))
        t = torch.ones(1000)
        na.place(a, [t])
        a.suspend()
        print(t.sum().item())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert r.returncode == -signal.SIGSEGV, r.stderr.decode()[-2000:]


def test_pool_shared_by_path_with_another_process(tmp_path):
    path = str(tmp_path / "pool")
    with na.Pool.create(32 << 20, path=path) as p:
        code = (f"import os; from gmux.job.memory import native as na; a = na.Allocator.host(na.Pool.open(path={path!r})); "
                "a.malloc(6 << 20); os._exit(0)")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        # The child died holding 3 chunks (as a killed job would): the owner takes them back.
        assert p.info()["free_chunks"] == p.info()["chunks"] - 3
        assert p.reclaim() == 3


def test_live_ranges_from_snapshot_keeps_only_active_blocks():
    snapshot = [
        {"address": 0x1000_0000, "total_size": 2 << 20, "blocks": [
            {"size": 512, "state": "active_allocated"},
            {"size": 1 << 20, "state": "inactive"},
            {"size": (1 << 20) - 512, "state": "active_pending_free"}]},
        {"address": 0x2000_0000, "total_size": 2 << 20, "blocks": [{"size": 2 << 20, "state": "active_allocated"}]},
    ]
    ranges = torch_cuda.live_ranges_from_snapshot(snapshot, lambda addr: addr == 0x1000_0000)
    assert ranges == [(0x1000_0000, 512), (0x1000_0000 + 512 + (1 << 20), (1 << 20) - 512)]


def test_cuda_routing_refuses_expandable_segments(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    with pytest.raises(torch_cuda.CannotRoute, match="expandable_segments"):
        torch_cuda.TorchCudaRouting(None, 0)
    with pytest.raises(torch_cuda.CannotRoute, match="expandable_segments"):
        torch_cuda.route_torch_cuda(0)      # before an allocator is made for the device
    assert 0 not in torch_cuda._routings


def test_a_job_whose_memory_cannot_be_routed_runs_on_torchs_allocator(monkeypatch, capsys):
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is common in training recipes: such a job runs, on
    torch's own allocator (the state tier), and is told why, where before it failed to start."""
    from gmux.job import memory
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128,expandable_segments:True")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert memory.device_memory(0, native=True, limit=None) is None
    err = capsys.readouterr().err
    assert "not routed through gmux: expandable_segments is set" in err and "state tier" in err
    assert 0 not in torch_cuda._routings


def test_cuda_allocator_without_a_driver_says_so():
    try:
        a = na.Allocator.cuda(0)
    except na.NativeError as e:
        assert e.code in (-6, -1) and ("CUDA" in str(e) or "cuda" in str(e))
    else:  # a GPU machine
        assert a.backend == "cuda"
        a.close()


def test_cupy_hookup_is_import_guarded(pool):
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="cupy is not installed"):
            na.cupy_allocator(na.Allocator.host(pool))


def test_choose_tier(pool):
    from gmux.job.memory import choose_tier
    from gmux.job.memory.allocator_tier import AllocatorTier
    from gmux.job.memory.python_pool import DevicePool
    from gmux.job.memory.state_tier import StateTier

    assert isinstance(choose_tier("cpu", pool), AllocatorTier)
    assert isinstance(choose_tier("cpu", None), StateTier)
    assert isinstance(choose_tier("cpu", DevicePool(1 << 20)), StateTier)


def test_device_memory_prefers_the_native_pool_and_falls_back_to_the_python_one():
    """The one place that decides a job's memory: the native pool (allocator tier) where the library is built,
    the Python DevicePool (state tier) only without it, no pool for no size; both tiers behind one interface."""
    from gmux.job.memory import choose_tier, device_memory
    from gmux.job.memory.python_pool import DevicePool
    from gmux.job.memory.tier import Tier

    if torch.cuda.is_available():
        pytest.skip("on a GPU device_memory routes CUDA allocations instead of making a virtual GPU")
    native_pool, python_pool = device_memory(4 << 20), device_memory(4 << 20, native=False)
    assert isinstance(native_pool, na.Pool) and native_pool.info()["bytes"] == 4 << 20
    assert isinstance(python_pool, DevicePool) and python_pool.size == 4 << 20
    assert device_memory(0) is None
    tiers = [choose_tier("cpu", p) for p in (native_pool, python_pool, None)]
    assert [t.name for t in tiers] == ["allocator", "state", "state"]
    assert all(isinstance(t, Tier) for t in tiers)
    with pytest.raises(RuntimeError, match="allocator tier .* cannot spill"):
        tiers[0].spill("/nonexistent")
