"""Helpers shared by the runtime tests (a plain module: each test folder has its own conftest)."""
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The training script the gmuxd and cluster tests run (plain torch; --attach for explicit mode).
TRAIN = os.path.join(ROOT, "gmux", "examples", "demo_train.py")
PY = sys.executable


def env() -> dict:
    """The environment for a process of the project under test."""
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def run_py(*args, timeout=180, check=True):
    """Runs python with the project importable, in a new process; returns the completed process."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def assert_identical(a, b, where="state"):
    """Bit-for-bit equality of nested tensors, numbers and containers, naming the first difference."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.view(torch.uint8) if a.dim() else a, b.view(torch.uint8) if b.dim() else b), \
            f"{where} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys {set(a) ^ set(b)}"
        for k in a:
            assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def wait_for(pred, timeout: float, what, every: float = 0.2):
    """Polls `pred` until it returns something true (returned), or fails the test naming `what` (a text, or
    a function giving one: the state at the time of failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s: {what() if callable(what) else what}")
