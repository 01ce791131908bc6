"""What a restarted gmuxd finds of its predecessor's jobs: the ended ones listed again, a lost or unreadable job
table said so, and a new job never given an id whose log is already on disk."""
import os
import subprocess
import sys

from node_harness import ask, register
from gmux.rundir import RuntimeDir


def _end(d, reg, status=0):
    ask(d, "bye", b"x", job=reg["job"], token=reg["token"], status=status)


def test_ended_jobs_are_listed_again_after_a_restart(daemon_factory, tmp_path):
    """`gmux ps` and `gmux logs j1` ("no job 'j1'") lost every ended job at any restart, even a clean one: only live
    jobs were loaded."""
    root = str(tmp_path / "rt")
    d = daemon_factory(root=root, keep_ended=2)
    regs = [register(d, f"j{k}".encode()) for k in range(4)]
    for reg in regs[:3]:
        _end(d, reg, status=3)
    d._flush(force=True)
    again = daemon_factory(root=root, keep_ended=2)
    ps = {j["id"]: j for j in ask(again, "ps", admin=again.admin)["data"]["jobs"]}
    # the newest two ended jobs (--keep-ended 2) and the live one; the oldest lives on in SQLite only
    assert set(ps) == {r["job"] for r in regs[1:]}
    assert [ps[r["job"]]["state"] for r in regs[1:]] == ["failed", "failed", "waiting"]
    again3 = daemon_factory(root=root, keep_ended=5)
    assert again3.jobs[regs[0]["job"]].exit_status == 3



def test_a_lost_job_table_gives_no_id_whose_log_is_on_disk_and_says_so(daemon_factory, tmp_path, caplog):
    """An emptied table restarted the ids at j1: a new job's output was appended to the log of a job the lost
    table had started (maybe still running)."""
    root = str(tmp_path / "rt")
    rt = RuntimeDir(root)
    os.makedirs(rt.logs(), mode=0o700)
    os.chmod(root, 0o700)
    for n in (3, 12):
        with open(rt.log_file(f"j{n}"), "w") as f:
            f.write("an earlier job's output\n")
    d = daemon_factory(root=root)
    assert register(d, b"a")["job"] == "j13"
    assert "the job table is empty but" in caplog.text and "jobs up to j12" in caplog.text


def test_an_unreadable_job_table_is_refused_naming_the_file_and_the_way_out(tmp_path):
    """A corrupt gmuxd.db gave a traceback naming no file ("file is not a database")."""
    root = str(tmp_path / "rt")
    os.makedirs(root, mode=0o700)
    with open(RuntimeDir(root).db, "wb") as f:
        f.write(b"this is no SQLite file, it was overwritten " * 200)
    out = subprocess.run([sys.executable, "-m", "gmux.cli.gmuxd", "--runtime-dir", root, "--virtual-gpus", "1x1GiB"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"{RuntimeDir(root).db}: gmuxd's job table cannot be read (file is not a database)" in out.stderr
    assert "move" in out.stderr and "aside" in out.stderr


def test_a_refused_job_uses_up_no_id(daemon_factory, tmp_path):
    """--gpus 3 on two GPUs, --mem beyond any GPU, --gpu 9: each refusal advanced the id counter (j2-j4 skipped)."""
    root = str(tmp_path / "rt")
    d = daemon_factory(root=root)
    assert register(d, b"a")["job"] == "j1"
    for fields in ({"gpus": 3}, {"mem": 1 << 50}, {"gpu": 9}):
        reply = ask(d, "register", b"r", pid=d.stand_in_pid, argv=["python", "t.py"], **fields)
        assert not reply["ok"], fields
    assert register(d, b"b")["job"] == "j2"
    d._flush(force=True)
    assert register(daemon_factory(root=root), b"c")["job"] == "j3"     # and the table agrees after a restart


def test_a_request_whose_gmuxd_dies_before_answering_fails_in_seconds(tmp_path):
    """gmux suspend to a gmuxd killed (-9) while the job's boundary was awaited waited its whole 130 s."""
    import threading
    import time

    import pytest
    import zmq

    from gmux.rundir import proc_starttime
    from gmux.wire.daemon_client import Client, GmuxError
    rt = RuntimeDir(str(tmp_path / "rt"))
    os.makedirs(rt.root, mode=0o700)
    silent = zmq.Context.instance().socket(zmq.ROUTER)     # takes the request, never answers
    silent.bind(rt.endpoint)
    stand_in = subprocess.Popen(["sleep", "600"])           # the gmuxd the pid file names
    try:
        with open(rt.pid_file, "w") as f:
            f.write(f"{stand_in.pid} {proc_starttime(stand_in.pid)}")
        client = Client(rt.root, timeout=5)
        threading.Timer(0.5, stand_in.kill).start()
        t0 = time.monotonic()
        with pytest.raises(GmuxError, match=rf"gmuxd \(pid {stand_in.pid}\) ended before it answered"):
            client.call("suspend", timeout=130, job="j1")
        assert time.monotonic() - t0 < 60      # (it waited all of its 130 s)
        client.close()
    finally:
        stand_in.kill()
        stand_in.wait()
        silent.close(0)
