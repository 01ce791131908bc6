"""A job with no mini-batch boundary and no --mem, on a real GPU, is measured through NVML and sliced
(gmux/node/gpu_memory.py), instead of holding its GPU.

    python benchmarks/gpu/unsized_gpu.py        (skips, saying so, where no GPU is found through NVML)

A private gmuxd on GPU 0 runs two jobs there through gmux-launch: one that takes about 2 GiB with torch and then
computes for ever without an optimizer (so no boundary, and nothing reported), and one declared with --mem that
must be given turns beside it. Passes when gmux decisions show "measured" for the first job, with a size between
what it allocated and the whole GPU, then "stop" for it, and the second job resumes.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from gmux.node.inventory import nvml_gpus  # noqa: E402
from gmux.wire.daemon_client import Client  # noqa: E402

HOG = ("import torch, time\nx = torch.ones(512 << 20, device='cuda')\n"      # 2 GiB of float32
       "while True:\n    x.mul_(1.0)\n    torch.cuda.synchronize()\n    time.sleep(0.01)\n")
WAITER = "import torch, time\nx = torch.ones(1 << 20, device='cuda')\nwhile True:\n    time.sleep(0.05)\n"


def main() -> int:
    if not nvml_gpus():
        print("unsized_gpu: skipped: no GPU found through NVML")
        return 0
    rt = tempfile.mkdtemp(prefix="gmux-unsized-")
    env = {**os.environ, "PYTHONPATH": ROOT}
    procs = [subprocess.Popen([sys.executable, "-m", "gmux.cli.gmuxd", "--runtime-dir", rt, "--quantum", "2"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)]
    try:
        client = None
        for _ in range(100):
            try:
                client = Client(rt, timeout=1.0)
                client.call("ping")
                break
            except Exception:
                time.sleep(0.2)
        files = []
        for name, body, opts in (("hog", HOG, []), ("waiter", WAITER, ["--mem", "1GiB"])):
            path = os.path.join(rt, f"{name}.py")
            with open(path, "w") as f:
                f.write(body)
            files.append(path)
            procs.append(subprocess.Popen([sys.executable, "-m", "gmux.cli.launch", "--runtime-dir", rt, "--gpu", "0",
                                           *opts, "--", sys.executable, path], env=env))
            time.sleep(5)
        kinds, end = [], time.monotonic() + 90
        while time.monotonic() < end:
            kinds = [(d["kind"], d["jobs"], d.get("numbers", {})) for d in client.call("decisions")["decisions"]]
            if any(k == "stop" for k, _, _ in kinds) and any(k == "measured" for k, _, _ in kinds):
                break
            time.sleep(1)
        measured = [n for k, _, n in kinds if k == "measured"]
        stopped = [j for k, j, _ in kinds if k == "stop"]
        print("unsized_gpu: decisions:", [k for k, _, _ in kinds])
        ok = bool(measured) and (2 << 30) <= measured[0].get("mem", 0) < nvml_gpus()[0].mem_total and bool(stopped)
        print(f"unsized_gpu: measured {measured[:1]}, stopped {stopped[:1]}: {'ok' if ok else 'FAILED'}")
        return 0 if ok else 1
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGKILL)
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
