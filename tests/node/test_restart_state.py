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


def test_a_submit_that_cannot_start_leaves_no_log_behind(daemon, tmp_path):
    """A refused submit (a cwd that does not exist) left an empty log, which the next job given its id appended
    to, and which a gmuxd whose table was lost took for a job's."""
    import os
    r = ask(daemon, "submit", admin=daemon.admin, argv=["python", "t.py"], cwd=str(tmp_path / "gone"))
    assert not r["ok"] and f"cannot run the job in {str(tmp_path / 'gone')!r}: No such file or directory" \
        in r["error"], r
    assert os.listdir(daemon.rundir.logs()) == []
    target = tmp_path / "theirs"
    target.write_text("untouched\n")
    os.symlink(target, daemon.rundir.log_file("j1"))     # planted where the next job's log goes
    r = ask(daemon, "submit", admin=daemon.admin, argv=["python", "t.py"], cwd=str(tmp_path))
    assert not r["ok"] and r["error"].endswith("j1.log: it is a symbolic link, which gmuxd writes no log through"), r
    assert target.read_text() == "untouched\n"


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


def _lost(daemon_factory, tmp_path):
    """A gmuxd that knows nothing of j7, a job its predecessor started (its table lost)."""
    return daemon_factory(sizes=(1 << 30, 1 << 30), root=str(tmp_path / "rt"))


def test_a_message_of_a_job_gmuxd_does_not_know_says_so_and_a_wrong_token_does_not(daemon_factory, tmp_path):
    d = _lost(daemon_factory, tmp_path)
    r = ask(d, "heartbeat", b"x", job="j7", token="t" * 32, state="running")
    assert not r["ok"] and r.get("unknown") is True and "unknown job 'j7'" in r["error"], r
    reg = register(d, b"a")
    r = ask(d, "heartbeat", b"x", job=reg["job"], token="t" * 32, state="running")
    assert not r["ok"] and "unknown" not in r and "wrong token" in r["error"], r    # someone else's id: no adoption


def test_a_running_job_is_adopted_on_the_gpu_it_runs_on_and_new_ids_pass_it(daemon_factory, tmp_path):
    d = _lost(daemon_factory, tmp_path)
    data = register(d, b"x", job="j7", token="t" * 32, adopt="running", on_gpu=1, mem=100 << 20, name="mine")
    assert (data["job"], data["token"], data["gpu"], data["name"]) == ("j7", "t" * 32, 1, "mine")
    job = d.jobs["j7"]
    assert (job.state, job.started, job.pid) == ("running", True, d.stand_in_pid)
    assert "j7" in d.slicers[1].entries and "j7" in d.slicers[1].resident
    assert [dd["kind"] for dd in d.decisions][-1] == "adopted"
    assert register(d, b"y", job="j7", token="t" * 32, adopt="running", on_gpu=1)["job"] == "j7"   # once only
    assert len(d.slicers[1].entries) == 1
    assert register(d, b"z")["job"] == "j8"
    r = ask(d, "heartbeat", b"x", job="j7", token="t" * 32, state="running")
    assert r["ok"], r


def test_a_job_that_had_not_started_is_adopted_into_the_queue_as_it_was(daemon_factory, tmp_path):
    d = _lost(daemon_factory, tmp_path)
    register(d, b"x", job="j7", token="t" * 32, adopt="waiting", mem=100 << 20)
    job = d.jobs["j7"]
    assert (job.started, job.state, job.gpu) == (False, "waiting", 0)
    assert "j7" in d.slicers[0].entries and "j7" not in d.slicers[0].resident    # its start is its turn


def test_what_cannot_be_adopted_is_refused_with_the_reason_and_nothing_changes(daemon_factory, tmp_path):
    d = _lost(daemon_factory, tmp_path)
    for fields, why in (({"job": "x7"}, "is not a job id this gmuxd gives"),
                        ({"job": "j0"}, "is not a job id this gmuxd gives"),
                        ({"job": "j7", "token": None}, "is not a job id this gmuxd gives"),
                        ({"gpus": 2}, "a job of several GPUs or a gang rank cannot be taken back"),
                        ({"gang": {"id": "g", "rank": 0, "size": 2}}, "cannot be taken back"),
                        ({"on_gpu": 5}, "runs on GPU 5, which this gmuxd does not have (it has 0, 1)")):
        msg = {"job": "j7", "token": "t" * 32, "adopt": "running", "on_gpu": 0, **fields}
        r = ask(d, "register", b"x", pid=d.stand_in_pid, argv=["python", "t.py"], **msg)
        assert not r["ok"] and why in r["error"], (fields, r)
        assert not d.jobs and all(not s.entries for s in d.slicers.values())
    assert register(d, b"z")["job"] == "j1"          # a refused claim moves no id
    r = ask(d, "register", b"x", pid=d.stand_in_pid, argv=["python", "t.py"], job="j1", token="u" * 32,
            adopt="running", on_gpu=0)
    assert not r["ok"] and "is another process's" in r["error"], r     # a known job is not taken over


def test_a_claim_cannot_take_a_gpu_held_for_a_gang_and_an_adopted_id_holds_across_restarts(daemon_factory, tmp_path):
    """Adoption skipped admission: a claim (any user's, in a system gmuxd) could sit on GPUs held for another's
    multi-GPU job. And the id it moved the counter past was written only at the next flush."""
    d = _lost(daemon_factory, tmp_path)
    wide = register(d, b"w", gpus=2)["job"]
    d.tick()
    assert sorted(d.jobs[wide].exclusive_gpus) == [0, 1]
    r = ask(d, "register", b"x", pid=d.stand_in_pid, argv=["python", "t.py"], job="j7", token="t" * 32,
            adopt="running", on_gpu=0)
    assert not r["ok"] and f"GPU 0 is held by {wide} (a job on 2 GPUs) to itself" in r["error"], r
    assert "j7" not in d.jobs and d.store.mark() == "j2"
    register(d, b"y", job="j9", token="t" * 32, adopt="suspended", on_gpu=None)      # (not started: queued)
    again = daemon_factory(sizes=(1 << 30, 1 << 30), root=str(tmp_path / "rt"))     # no flush in between
    assert again.store.mark() == "j10"


def test_an_ended_job_gmuxd_no_longer_keeps_in_memory_cannot_be_claimed(daemon_factory, tmp_path):
    """Its row stays in SQLite for --retain-ended days: a claim of its id would have overwritten it (another user's
    record, in a system gmuxd)."""
    d = daemon_factory(root=str(tmp_path / "rt"), keep_ended=1)
    regs = [register(d, f"j{k}".encode()) for k in range(3)]
    for reg in regs:
        _end(d, reg)
    d._flush(force=True)
    d.tick()
    old = regs[0]["job"]
    assert old not in d.jobs and d.store.holds(old)
    r = ask(d, "register", b"x", pid=d.stand_in_pid, argv=["python", "t.py"], job=old, token="t" * 32,
            adopt="running", on_gpu=0)
    assert not r["ok"] and "has a record of" in r["error"], r
    assert not d.store.holds("j99") and old not in d.jobs


def test_a_process_gmuxd_started_for_several_gpus_or_as_a_rank_is_not_offered(monkeypatch):
    from gmux.job.agent import not_alone
    assert not_alone({"gpus": 1}) is None
    assert "several GPUs" in not_alone({"gpus": 2})
    monkeypatch.setenv("WORLD_SIZE", "4")      # (a rank gmux submit --ranks started: its rendezvous environment)
    assert "gang rank" in not_alone({"gpus": 1})


def test_a_request_gmuxd_does_not_answer_is_told_apart_from_a_refusal(tmp_path):
    """gmux submit says that a submit gmuxd took but did not answer in time may have started the job (an outside
    operator's 32 submits at once: 6 said 'try again', and all 32 ran): the client raises its own kind of error."""
    import pytest
    import zmq

    from gmux.rundir import proc_starttime
    from gmux.wire.daemon_client import Client, GmuxUnanswered
    rt = RuntimeDir(str(tmp_path / "rt"))
    os.makedirs(rt.root, mode=0o700)
    silent = zmq.Context.instance().socket(zmq.ROUTER)     # takes the request, never answers
    silent.bind(rt.endpoint)
    stand_in = subprocess.Popen(["sleep", "600"])           # a busy gmuxd, alive
    try:
        with open(rt.pid_file, "w") as f:
            f.write(f"{stand_in.pid} {proc_starttime(stand_in.pid)}")
        client = Client(rt.root)
        with pytest.raises(GmuxUnanswered, match="is running but did not answer"):
            client.call("ping", timeout=0.3)
        client.close()
    finally:
        stand_in.kill()
        stand_in.wait()
        silent.close(0)


def test_a_claim_of_an_id_the_table_never_gave_moves_no_id(daemon_factory, tmp_path):
    """Any user of a system gmuxd could claim j999999999: every later id was 10 digits, past what adoption took
    back. Ids are believed only where gmuxd started without a table, and below a bound even there."""
    d = daemon_factory(root=str(tmp_path / "rt"))
    first = register(d, b"a")["job"]
    again = daemon_factory(root=str(tmp_path / "rt"))          # its table kept: it knows which ids it gave
    for claim in ("j999999999", "j2"):
        r = ask(again, "register", b"x", pid=again.stand_in_pid, argv=["python", "t.py"], job=claim, token="t" * 32,
                adopt="running", on_gpu=0)
        assert not r["ok"] and f"{claim} is an id this gmuxd never gave (its table was not lost, and its next id " \
                                "is j2)" in r["error"], r
    assert first == "j1" and again.store.mark() == "j2" and register(again, b"b")["job"] == "j2"
    lost = _lost(daemon_factory, tmp_path / "other")
    r = ask(lost, "register", b"x", pid=lost.stand_in_pid, argv=["python", "t.py"], job="j1000000000000",
            token="t" * 32, adopt="running", on_gpu=0)
    assert not r["ok"] and "is past any id a gmuxd gives" in r["error"] and lost.store.mark() == "j1", r


def test_a_gmuxd_restarted_with_fewer_gpus_takes_back_a_job_on_one_it_lacks(daemon_factory, tmp_path):
    """gmuxd restarted with fewer virtual GPUs (`--virtual-gpus 1x1GiB` after 2x1GiB) while a job ran on GPU 1
    died at start with a KeyError traceback from the re-attachment's rebind check (moves.recover), and could not
    be started again on that runtime dir; the job is taken back onto a GPU it has, as recover() intends."""
    root = str(tmp_path / "rt")
    d = daemon_factory(sizes=(1 << 30, 1 << 30), root=root)
    reg = register(d, b"a", gpu=1)
    assert d.jobs[reg["job"]].gpu == 1
    d._flush(force=True)
    again = daemon_factory(sizes=(1 << 30,), root=root)
    job = again.jobs[reg["job"]]
    assert not job.final and job.gpu == 0
