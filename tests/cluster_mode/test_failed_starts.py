"""A start that fails before gmux-launch registers with gmuxd (a --mem no GPU of the machine has, a checkpoint it
cannot read) is told to the scheduler at once, with what gmux-launch said, instead of being waited for and sent
again every 30 s for ever; a gang's other ranks, waiting for the one that failed, are stopped; a job whose start
fails three times in a row is held, saying why."""
import os
import subprocess
import sys

from cluster_harness import PY, ROOT, wait_for

from gmux.node.cluster_starts import Starts
from gmux.rundir import RuntimeDir


def _proc(rundir, name, code):
    os.makedirs(rundir.logs(), exist_ok=True)
    with open(os.path.join(rundir.logs(), f"{name}.cluster.log"), "ab") as out:
        return subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)


def test_a_rank_that_never_registered_fails_the_start_and_stops_its_peers(tmp_path):
    rundir = RuntimeDir(str(tmp_path))
    events = []
    starts = Starts(rundir, lambda ev, cjob, detail="", **data: events.append((ev, cjob, detail)))
    # An earlier start of the same name left a line in the log: it is not this start's reason.
    os.makedirs(rundir.logs())
    with open(os.path.join(rundir.logs(), "c4.1.cluster.log"), "w") as f:
        f.write("an old start's last words\n")
    starts.begin("c4", [])
    waiting = _proc(rundir, "c4.0", "import time; time.sleep(60)")
    refused = _proc(rundir, "c4.1", "import sys; print('gmux-launch: gmuxd refused register: \\x1b[2Jno GPU 7');"
                                    "sys.exit(4)")
    for p in (waiting, refused):
        starts.children[p.pid] = p
    starts.spawned["c4"] = [waiting.pid, refused.pid]
    starts.logs = {waiting.pid: (os.path.join(rundir.logs(), "c4.0.cluster.log"), 0),
                   refused.pid: (os.path.join(rundir.logs(), "c4.1.cluster.log"), len("an old start's last words\n"))}
    refused.wait()
    starts.reap()
    starts.unregistered([{"name": "c4.1", "pid": refused.pid, "state": "failed"}])
    assert events == [] and "c4" in starts.starting          # gmuxd heard of it: its record says how it ended
    starts.unregistered([{"name": "c4.0", "pid": waiting.pid, "state": "running"}])
    assert events == [("start_failed", "c4", "rank 1: gmux-launch exited with status 4 before gmuxd heard of it: "
                       "gmux-launch: gmuxd refused register: \\x1b[2Jno GPU 7")]
    assert waiting.wait(10) != 0                              # the rank waiting for its peer is stopped
    assert "c4" not in starts.starting and not starts.exits
    starts.reap()
    starts.unregistered([])
    assert len(events) == 1                                   # said once


def test_a_start_that_fails_is_held_after_three_tries_and_a_job_no_machine_up_fits_waits(cluster_factory, tmp_path):
    """A job whose working directory m1 does not have fails to start there three times and is held, saying why.
    A job that fits no machine up (m2, which had a GPU it fits, is lost) is accepted (m2 may come back) and waits:
    it was sent to m1's smaller GPUs, where gmuxd refused it three times. (A --mem no machine the scheduler knows
    could hold is refused at submit: tests/cluster_mode/test_cluster_gang.py.)"""
    from gmux.wire import keys
    c = cluster_factory(policy="gandiva", machines=("m1",), sched_args=("--lost-after", "2"))
    keys.create(c.keys, "daemon", "m2")
    c.gpus = "1x900GiB"
    c.start_daemon("m2")
    c.wait_machines(2)
    c.daemons["m2"].kill()
    wait_for(lambda: any(m["name"] == "m2" and m["state"] == "lost" for m in c.ps()["machines"]), 30, "m2 lost")
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    big = c.call("c_submit", argv=[PY, str(script)], cwd=ROOT, env={}, mem=900 << 30)["cjob"]
    cjob = c.call("c_submit", argv=[PY, str(script)], cwd=str(tmp_path / "not-on-m1"), env={})["cjob"]
    job = wait_for(lambda: (lambda j: j["state"] == "held" and j)(c.job(cjob)), 60,
                   f"{cjob} held after its failed starts")
    assert "its start failed 3 times in a row, the last on m1" in job["detail"], job
    assert "No such file or directory" in job["detail"], job
    texts = [d["text"] for d in c.ps()["decisions"]]
    assert sum(f"{cjob}: start on m1 failed: could not start rank 0" in t for t in texts) == 3, texts
    assert not any("start sent again" in t for t in texts), texts
    assert c.job(big)["state"] == "pending" and not any(f"{big}: start on m1" in t for t in texts), texts


def test_a_start_that_failed_silently_on_a_full_disk_says_the_disk_is_full(tmp_path):
    """A full disk fails gmux-launch before it registers and swallows what it says: the scheduler heard only
    "exited with status 1 before gmuxd heard of it"."""
    from gmux_testkit import full_filesystem
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    rundir = RuntimeDir(str(rt))
    with full_filesystem(rt):
        os.makedirs(rundir.logs(), exist_ok=True)
        events = []
        starts = Starts(rundir, lambda ev, cjob, detail="", **data: events.append((ev, cjob, detail)))
        starts.begin("c5", [])
        p = _proc(rundir, "c5.0", "import sys; print('gmux-launch: no room for its checkpoint'); sys.exit(1)")
        starts.children[p.pid] = p
        starts.spawned["c5"] = [p.pid]
        starts.logs = {p.pid: (os.path.join(rundir.logs(), "c5.0.cluster.log"), 0)}
        p.wait()
        starts.reap()
        starts.unregistered([])
        ((ev, cjob, detail),) = events
        assert detail.startswith("gmux-launch exited with status 1 before gmuxd heard of it; nothing reached its "
                                 f"log: the filesystem of {rundir.logs()} has "), detail
        assert detail.endswith("0B free"), detail


def test_a_start_that_fails_while_its_checkpoint_streams_has_its_receiver_refuse_the_rest(tmp_path):
    """The move's source hears at once that nobody will read what it sends (see test_piped_receive)."""
    rundir = RuntimeDir(str(tmp_path))
    events, gone = [], []
    starts = Starts(rundir, lambda ev, cjob, detail="", **data: events.append((ev, cjob, detail)),
                    reader_gone=gone.append)
    arrived, arriving = str(tmp_path / "m1-c5-1.0.ckpt"), str(tmp_path / "m1-c5-1.1.ckpt")
    with open(arrived, "wb") as f:
        f.write(b"all of it")
    starts.begin("c5", [arrived, arriving])
    starts.observe("c5", {"state": "lost", "step": 0, "exit_status": None, "detail": "killed"}, {}, 2)
    assert events == [("start_failed", "c5", "lost: killed")]
    assert gone == [arriving] and not os.path.exists(arrived)
