"""Fixtures for cluster-mode tests: a real gmux-scheduler process and real gmuxd processes (each with its
cluster link), on loopback TCP with CurveZMQ keys made for the test, virtual GPUs, real training jobs."""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping

import pytest

# Re-exported to the tests of this folder.
from gmux_testkit import PY, ROOT, TRAIN, env, kill_jobs_under, paced, start_py, unpace, wait_for  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proxy_util import Proxy  # noqa: E402



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawned(tmp_path, machine: str, cjob: str, timeout: float = 60) -> int:
    """The pid of the job's new process on `machine`, from gmuxd's log as it spawns it: seconds before the process
    registers (gmuxd's record of it has no pid until then, and then it may be ready within milliseconds)."""
    log = tmp_path / f"gmuxd-{machine}.log"
    found = wait_for(lambda: re.search(rf"started {cjob} \(pids \[(\d+)\]", log.read_text()), timeout,
                     f"the job's new process spawned on {machine}")
    return int(found.group(1))


class Solo(Mapping):
    """The same script run plainly, never interrupted: the reference for bit-identity. It runs beside the
    cluster (most of a cluster test waits on paced training); reading its result waits for it to end."""

    def __init__(self, tmp_path, name: str, *args: str):
        self._out = tmp_path / f"solo-{name}.json"
        self._proc = start_py(TRAIN, str(self._out), *args)
        self._result = None

    def _read(self) -> dict:
        if self._result is None:
            assert self._proc.wait(300) == 0, f"the reference run {self._out.name} failed"
            self._result = json.loads(self._out.read_text())
        return self._result

    def __getitem__(self, key):
        return self._read()[key]

    def __iter__(self):
        return iter(self._read())

    def __len__(self):
        return len(self._read())


class Cluster:
    def __init__(self, tmp_path, machines=("m1", "m2", "m3"), policy="gandiva", gpus="2x2GiB", sched_args=(),
                 daemon_args=(), warm=False, proxied=False, sched_files=None):
        """proxied: each machine's link reaches the scheduler through its own Proxy (self.proxies), which a test
        can sever (a network partition); sched_files: (soft, hard) limits on the scheduler's open files."""
        from gmux.wire import keys
        self.tmp = tmp_path
        self.keys = str(tmp_path / "keys")
        keys.create(self.keys, "scheduler")
        keys.create(self.keys, "client", "tester")
        for m in machines:
            keys.create(self.keys, "daemon", m)
        self.port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        # gmuxd keeps a warm interpreter per machine by default; the tests whose point is not a move's total
        # leave it out: on 2 cores every idle one's torch import slows the rest of the suite.
        self.policy, self.gpus, self.sched_args, self.sched_files = policy, gpus, list(sched_args), sched_files
        self.daemon_args = (["--warm-starts", "1" if warm else "0"] if "--warm-starts" not in daemon_args else []) \
            + list(daemon_args)
        self.daemons: dict[str, subprocess.Popen] = {}
        self.sched = None
        self.start_scheduler()
        self.proxies = {m: Proxy(self.port) for m in machines} if proxied else {}
        for m in machines:
            self.start_daemon(m, f"tcp://127.0.0.1:{self.proxies[m].port}" if proxied else None)

    def start_scheduler(self) -> None:
        log = open(self.tmp / "scheduler.log", "ab")
        self.sched = subprocess.Popen([PY, "-m", "gmux.cli.scheduler", "--listen", self.endpoint, "--keys", self.keys,
                                       "--state", str(self.tmp / "sched"), "--policy", self.policy, "--tick", "0.5",
                                       *self.sched_args], env=env(), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                      preexec_fn=self.sched_files and (
                                          lambda: resource.setrlimit(resource.RLIMIT_NOFILE, self.sched_files)))
        wait_for(lambda: self._ps_ok(), 20, "gmux-scheduler did not come up")

    def start_daemon(self, m: str, scheduler: str | None = None) -> None:
        """`scheduler`: the endpoint its link reaches the scheduler at (a proxy a test can cut), if not its own."""
        log = open(self.tmp / f"gmuxd-{m}.log", "ab")
        self.daemons[m] = subprocess.Popen(
            [PY, "-m", "gmux.cli.gmuxd", "--runtime-dir", str(self.tmp / f"rt-{m}"), "--virtual-gpus", self.gpus,
             "--quantum", "2", "--scheduler", scheduler or self.endpoint, "--keys", self.keys, "--name", m, *self.daemon_args],
            env=env(), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def wait_machines(self, n: int, timeout: float = 30) -> None:
        wait_for(lambda: sum(x["state"] == "up" for x in self.ps()["machines"]) >= n, timeout, f"{n} machines up")

    def _ps_ok(self) -> bool:
        try:
            self.ps(timeout=0.5)
            return True
        except Exception:
            return False

    def client(self, timeout=10.0):
        from gmux.wire.scheduler_client import ClusterClient
        return ClusterClient(self.endpoint, self.keys, "tester", timeout=timeout)

    def call(self, mtype, timeout=10.0, **fields):
        c = self.client(timeout)
        try:
            return c.call(mtype, **fields)
        finally:
            c.close()

    def ps(self, timeout=10.0) -> dict:
        return self.call("c_ps", timeout=timeout)

    def job(self, cjob: str) -> dict:
        return next(j for j in self.ps()["jobs"] if j["cjob"] == cjob)

    def submit(self, *args: str, ckpt_every=None, name=None) -> str:
        return self.call("c_submit", argv=[PY, TRAIN, *args, "--attach"], cwd=ROOT, env={"OMP_NUM_THREADS": "1"},
                         ckpt_every=ckpt_every, name=name)["cjob"]

    def wait_done(self, cjobs, timeout: float) -> dict:
        def check():
            jobs = {j["cjob"]: j for j in self.ps()["jobs"]}
            bad = [j for c, j in jobs.items() if c in cjobs and j["state"] in ("failed", "killed")]
            assert not bad, f"jobs ended badly: {bad}\n{self.logs()}"
            return all(jobs[c]["state"] == "done" for c in cjobs) and jobs
        return wait_for(check, timeout, f"jobs {cjobs} done", every=0.5)

    def logs(self) -> str:
        out = []
        for f in sorted(self.tmp.glob("*.log")) + sorted(self.tmp.glob("rt-*/logs/*.log")):
            out.append(f"==== {f.name}\n" + f.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def kill_machine(self, m: str) -> None:
        """The machine dies: its gmuxd and every job process on it."""
        rt = self.tmp / f"rt-{m}"
        self.daemons[m].send_signal(signal.SIGKILL)
        self.daemons[m].wait()
        kill_jobs_under(rt)

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()
        for p in list(self.daemons.values()) + [self.sched]:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        kill_jobs_under(self.tmp)


@pytest.fixture
def cluster_factory(tmp_path):
    made = []

    def make(**kw):
        c = Cluster(tmp_path, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()
