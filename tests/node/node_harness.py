"""Fixtures for gmuxd tests: a real daemon process on a private runtime dir, real job processes."""
from __future__ import annotations

import json
import os
import signal
import subprocess

import msgpack
import pytest

from gmux import protocol
from gmux.wire.daemon_client import Client, GmuxError
from gmux.node.daemon import Daemon, Options
from gmux.node.cuda_rebind import Unavailable
from gmux.node.inventory import Gpu
from gmux.rundir import RuntimeDir

# Re-exported to the tests of this folder.
from gmux_testkit import (PY, ROOT, TRAIN, env, jobs_under, kill_jobs_under, paced, start_py, unpace,  # noqa: F401
                          wait_for)


GiB = 1 << 30


class Node:
    """A gmuxd process and the jobs a test starts; everything is killed at teardown."""

    def __init__(self, tmp_path, *args: str):
        self.tmp = tmp_path
        self.rt = str(tmp_path / "rt")
        self.args = list(args)
        self.procs: list[subprocess.Popen] = []
        self.daemon = None
        self.start()

    def start(self) -> None:
        log = open(self.tmp / "gmuxd.log", "ab")
        self.daemon = subprocess.Popen([PY, "-m", "gmux.cli.gmuxd", "--runtime-dir", self.rt, *self.args],
                                       env=env(), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.wait_for(lambda: self._ping(), 20, "gmuxd did not come up")

    def _ping(self) -> bool:
        try:
            c = Client(self.rt, timeout=0.5)
            try:
                c.call("ping")
                return True
            finally:
                c.close()
        except GmuxError:
            return False

    def call(self, mtype: str, **fields):
        c = Client(self.rt, timeout=30)
        try:
            return c.call(mtype, timeout=30, **fields)
        finally:
            c.close()

    def ps(self) -> dict:
        return self.call("ps", all=True)

    def job(self, job_id: str) -> dict:
        return next(j for j in self.ps()["jobs"] if j["id"] == job_id)

    def launch(self, *script_args: str, opts=(), log_name=None) -> subprocess.Popen:
        log = open(self.tmp / (log_name or f"launch{len(self.procs)}.log"), "ab")
        p = subprocess.Popen([PY, "-m", "gmux.cli.launch", "--runtime-dir", self.rt, *opts, "--", "python",
                              *script_args], env=env(), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def job_of(self, pid: int, timeout: float = 60) -> str:
        # (60 s: with Trainer jobs importing their frameworks beside it on 2 cores, a plain job once took over 20)
        found = []
        self.wait_for(lambda: found.extend(j["id"] for j in self.ps()["jobs"] if j["pid"] == pid) or found,
                      timeout, f"no job registered by pid {pid}")
        return found[0]

    @staticmethod
    def wait_for(cond, timeout: float, what: str, every: float = 0.1):
        return wait_for(cond, timeout, what, every)

    def kill_daemon(self, sig=signal.SIGKILL) -> None:
        self.daemon.send_signal(sig)
        self.daemon.wait(10)

    def close(self) -> None:
        # Jobs gmuxd spawned itself (`gmux submit`) run in their own sessions and outlive it: end them too.
        try:
            pids = [j["pid"] for j in self.ps()["jobs"] if j.get("pid") and j["state"] not in ("exited", "failed",
                                                                                           "killed", "lost")]
        except Exception:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        # Everything is killed first, then reaped: on a loaded machine one exit can take seconds (CI once took
        # more than 10 s to reap a launcher), and each wait would otherwise add to the next.
        left = [p for p in (*self.procs, self.daemon) if p is not None and p.poll() is None]
        for p in left:
            p.kill()
        for p in left:
            p.wait(60)
        kill_jobs_under(self.tmp)    # those of a gmuxd that a test killed, which ps above could not list
        # gmuxd goes on from a bug in a part of its tick (gmux.util.faults) and only logs it: seen here, it fails
        log = self.tmp / "gmuxd.log"
        errors = [line for line in log.read_text(errors="replace").splitlines()
                  if "internal error" in line] if log.exists() else []
        assert not errors, "gmuxd met internal errors:\n" + "\n".join(errors[:5])

    def log(self) -> str:
        return (self.tmp / "gmuxd.log").read_text()


@pytest.fixture
def node_factory(tmp_path):
    nodes = []

    def make(*args):
        n = Node(tmp_path, *args)
        nodes.append(n)
        return n
    yield make
    for n in nodes:
        n.close()


def result(path) -> dict:
    with open(path) as f:
        return json.load(f)


# --- a daemon in this process (its socket real, its replies captured): fast tests of message handling ---
@pytest.fixture
def daemon_factory(tmp_path):
    """make(sizes) -> a Daemon on virtual GPUs of these sizes whose sends are recorded in d.sent."""
    made = []
    # Jobs registered here carry the pid of a throwaway process: a fuzzed "kill" must never hit pytest itself.
    stand_in = subprocess.Popen(["sleep", "600"])

    def make(sizes=(16 * GiB, 16 * GiB), root=None, virtual=True, rebind=None, load_driver=None, **options):
        """root: a runtime dir used before (a restarted daemon); virtual=False: GPUs as NVML would list them
        (their inventory only: nothing here touches a device); rebind: a stand-in for the CUDA driver's
        checkpoint API (gmuxd --rebind-gpus); load_driver: what gmuxd without it gets when it asks for the
        driver (default: Unavailable, as on a machine without one)."""
        for before in made:     # its predecessor there is gone: the kernel closes a dead process's socket
            if root is not None and before.rundir.root == root and not before.server.sock.closed:
                before.server.sock.close(linger=0)
        if root is not None:    # (ZeroMQ closes it in its I/O thread: a moment later)
            wait_for(lambda: not RuntimeDir(root).socket_answers(), 10, f"{root}: the socket closed", every=0.01)
        gpus = [Gpu(i, "virtual", size, True) if virtual else
                Gpu(i, "GPU", size, False, f"GPU-{i:08x}-0000-4000-8000-{i:012x}") for i, size in enumerate(sizes)]
        d = Daemon(RuntimeDir(root or str(tmp_path / f"rt{len(made)}")), gpus, Options(**{"quantum": 1.0, **options}),
                   rebind=rebind, load_driver=load_driver or no_driver)
        d.sent = []
        d.server.send = lambda identity, frame: d.sent.append((identity, msgpack.unpackb(frame))) or True
        d.stand_in_pid = stand_in.pid
        made.append(d)
        return d
    yield make
    for d in made:
        if not d.server.sock.closed:   # (a test of a restart closed it already)
            d.close()
    stand_in.kill()
    stand_in.wait()
    # A bug in a part of the tick is counted and gone on from (gmux.util.faults): unseen unless looked for.
    # A test that breaks a part on purpose sets d.expected_internal_errors.
    for d in made:
        assert d.internal_errors == getattr(d, "expected_internal_errors", 0), \
            f"the daemon met {d.internal_errors} internal error(s); its log has each"


def no_driver():
    raise Unavailable("no CUDA driver here (a test)")


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory()


def ask(d, mtype, identity=b"c", **fields):
    d.sent.clear()
    d.server.receive(identity, [protocol.encode(mtype, 5, **fields)])
    replies = [m for i, m in d.sent if m["type"] == "reply" and i == identity]
    assert len(replies) <= 1
    return replies[0] if replies else None


def register(d, identity=b"job-a", argv=("python", "t.py"), **kw):
    r = ask(d, "register", identity, **{"pid": d.stand_in_pid, "argv": list(argv), **kw})
    assert r["ok"], r
    return r["data"]


