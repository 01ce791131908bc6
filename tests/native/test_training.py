"""A real training job on a virtual GPU, suspended and resumed through the allocator tier: its numbers stay
bit-identical to an uninterrupted run, and while suspended its RSS really drops."""
import io

import pytest
import torch

import gmux.job
from gmux.job.memory import native as na
from gmux.job.memory.allocator_tier import AllocatorTier

pytestmark = pytest.mark.skipif(not na.available(), reason="gmux._native is not built")

STEPS = 10


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _make():
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(2048, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(32, 1024, generator=g), torch.randint(0, 10, (32,), generator=g)


def _step(model, opt, step):
    x, y = _batch(step)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def _state(model, opt):
    out = [p.detach().clone() for p in model.parameters()]
    for st in opt.state.values():
        out += [v.clone() for v in st.values() if torch.is_tensor(v)]
    return out


def test_suspended_and_resumed_training_is_bit_identical_and_gives_memory_back():
    torch.set_num_threads(1)
    model, opt = _make()
    for step in range(STEPS):
        _step(model, opt, step)
    reference = _state(model, opt)
    del model, opt

    pool = na.Pool.create(256 << 20)
    model, opt = _make()
    job = gmux.job.attach(model, opt, pool=pool)
    assert isinstance(job.tier, AllocatorTier)
    params = list(model.parameters())
    drops = []
    for step in range(STEPS):
        _step(model, opt, step)
        job.boundary()
        if step in (2, 5, 8):
            running = _rss()
            figures = job.suspend()
            suspended = _rss()
            addresses = [p.data_ptr() for p in model.parameters()]  # native from the first suspend on
            tracked = job.tier.allocator.stats()["live"]
            drops.append((running - suspended, tracked))
            assert job.suspended and figures["tier"] == "allocator" and figures["bytes"] > 0
            if step == 5:  # a checkpoint taken while suspended reads the saved bytes
                while_suspended = io.BytesIO()
                job.checkpoint(while_suspended)
            job.resume()
            if step == 5:
                after = io.BytesIO()
                job.checkpoint(after)
                assert while_suspended.getvalue() == after.getvalue()
            assert [p.data_ptr() for p in model.parameters()] == addresses  # pointers unchanged
    assert all(a is b for a, b in zip(params, model.parameters()))
    got = _state(model, opt)
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        assert torch.equal(a, b)

    # weights + grads + Adam's two moments, ~64 MiB: all of it leaves the process while suspended
    for drop, tracked in drops[1:]:  # the first suspend also places the state in native memory
        assert tracked > 60 << 20
        assert drop >= 0.9 * tracked, f"RSS dropped {drop >> 20} MiB of {tracked >> 20} MiB tracked"
    report = job.report()
    assert report["native_by_tag"]["weights"] > 0 and report["native_peak"] >= report["native_at_boundary"] > 0


def test_commands_from_a_controller_go_through_the_allocator_tier():
    """The runtime's command path: suspend at a boundary gives every pool chunk back (for the next job on
    this virtual GPU), resume continues, and the result matches an uninterrupted run."""
    import threading

    torch.set_num_threads(1)
    model, opt = _make()
    for step in range(6):
        _step(model, opt, step)
    reference = _state(model, opt)
    del model, opt

    pool = na.Pool.create(256 << 20)
    model, opt = _make()
    controller = gmux.job.LocalController()
    job = gmux.job.attach(model, opt, pool=pool, controller=controller)
    at_step_3, done = threading.Event(), threading.Event()

    def train():
        for step in range(6):
            _step(model, opt, step)
            if step == 3:
                at_step_3.set()
            job.boundary()
        done.set()

    worker = threading.Thread(target=train)
    worker.start()
    assert at_step_3.wait(30)
    reply = controller.result(controller.send("suspend"), timeout=30)
    assert reply["ok"] and reply["tier"] == "allocator", reply
    info = pool.info()
    assert info["free_chunks"] == info["chunks"] and job.suspended
    reply = controller.result(controller.send("resume"), timeout=30)
    assert reply["ok"], reply
    assert done.wait(60)
    worker.join()
    for a, b in zip(_state(model, opt), reference):
        assert torch.equal(a, b)
