"""Where torch gives an allocation to the first pool begun whose filter takes its stream (torch 2.8 and 2.9),
gmux's every-stream pool goes behind each pool begun after it (gmux/job/memory/torch_cuda.py).

Only the ordering is checked here, against a model of that allocator's list of pools being allocated to, through
torch's own use_mem_pool and the bindings inductor calls. Which order a torch has is measured when the routing
starts, and that real CUDA graphs and pools keep their allocations is checked, on a GPU, by
benchmarks/gpu/validate_gpu.py (other_pools)."""
import types

import pytest
import torch
import torch.cuda.memory as cuda_memory
from torch.cuda import graphs

from gmux.job.memory import torch_cuda

GMUX = (7, 0)


class ModelAllocator:
    """The caching allocator's pools being allocated to, in the order they were begun; the first that takes a
    stream gets its allocations."""

    def __init__(self):
        self.underway: list = []          # [(pool id, takes every stream)]

    def begin(self, every_stream):
        def begin(device, pool_id):
            assert all(p != tuple(pool_id) for p, _ in self.underway), "already recording to this pool"
            self.underway.append((tuple(pool_id), every_stream))
        return begin

    def end(self, device, pool_id):
        self.underway.remove(next(e for e in self.underway if e[0] == tuple(pool_id)))

    def first(self) -> tuple:
        return self.underway[0][0]


@pytest.fixture
def model(monkeypatch):
    m = ModelAllocator()
    for where in (torch._C, cuda_memory):
        monkeypatch.setattr(where, "_cuda_beginAllocateToPool", m.begin(True), raising=False)
        monkeypatch.setattr(where, "_cuda_beginAllocateCurrentThreadToPool", m.begin(False), raising=False)
        monkeypatch.setattr(where, "_cuda_endAllocateToPool", m.end, raising=False)
        monkeypatch.setattr(where, "_cuda_releasePool", lambda device, pool_id: None, raising=False)
        monkeypatch.setattr(where, "_cuda_beginAllocateCurrentStreamToPool", m.begin(False), raising=False)
    monkeypatch.setattr(graphs.CUDAGraph, "capture_begin",
                        lambda self, pool=None, **kw: m.begin(False)(0, pool or (9, 9)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch_cuda, "_wrapped", False)     # installed afresh over the model
    routing = object.__new__(torch_cuda.TorchCudaRouting)     # its pool ordering, without a CUDA allocator
    routing.pool, routing.active, routing.device, routing.latest_pool_wins = (
        types.SimpleNamespace(id=GMUX), True, 0, False)
    monkeypatch.setitem(torch_cuda._routings, 0, routing)
    torch._C._cuda_beginAllocateToPool(0, GMUX)              # as the routing begins it, then wraps
    torch_cuda._yield_to_later_pools()
    return m


def test_a_pool_begun_after_gmuxs_is_reached_first(model):
    pool = types.SimpleNamespace(id=(3, 1))
    with torch.cuda.use_mem_pool(pool, device=0):
        assert model.first() == (3, 1)
        assert [p for p, _ in model.underway] == [(3, 1), GMUX]
    assert model.underway == [(GMUX, True)]          # gmux's pool still takes everything after it


def test_a_capture_and_inductors_warm_up_are_reached_first(model):
    graphs.CUDAGraph.capture_begin(object(), pool=(5, 5))
    assert model.first() == (5, 5)
    torch._C._cuda_beginAllocateCurrentThreadToPool(0, (6, 6))      # as cudagraph_trees' warm-up calls it
    assert [p for p, _ in model.underway] == [(5, 5), (6, 6), GMUX]
    torch._C._cuda_endAllocateToPool(0, (5, 5))
    torch._C._cuda_endAllocateToPool(0, (6, 6))
    assert model.underway == [(GMUX, True)]


def test_a_pool_on_a_device_gmux_does_not_route_changes_nothing(model):
    torch._C._cuda_beginAllocateToPool(1, (4, 4))     # no routing on device 1
    assert [p for p, _ in model.underway] == [GMUX, (4, 4)]
