"""The suite's fork server (tests/forkserver.py) keeps each process's exit its own when the kernel hands a pid out
again. Before: a run given the pid of an earlier, ended one "ended" at once with that one's status, and its test
read output not yet written (CI: FileNotFoundError for a reference run's output)."""
import os
import sys

import pytest

import forkserver
from gmux_testkit import ROOT, env

LAST_PID = "/proc/sys/kernel/ns_last_pid"


def test_a_reused_pid_does_not_carry_the_exit_of_the_process_that_had_it(tmp_path):
    if not os.access(LAST_PID, os.W_OK):
        pytest.skip(f"choosing the next pid needs {LAST_PID} writable (root)")
    server = forkserver.Server(sys.executable, env(), ROOT)
    first = server.spawn(["-c", "raise SystemExit(3)"], env(), ROOT, os.devnull, None)
    assert first.wait(60) == 3
    for attempt in range(20):                # another process may take the pid between the write and the fork
        out = tmp_path / f"out{attempt}"     # a try that missed the pid writes its own file, not this one's
        with open(LAST_PID, "w") as f:
            f.write(str(first.pid - 1))
        second = server.spawn(["-c", "import time, sys; time.sleep(1); print('written')"], env(), ROOT,
                              str(out), None)
        if second.pid == first.pid:
            break
        second.wait(60)
    else:
        pytest.skip("the pid went to another process every time")
    assert second.poll() is None
    assert second.wait(60) == 0
    assert out.read_text() == "written\n"
    assert first.returncode == 3


def test_a_signal_reaches_a_running_child_and_none_once_it_has_ended():
    server = forkserver.Server(sys.executable, env(), ROOT)
    child = server.spawn(["-c", "import time; time.sleep(60)"], env(), ROOT, os.devnull, None)
    child.kill()
    assert child.wait(60) == -9
    child.terminate()                        # its pid may be another's by now: the server sends nothing
    assert child.wait(1) == -9


def test_a_worker_that_has_built_an_optimizer_since_its_server_started_still_forks(tmp_path):
    """torch's first optimizer in a process sets TORCHINDUCTOR_CACHE_DIR (its default) in os.environ, and an
    import of lightning sets PYTORCH_NVML_BASED_CUDA_CHECK: a worker whose in-process test did either after its
    server had started asked with a variable more than the server started with. Before: every later reference
    run of that worker started cold (4.5 s of CPU each), most of the suite's under CI."""
    import torch
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)      # as an in-process test does
    worker = dict(env(), PYTORCH_NVML_BASED_CUDA_CHECK="1")            # and as an import of lightning does
    before = {k: v for k, v in worker.items()                            # the worker as it started
              if k not in ("TORCHINDUCTOR_CACHE_DIR", "PYTORCH_NVML_BASED_CUDA_CHECK")}
    server = forkserver.Server(sys.executable, before, ROOT)
    try:
        assert server.fits(before)
        assert server.fits(worker)
        assert not server.fits(dict(worker, TORCHINDUCTOR_CACHE_DIR=str(tmp_path)))    # a cache of its own: cold
        assert not server.fits(dict(worker, OMP_NUM_THREADS="2"))
        out = tmp_path / "out"
        child = server.spawn(["-c", "import os; print(os.environ['TORCHINDUCTOR_CACHE_DIR'], "
                                    "os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'])"], worker, ROOT, str(out), None)
        assert child.wait(60) == 0
        assert out.read_text() == worker["TORCHINDUCTOR_CACHE_DIR"] + " 1\n"
    finally:
        server.proc.stdin.close()             # (the server ends at the end of its requests)
        server.proc.wait(30)
