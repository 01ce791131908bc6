"""The prepared GPU check builds and runs its CPU-side parts everywhere; on a machine without a GPU it must
say that the GPU checks were skipped, never report a GPU figure."""
import os
import subprocess
import sys

import torch
from gmux_testkit import ROOT


def test_validate_script_builds_and_runs_its_cpu_side():
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=ROOT)
    out = subprocess.run(["bash", "benchmarks/gpu/validate.sh"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "100% tests passed" in out.stdout
    if not torch.cuda.is_available():
        assert "GPU checks SKIPPED" in out.stdout
        assert "runtime_cuda: skipped, no CUDA device here" in out.stdout
        assert "rebind_cuda: skipped, no CUDA device here" in out.stdout
        assert "GB/s" not in out.stdout.split("GPU checks SKIPPED")[1]
