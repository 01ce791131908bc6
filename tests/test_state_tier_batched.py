"""The state tier's batched bookkeeping: many small tensors, aliases, storages that cannot resize, large and
small rows on the pool, host views while suspended; every value and every object kept."""
import numpy as np
import pytest
import torch
from torch import nn

import gmux.job as gj
from gmux.job.memory.state_tier import StateTier
from gmux_testkit import assert_identical


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(5, 5) for _ in range(40)], nn.Linear(5, 600))
    big = nn.Parameter(torch.randn(300_000))          # 1.2 MB: a row above Copier.SMALL, its own region
    opt = torch.optim.Adam([*model.parameters(), big], lr=1e-3)
    return model, big, opt


def _step(model, big, opt, seed):
    g = torch.Generator().manual_seed(seed)
    opt.zero_grad()
    (model(torch.randn(3, 5, generator=g)).square().mean() + big.square().mean()).backward()
    opt.step()


@pytest.mark.parametrize("pooled", [True, False])
def test_many_small_tensors_cycle_bit_identical_to_never_suspended(pooled):
    def run(cycles):
        model, big, opt = _model()
        extras = {"big": big}
        job = gj.attach(model, opt, extras=extras, pool=gj.DevicePool(32 << 20) if pooled else None)
        assert isinstance(job.tier, StateTier)
        params = [id(p) for p in model.parameters()]
        for step in range(4):
            _step(model, big, opt, step)            # zero_grad(set_to_none): new gradient objects each step
            if cycles:
                before = [t.clone() for t in job.tracked.tensors()]
                figures = job.suspend()
                assert figures["tensors"] > 300
                if pooled:
                    assert job.tier.pool.in_use == 0    # every region back, the small rows' block too
                job.resume()
                assert_identical(before, [t.clone() for t in job.tracked.tensors()])
        assert [id(p) for p in model.parameters()] == params
        if pooled and cycles:
            assert all(job.tier.pool.holds(t.untyped_storage().data_ptr()) for t in job.tracked.tensors()
                       if t.device.type == "cpu" and t.numel())
        return [t.clone() for t in job.tracked.tensors()]

    assert_identical(run(False), run(True))


@pytest.mark.parametrize("pooled", [True, False])
def test_aliases_stay_aliases_and_host_views_show_suspended_values(pooled):
    base = torch.arange(64, dtype=torch.float32)
    view = base[8:24].view(4, 4).t()                    # offset and strides
    other = torch.arange(10, dtype=torch.int64)
    job = gj.attach(extras={"base": base, "view": view, "other": other},
                    pool=gj.DevicePool(1 << 20) if pooled else None)
    expected = {k: v.contiguous().clone() for k, v in job.tracked.extras.items()}
    job.suspend()
    for k, t in job.tracked.extras.items():
        assert torch.equal(job.tier.host_view(t), expected[k]), k
    job.resume()
    assert_identical(expected, {k: v.contiguous().clone() for k, v in job.tracked.extras.items()})
    base[9] = -1.0                                      # base[9] is view[0][1] transposed: view[1][0]
    assert job.tracked.extras["view"][1, 0] == -1.0
    assert job.tracked.extras["view"].stride() == (1, 4)


def test_a_storage_that_cannot_resize_is_re_pointed_beside_ones_freed_in_place():
    foreign = torch.from_numpy(np.arange(12, dtype=np.float32))   # numpy's memory: cannot resize
    own = torch.arange(5, dtype=torch.float64)
    empty = torch.empty(0)
    job = gj.attach(extras={"foreign": foreign, "own": own, "empty": empty})
    storage = own.untyped_storage()
    figures = job.suspend()
    assert figures["tensors"] == 2 and own.untyped_storage().nbytes() == 0 and foreign.numel() == 0
    job.resume()
    assert torch.equal(foreign, torch.arange(12, dtype=torch.float32))
    assert torch.equal(own, torch.arange(5, dtype=torch.float64))
    assert own.untyped_storage().data_ptr() == storage.data_ptr() or own.untyped_storage().nbytes() == 40
    assert job.tracked.extras["foreign"] is foreign and job.tracked.extras["empty"].numel() == 0


def test_a_failed_resume_leaves_the_job_suspended_and_resumable():
    model, big, opt = _model()
    _step(model, big, opt, 0)
    pool = gj.DevicePool(8 << 20)
    job = gj.attach(model, opt, extras={"big": big}, pool=pool)
    expected = [t.clone() for t in job.tracked.tensors()]
    job.suspend()
    hog = pool.storage(pool.size - (64 << 10))          # the pool is taken while the job is suspended
    with pytest.raises(MemoryError):
        job.resume()
    assert job.suspended
    del hog
    job.resume()
    assert_identical(expected, [t.clone() for t in job.tracked.tensors()])
