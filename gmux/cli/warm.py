"""A warm interpreter for the next cluster start on this machine: `python -m gmux.cli.warm`.

A cold start's process spends its first seconds on the interpreter, `import torch` and, at the script's
first optimizer, `import torch._dynamo` (3 s together on this 2-core VM) before its first step; for a move's
target that is part of the move's total. A warm interpreter has done all of that before any start is known:
the first boundary of a small model's script came 0.11 s after its start, against 3.0 s cold.

It then waits for one start on its stdin, one JSON line: {"argv": gmux-launch's arguments, "env": the start's
environment, "cwd": its working directory, "log": the file its output goes to}, and becomes that gmux-launch in
this process (gmux.cli.launch). The pool (gmux.node.warm_pool) hands a start only to an interpreter whose
start-time environment is the start's.

Its stdin closed without a line (the pool is closing): it ends, having run nothing. A malformed line ends it
with status 2 and the reason on stderr, which the pool's log keeps.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

MAX_SPEC = 1 << 20


def _spec(line: bytes) -> dict:
    spec = json.loads(line)
    if not isinstance(spec, dict):
        raise ValueError("the start is not a JSON object")
    argv, env, cwd, log = spec.get("argv"), spec.get("env"), spec.get("cwd"), spec.get("log")
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv) and "--" in argv):
        raise ValueError("argv must be gmux-launch's arguments, strings, with -- before the command")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise ValueError("env must map strings to strings")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError("cwd must be a string or null")
    if not isinstance(log, str):
        raise ValueError("log must be a path")
    return spec


def _become(spec: dict) -> None:
    """This process as a cold start's would be at its first line: output to the log, its directory, its
    environment, its directory first on sys.path (`python -m` puts the start directory there)."""
    fd = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    started_in = os.getcwd()
    if spec["cwd"]:
        os.chdir(spec["cwd"])
    if sys.path and sys.path[0] == started_in:
        sys.path[0] = os.getcwd()
    os.environ.clear()
    os.environ.update(spec["env"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gmux.cli.warm", description="A warm interpreter for the next "
                                "cluster start (gmux.node.warm_pool starts it): it imports torch, then runs the "
                                "start given on its stdin as gmux-launch.")
    p.add_argument("--runtime-dir", help="the gmuxd whose starts it runs (for ps; the start's argv says it again)")
    p.parse_args(argv)
    from gmux.job import runner
    runner.warm_up()
    # Every torch.optim optimizer's constructor imports torch._dynamo on its first call: 1.5 s here, more than
    # the rest of torch, in every training script before its first step. A cold launcher leaves it to the
    # script (one that builds no optimizer never pays it); a warm interpreter has the time.
    try:
        importlib.import_module("torch._dynamo")
    except Exception:   # a torch without it (or broken in it): the script pays it, as in a cold start
        pass
    from gmux.cli import launch
    line = sys.stdin.buffer.readline(MAX_SPEC)
    if not line.strip():
        return 0
    try:
        spec = _spec(line)
    except ValueError as e:
        print(f"gmux warm interpreter: refused its start: {e}", file=sys.stderr)
        return 2
    _become(spec)
    sys.argv = ["gmux-launch", *spec["argv"]]
    return launch.main(spec["argv"])


if __name__ == "__main__":
    sys.exit(main())
