"""A job's memory limit (gmux/job/memory/limit.py and its mechanisms), unit by unit.

The CPU limiter takes the place of torch's CPU allocator for the rest of a process, so its checks run in
child processes (tests/scripts/memory_limit_checks.py), never in pytest's own. The native allocator's limit
has no process-wide state and is checked here."""
import os

import pytest
import torch

from gmux.job.memory import native as na
from gmux.job.memory.python_pool import DevicePool, PoolExhausted
from gmux_testkit import ROOT, run_py

MiB = 1 << 20
CHECKS = os.path.join(ROOT, "tests", "scripts", "memory_limit_checks.py")
SCRIPT = os.path.join(ROOT, "tests", "scripts", "state_and_grab.py")


@pytest.mark.parametrize("check", ["refuse", "host_scope", "soft", "pools", "threads", "restore", "lstm",
                                   "unlimited", "small"])
def test_cpu_limit(check):
    """Each check prints 'ok <check>' once every assertion in it held (see the script for what each asserts)."""
    proc = run_py(CHECKS, check)
    assert f"ok {check}" in proc.stdout, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def plain():
    """The script's numbers without gmux."""
    return run_py(SCRIPT, "8", "0").stdout.split()[0]


@pytest.mark.parametrize("tier", [[], ["--pool", "128MiB"], ["--pool", "128MiB", "--no-native"]],
                         ids=["state-heap", "allocator-pool", "state-pool"])
def test_suspend_and_resume_near_the_limit_are_bit_identical_and_the_limit_still_holds(tier, plain):
    """A job whose state is 24 MiB under a 40 MiB limit is suspended and resumed every 2 steps: the host copy
    (24 MiB more) is host memory, not counted, so every suspend succeeds; the job ends with the numbers of a run
    without gmux, and a 20 MiB allocation after that is refused (the limit still holds after the cycles)."""
    proc = run_py("-m", "gmux.job.run", "--mem", "40MiB", "--cycle-every", "2", *tier, SCRIPT, "8", "20", check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.split()[0] == plain, (proc.stdout, plain)
    assert "4 suspends" in proc.stderr and "suspend failed" not in proc.stderr, proc.stderr
    assert "torch.OutOfMemoryError: gmux: this job is over its GPU memory limit of 40.0MiB" in proc.stderr, proc.stderr


def test_native_allocator_refuses_past_its_limit_and_counts_what_it_holds():
    """The routed allocator's limit (a GPU job's) on the host backend: the spans of all allocations count,
    a refusal names the limit and changes nothing, a free makes room again, a suspended job keeps its claim."""
    with na.Pool.create(64 * MiB) as pool, na.Allocator.host(pool) as a:
        a.set_limit(8 * MiB)
        first = a.malloc(4 * MiB)
        with pytest.raises(na.NativeError, match="memory limit of 8388608 bytes") as e:
            a.malloc(6 * MiB)
        assert e.value.code == -2   # GMUX_E_NOMEM: what torch's pluggable allocator turns into its OOM error
        s = a.stats()
        assert (s["limit"], s["committed"], s["refused"], s["allocations"]) == (8 * MiB, 4 * MiB, 1, 1)
        second = a.malloc(4 * MiB)                  # exactly at the limit: allowed
        a.suspend()
        assert a.stats()["committed"] == 8 * MiB    # released while suspended, but resuming maps it all again
        a.resume()
        a.free(first)
        third = a.malloc(2 * MiB)
        assert a.stats()["committed"] == 6 * MiB
        a.set_limit(0)                              # no limit
        big = a.malloc(32 * MiB)
        for p in (second, third, big):
            a.free(p)
        assert a.stats()["committed"] == 0


def test_a_full_pool_raises_torchs_out_of_memory_error():
    pool = DevicePool(4 * MiB)
    kept = pool.storage(3 * MiB)
    with pytest.raises(torch.OutOfMemoryError, match="virtual GPU pool exhausted") as e:
        pool.storage(2 * MiB)
    assert isinstance(e.value, (PoolExhausted, MemoryError))
    del kept


def test_a_cuda_oom_at_the_routed_allocators_limit_is_explained_in_the_exit_reason(monkeypatch):
    """On a GPU torch raises its own OOM error when gmux's routed allocator refuses; the job's exit reason says
    it was the job's limit (only once the allocator has refused something: a full GPU is not the limit)."""
    from gmux.job.memory import limit as ml
    with na.Pool.create(16 * MiB) as pool, na.Allocator.host(pool) as a:
        what = ml.describe(4 * MiB, "j1", "big")
        monkeypatch.setattr(ml, "_enforced", ml.Enforced(4 * MiB, False, "enforced", allocator=a, what=what))
        a.set_limit(4 * MiB)
        torch_error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 MiB. GPU 0 has ...")
        assert ml.explain(torch_error) is None                 # nothing refused: the GPU itself was full
        with pytest.raises(na.NativeError):
            a.malloc(8 * MiB)
        reason = ml.explain(torch_error)
        assert reason.startswith("OutOfMemoryError: gmux: job j1 (big) is over its GPU memory limit of 4.0MiB"), reason
        assert "gmux-launch --mem" in reason and "CUDA out of memory" in reason
        assert ml.explain(ValueError("x")) is None
