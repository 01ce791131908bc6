"""Warm interpreters for the cluster starts on this machine (issue 15, item 3: a warm target).

Each start (a move's target, a restart, a fresh job) is one gmux-launch per rank. A cold one spends its first
seconds on the interpreter and `import torch` before the script even builds its model, and for a move that is
part of its total. The pool keeps `size` interpreters that did that ahead of time (gmux.cli.warm) and hands a
start to one of them; it starts the next only once that start is over, so that its import never competes with
the start it would speed up.

An interpreter takes on a start's environment after its own start, so a variable read *before* a script runs
must be the same: the interpreter's own (PYTHON*), the dynamic loader's (LD_*), the C library's (MALLOC_*,
GLIBC_*), the locale (LANG, LC_*), the OpenMP and BLAS runtimes torch loads at import (OMP_*, MKL_*, KMP_*,
GOMP_*, OPENBLAS_*), torch's and CUDA's own (TORCH*, PYTORCH_*, CUDA_*, NVIDIA_*), HOME (the user site
directory on sys.path) and TMPDIR (cached by the first tempfile call). A start whose environment differs from
the pool's in any of them gets a cold process; every other variable (PATH, a rendezvous, an API key) is read by
the script, after the warm interpreter has set it.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from typing import Mapping, Optional

log = logging.getLogger("gmux.cluster_link")

START_TIME_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "GLIBC_", "LC_", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_",
                       "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_")
START_TIME_NAMES = ("LANG", "LANGUAGE", "HOME", "TMPDIR")


def start_time_differences(warm: Mapping[str, str], start: Mapping[str, str]) -> list[str]:
    """The variables read before a script runs whose values differ between the two environments."""
    return sorted(k for k in set(warm) | set(start)
                  if (k.startswith(START_TIME_PREFIXES) or k in START_TIME_NAMES) and warm.get(k) != start.get(k))


class WarmPool:
    def __init__(self, runtime_dir: str, logs_dir: str, size: int = 1, env: Optional[Mapping[str, str]] = None):
        if size < 0:
            raise ValueError(f"a pool of {size} warm interpreters: give 0 or more")
        self.runtime_dir = runtime_dir  # the gmuxd its starts register with: on the command line, for ps
        self.logs = logs_dir
        self.size = size
        self.env = dict(os.environ if env is None else env)
        self.ready: list[subprocess.Popen] = []
        self.lock = threading.Lock()
        self.taken = 0                  # starts handed to a warm interpreter
        self.closed = False

    def fill(self) -> None:
        """Starts interpreters until `size` are alive (each imports torch in the background)."""
        with self.lock:
            self.ready = [p for p in self.ready if p.poll() is None]
            while not self.closed and len(self.ready) < self.size:
                try:
                    os.makedirs(self.logs, exist_ok=True)
                    with open(os.path.join(self.logs, "warm.log"), "ab") as out:
                        p = subprocess.Popen([sys.executable, "-m", "gmux.cli.warm", "--runtime-dir",
                                              self.runtime_dir], stdin=subprocess.PIPE, stdout=out,
                                             stderr=subprocess.STDOUT, cwd="/", env=self.env,
                                             start_new_session=True)
                except OSError as e:
                    log.warning("no warm interpreter: %s", e)
                    return
                self.ready.append(p)

    def take(self, argv: list, env: Mapping[str, str], cwd: Optional[str], log_path: str
             ) -> tuple[Optional[subprocess.Popen], str]:
        """A warm interpreter now running `gmux-launch ARGV` as a cold start would (in `cwd`, with `env`, its
        output appended to `log_path`); or None and why not, for a cold start instead."""
        differ = start_time_differences(self.env, env)
        if differ:
            return None, f"its environment differs from the warm interpreters' in {', '.join(differ[:4])}"
        with self.lock:
            alive = [p for p in self.ready if p.poll() is None]
            if not alive:
                self.ready = []
                return None, "no warm interpreter is ready"
            p, self.ready = alive[0], alive[1:]
        line = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd, "log": log_path}).encode() + b"\n"
        try:
            p.stdin.write(line)
            p.stdin.close()
        except OSError as e:                 # it died since: nothing of the start ran in it
            p.kill()
            p.wait()
            return None, f"the warm interpreter was gone ({e})"
        self.taken += 1
        return p, "warm"

    def close(self) -> None:
        """The link is closing: the unused interpreters end (they ran nothing)."""
        with self.lock:
            self.closed = True
            for p in self.ready:
                p.kill()
                p.wait()
            self.ready = []
