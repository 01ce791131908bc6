"""gmux-scheduler: a job belongs to the client key that submitted it; another user's key cannot kill or move it,
an admin's can. Real CurveZMQ sockets, a real scheduler loop (in a thread), keys made by gmux.wire.keys."""
import threading

import pytest

from gmux.cluster.scheduler.service import Options, Scheduler
from gmux.wire import keys
from gmux.wire.scheduler_client import ClusterClient, ClusterError


@pytest.fixture
def scheduler(tmp_path):
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    for who in ("alice", "bob", "ops"):
        keys.create(keydir, "client", who)
    s = Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*", admins=("ops",)))
    stop = threading.Event()
    t = threading.Thread(target=s.serve, kwargs={"until": stop.is_set}, daemon=True)
    t.start()
    clients = []

    def client(who):
        c = ClusterClient(s.endpoint, keydir, who, timeout=10.0)
        clients.append(c)
        return c
    yield s, client
    for c in clients:
        c.close()
    stop.set()
    t.join(10)


def test_the_cluster_table_says_when_no_machine_has_joined(scheduler, tmp_path, capsys):
    """Its first line ended in "machines: " and nothing after it."""
    from gmux.cli.gmux import main as gmux_main
    s, _ = scheduler
    assert gmux_main(["ps", "--cluster", s.endpoint, "--keys", str(tmp_path / "keys"), "--as", "alice"]) == 0
    assert capsys.readouterr().out.startswith("policy gmux; machines: none has joined\n")


def test_only_the_owner_or_an_admin_acts_on_a_job(scheduler):
    s, client = scheduler
    alice, bob, ops = client("alice"), client("bob"), client("ops")
    a1 = alice.call("c_submit", argv=["python", "t.py"], cwd="/")["cjob"]
    a2 = alice.call("c_submit", argv=["python", "t.py"], cwd="/")["cjob"]
    with pytest.raises(ClusterError, match=f"{a1} belongs to alice, not to bob"):
        bob.call("c_kill", cjob=a1)
    with pytest.raises(ClusterError, match="belongs to alice"):
        bob.call("c_kill", cjob=a2)
    jobs = {j["cjob"]: j for j in bob.call("c_ps")["jobs"]}
    assert jobs[a1]["owner"] == "alice" and jobs[a1]["state"] == "pending"     # the refusal changed nothing
    assert jobs[a2]["state"] == "pending"
    assert alice.call("c_kill", cjob=a1) == {"cjob": a1}
    assert ops.call("c_kill", cjob=a2) == {"cjob": a2}
    states = {j["cjob"]: j["state"] for j in alice.call("c_ps")["jobs"]}
    assert states == {a1: "killed", a2: "killed"}


def test_a_link_beside_a_system_daemon_is_refused(tmp_path):
    # gmuxd --system --scheduler is refused; so is the link started on its own beside a system daemon (it would
    # start users' jobs and read their checkpoints as root), before it opens a socket.
    import subprocess
    import sys
    from cluster_harness import ROOT, env
    from gmux.node.cluster_link import ClusterLink
    from gmux.rundir import RuntimeDirError
    (tmp_path / "run" / "users").mkdir(parents=True)
    with pytest.raises(RuntimeDirError, match="system daemon's: cluster mode is not supported"):
        ClusterLink(str(tmp_path / "run"), "m1", "tcp://127.0.0.1:1", str(tmp_path / "keys"))
    r = subprocess.run([sys.executable, "-m", "gmux.cli.cluster_link", "--runtime-dir", str(tmp_path / "run"),
                        "--name", "m1", "--scheduler", "tcp://127.0.0.1:1", "--keys", str(tmp_path / "keys")],
                       env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cluster mode is not supported" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args,said", [(["--scheduler", "nope"], "--scheduler: 'nope' is not tcp://HOST:PORT"),
                                       (["--listen", "garbage"], "--listen: 'garbage' is not tcp://HOST:PORT"),
                                       (["--name", "../m1"], "--name: key name '../m1': use letters, digits")])
def test_a_link_started_on_its_own_refuses_a_bad_argument_as_a_usage_error(tmp_path, capsys, args, said):
    """Each ended in a traceback from ZeroMQ or the key loader, after the link had begun to start."""
    from gmux.cli.cluster_link import main
    with pytest.raises(SystemExit) as e:
        main(["--runtime-dir", str(tmp_path / "run"), "--name", "m1", "--scheduler", "tcp://127.0.0.1:1",
              "--keys", str(tmp_path / "keys"), *args])
    assert e.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_link_whose_key_is_missing_says_so_without_a_traceback(tmp_path):
    import subprocess
    import sys
    from cluster_harness import ROOT, env
    keys.create_all(str(tmp_path / "keys"), [("scheduler", None), ("daemon", "m1")])
    r = subprocess.run([sys.executable, "-m", "gmux.cli.cluster_link", "--runtime-dir", str(tmp_path / "run"),
                        "--name", "m2", "--scheduler", "tcp://127.0.0.1:1", "--keys", str(tmp_path / "keys")],
                       env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"gmux-cluster-link: no key file {tmp_path / 'keys' / 'daemon.m2.pub'}")


def test_a_link_started_before_its_gmuxd_makes_the_runtime_directory_private_and_gmuxd_takes_it(tmp_path):
    """The link made the directory with the default mode (0755) and its logs in it: gmuxd, started after, refused
    it as open to others and not empty."""
    from gmux.node.cluster_link import ClusterLink
    from gmux.rundir import RuntimeDir
    keys.create_all(str(tmp_path / "keys"), [("scheduler", None), ("daemon", "m1")])
    run = tmp_path / "run"
    link = ClusterLink(str(run), "m1", "tcp://127.0.0.1:1", str(tmp_path / "keys"))
    try:
        link.warm.fill()        # (what its loop does first: the warm interpreters' log goes in logs/)
        assert (run / "logs" / "warm.log").exists()
        assert {p.name: oct(p.stat().st_mode & 0o777) for p in (run, run / "logs")} == \
            {"run": "0o700", "logs": "0o700"}
        RuntimeDir(str(run)).create()       # (gmuxd's start)
    finally:
        link.close()
