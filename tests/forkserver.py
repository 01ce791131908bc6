"""Reference runs forked from a warm interpreter, so the suite spends its CPU on what it tests.

On this 2-core VM a new training process spends about 4.5 s of CPU before its first step: the interpreter,
`import torch`, and `import torch._dynamo`, which every torch.optim optimizer's constructor triggers. The suite
starts about a hundred plain processes (the uninterrupted references that gmux's runs are compared with, and
the in-process suspend tests), a quarter of its CPU. A server per pytest worker pays that import once; each
run is a fresh process forked from it, running its script as `python` would (its argv, cwd, environment,
sys.path[0], __main__), with its own output files and exit status.

Only what cannot differ from a cold start is shared: a request whose environment changes anything read at
import time (thread counts, PYTHON*, torch's own variables) starts cold, as does everything when the server
cannot start. Jobs under gmux are never forked from here: their start is part of what the tests test.

The server side runs as `python tests/forkserver.py`; requests and exits travel as JSON lines on its pipes.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

# Read at import by python, torch or their libraries: a request must match the server on every one of these.
_IMPORT_TIME = ("OMP_", "MKL_", "KMP_", "OPENBLAS_", "PYTHON", "TORCH", "PYTORCH_", "CUDA", "LD_")


# Set in a pytest worker by a library a test imported there, and read by torch only when it is called, never at
# import: a child, whose environment is the request's, reads it as a process started cold would.
# (lightning.fabric sets PYTORCH_NVML_BASED_CUDA_CHECK=1 at its import; torch.cuda's availability check reads it.)
_READ_WHEN_CALLED = ("PYTORCH_NVML_BASED_CUDA_CHECK",)


def _import_time(environ: dict) -> dict:
    return {k: v for k, v in environ.items() if k.startswith(_IMPORT_TIME) and k not in _READ_WHEN_CALLED}


# ---------------------------------------------------------------------------------------------- server side
def _run_child(req: dict) -> None:
    """In the forked child: become `python ARGV` and never return."""
    code = 1
    try:
        try:
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), 1)
            if req["stderr"]:                           # else the server's: the pytest worker's stderr
                os.dup2(os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), 2)
        except OSError as e:                            # said where the worker will see it, with its exit status
            os.write(2, f"forkserver: {req['argv']}: its output: {e}\n".encode())
            code = 125
            raise
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        import random
        random.seed()                                   # the server's state would be every child's
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        import runpy
        argv = req["argv"]
        try:
            if argv[0] == "-c":
                sys.argv = ["-c", *argv[2:]]
                sys.path[0] = ""
                exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
            elif argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]
                sys.path[0] = os.getcwd()
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        import atexit
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    import select
    shared = _import_time(dict(os.environ))             # before torch adds its own (TORCHINDUCTOR_CACHE_DIR)
    import torch
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)     # pulls in torch._dynamo
    # What torch set for itself, as any process's first optimizer sets it (TORCHINDUCTOR_CACHE_DIR, its default):
    # a pytest worker that has built an optimizer since this server started carries it too, with the value this
    # server's children already have.
    own = {k: v for k, v in _import_time(dict(os.environ)).items() if shared.get(k) != v}
    out = os.fdopen(os.dup(1), "w", buffering=1)
    children = set()

    def tell(msg: dict) -> None:
        out.write(json.dumps(msg) + "\n")

    tell({"ready": shared, "own": own})
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.05 if children else 1.0)
        if readable:
            data = os.read(0, 1 << 16)
            if not data:
                return                                   # the pytest worker has gone: its children stay theirs
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                req = json.loads(line)
                if "signal" in req:                      # only to a child not yet reaped: its pid is still its own
                    if req["pid"] in children:
                        os.kill(req["pid"], req["signal"])
                    continue
                pid = os.fork()
                if pid == 0:
                    out.close()
                    _run_child(req)
                children.add(pid)
                tell({"id": req["id"], "pid": pid})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                tell({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})


# ---------------------------------------------------------------------------------------------- client side
class Forked:
    """The part of subprocess.Popen that the tests use, for a process the server forked. Its exit status is its
    own, never looked up by pid: the suite starts more processes than pid_max (32768) numbers, so a pid comes
    back, and a new child given a reused pid once took its predecessor's exit for its own (its test read its
    output before it was written)."""

    def __init__(self, server: "Server", pid: int, args: list):
        self._server, self.pid, self.args = server, pid, args
        self.returncode = None

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._server.cond:
            while self.returncode is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                if not self._server.alive:
                    raise RuntimeError(f"the fork server died before {self.args} ended")
                self._server.cond.wait(1.0 if left is None else min(left, 1.0))
        return self.returncode

    def send_signal(self, sig) -> None:
        self._server.signal(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Server:
    def __init__(self, python: str, environ: dict, cwd: str):
        self.proc = subprocess.Popen([python, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=environ, cwd=cwd)
        self.cond = threading.Condition()
        self.asked: dict[int, list] = {}          # request id -> argv, until the server says which pid it got
        self.started: dict[int, Forked] = {}      # request id -> its process, until spawn() takes it
        self.running: dict[int, Forked] = {}      # pid -> the process that holds it now
        self.alive = True
        self._next = 0
        ready = json.loads(self.proc.stdout.readline() or b"{}")
        self.shared = ready.get("ready")
        self.own = ready.get("own") or {}         # set by the server's torch itself, to these values
        if self.shared is None:
            raise RuntimeError("the fork server did not start")
        threading.Thread(target=self._listen, daemon=True, name="forkserver").start()

    def _listen(self) -> None:
        # One pipe carries both messages in order: a child's start always comes before its exit.
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.cond:
                if "returncode" in msg:
                    self.running.pop(msg["pid"]).returncode = msg["returncode"]
                else:
                    child = Forked(self, msg["pid"], self.asked.pop(msg["id"]))
                    self.running[child.pid] = self.started[msg["id"]] = child
                self.cond.notify_all()
        with self.cond:
            self.alive = False
            self.cond.notify_all()

    def signal(self, pid: int, sig: int) -> None:
        """Sent by the server, which knows whether the pid is still its child's (a pid is free again once the
        server has reaped it, before its exit reaches this side)."""
        with self.cond:
            if self.alive:
                try:
                    return self._send({"signal": int(sig), "pid": pid})
                except BrokenPipeError:
                    pass
            if self.running.get(pid) is not None:       # (its children live on without it: sent from here)
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    def _send(self, msg: dict) -> None:
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def fits(self, environ: dict) -> bool:
        """Whether a child forked from the server starts as `python` would in `environ`: every variable read at
        import matches, but for one the server's torch set itself to the value the request carries (a worker
        that has built an optimizer since the server started: else every later start of that worker is cold)."""
        asked = {k: v for k, v in _import_time(environ).items() if self.own.get(k) != v or k in self.shared}
        return self.alive and asked == self.shared

    def spawn(self, argv: list, environ: dict, cwd: str, stdout: str | None, stderr: str | None) -> Forked:
        with self.cond:
            self._next += 1
            rid = self._next
            self.asked[rid] = argv
            self._send({"id": rid, "argv": argv, "env": environ, "cwd": cwd, "stdout": stdout, "stderr": stderr})
            while rid not in self.started:
                if not self.alive:
                    raise RuntimeError("the fork server died")
                self.cond.wait(1.0)
            return self.started.pop(rid)


if __name__ == "__main__":
    serve()
