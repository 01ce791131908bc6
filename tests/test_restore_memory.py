"""A job restored from a checkpoint (a move's new process: `gmux migrate --new-process`) holds its state once.

The restore read each tensor as a view of the byte buffer its data was read into, and the optimizer kept those
views as its state (load_state_dict takes tensors already of the parameter's dtype and device as they are). The
first suspend moves a tracked tensor's memory (native.place into the virtual GPU's pool, or the state tier's
re-pointing), and the view's base, which no suspend can move, kept the old buffer: from then on the job held its
optimizer state twice (+32 MiB for Adam over 4.2M parameters, and a job under --mem died of OutOfMemoryError).

The job's bytes in use are what the CPU limiter counts (gmux/job/memory/limit.py), which replaces torch's CPU
allocator for the rest of its process: so each case runs in a process of its own (this file, run as a script)."""
import gc
import io
import sys

import pytest
import torch

MiB = 1 << 20
TIERS = {"allocator-pool": ["native"], "state-pool": ["python"], "state-heap": ["heap"]}


@pytest.mark.parametrize("optimizer", ["adam", "sgd-momentum"])
@pytest.mark.parametrize("tier", TIERS)
def test_a_restored_job_holds_its_state_once_across_suspends(tier, optimizer):
    from gmux_testkit import run_py
    proc = run_py(__file__, *TIERS[tier], optimizer)
    assert "ok" in proc.stdout.split(), proc.stdout + proc.stderr


def test_a_checkpoints_tensors_are_not_views_of_what_they_were_read_into():
    """The cause itself, in this process: a restored tensor is its own, not a view whose base is another."""
    from gmux.job import checkpoint as ckpt
    buf = io.BytesIO()
    ckpt.write({"a": torch.arange(12.0).reshape(3, 4), "b": [torch.ones(5, dtype=torch.int64)],
                "z": ckpt.Zeros(torch.ones(2, 2))}, buf.write)
    snap = ckpt.read(io.BytesIO(buf.getvalue()), "(test)")
    for t in (snap["a"], snap["b"][0], snap["z"]):
        assert t._base is None and t.is_contiguous()
    assert torch.equal(snap["a"], torch.arange(12.0).reshape(3, 4)) and snap["z"].abs().sum() == 0


# -- the child: one tier, one optimizer -----------------------------------------------------------------------
def _child(pool_kind: str, optimizer: str) -> None:
    from torch import nn

    from gmux.job.job import Job
    from gmux.job.memory import device_memory, limit
    from gmux.job.state import TrackedState
    torch.set_num_threads(1)
    pool = device_memory(0 if pool_kind == "heap" else 256 * MiB, native=pool_kind == "native")
    x, y = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)), torch.arange(64) % 2

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 2))
        opt = torch.optim.Adam(model.parameters(), lr=1e-4) if optimizer == "adam" else \
            torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        return model, opt, Job(TrackedState(modules=[model], optimizers=[opt]), pool=pool, device="cpu")

    def step(model, opt):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=False)     # gradients kept: restored ones must not be held twice either
        loss.backward()
        opt.step()

    def in_use() -> int:
        gc.collect()
        return limit.cpu_limit().stats()["in_use"]

    model, opt, job = build()
    for _ in range(3):
        step(model, opt)
    job.suspend()
    job.resume()
    saved = io.BytesIO()
    job.checkpoint(saved)
    for _ in range(3):
        step(model, opt)
    expected = [p.detach().clone() for p in model.parameters()]
    del model, opt, job
    before = in_use()

    model, opt, job = build()        # a move's new process: the script builds its job, then restores into it
    job.restore(saved.getvalue())
    restored = in_use()
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    assert restored - before > state, (before, restored, state)
    for cycle in range(2):
        job.suspend()
        suspended = in_use()
        if pool_kind == "python":     # the state tier on a pool gives every byte back while suspended
            assert suspended - before < MiB, (cycle, before, suspended)
        job.resume()
        assert in_use() - restored < MiB, (f"cycle {cycle}: {(in_use() - restored) / MiB:.1f} MiB more in use "
                                           f"than just after the restore (its optimizer state is {state / MiB:.1f} "
                                           f"MiB)")
    for _ in range(3):
        step(model, opt)
    assert in_use() - restored < MiB
    for p, q in zip(model.parameters(), expected):
        assert torch.equal(p.detach().view(torch.uint8), q.view(torch.uint8))
    print("ok")


if __name__ == "__main__":
    _child(*sys.argv[1:3])
