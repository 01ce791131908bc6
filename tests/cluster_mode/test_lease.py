"""A cluster job whose gmuxd dies while the machine lives on stops itself once gmuxd has not answered it for its
lease (0.8 x the scheduler's --lost-after), at its next boundary: the scheduler by then counts the machine lost and
starts the job elsewhere from its checkpoint, and two copies must not both train (both would write the same
files). The copy elsewhere ends bit-identical; gmuxd, restarted, finds the stopped copy's exit record and the
scheduler takes it for what it is, not a failure. A job whose gmuxd answers runs on, however long it waits."""
import json
import os
import signal
import time

import pytest
import zmq

from cluster_harness import PY, ROOT, Solo, paced, unpace, wait_for
from gmux import protocol
from gmux.job.agent import Agent
from gmux.node.daemon import REAP_EVERY_S
from gmux.wire.daemon_client import Client
from test_user_hold import report, sched  # noqa: F401 (a fixture: a scheduler without daemons)

STEPS = "3000"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_job_whose_gmuxd_died_stops_itself_and_runs_on_elsewhere(cluster_factory, tmp_path):
    c = cluster_factory(policy="gandiva", machines=("m1", "m2"), sched_args=("--lost-after", "3"))
    args = (STEPS, "--batch", "37", *paced(tmp_path, "0.004"))
    ref = Solo(tmp_path, "ref", *args)
    c.wait_machines(2)
    out = tmp_path / "out.json"
    cjob = c.submit(str(out), *args, ckpt_every=1.0)
    first = wait_for(lambda: (lambda j: j["state"] == "running" and (j["ckpt_step"] or 0) > 100 and j)(c.job(cjob)),
                     90, "the job running, with a checkpoint")
    src = first["machine"]
    pid = next(j["pid"] for j in Client(str(tmp_path / f"rt-{src}")).call("ps")["jobs"] if j["name"] == cjob)
    c.daemons[src].send_signal(signal.SIGKILL)            # gmuxd alone: its job's process lives on
    c.daemons[src].wait()
    killed_at = time.monotonic()
    wait_for(lambda: not _alive(pid), 30, "the orphaned copy stopped itself")
    stopped_after = time.monotonic() - killed_at
    assert 2.4 <= stopped_after < 10.0, stopped_after        # its lease: 0.8 x --lost-after
    log = (tmp_path / f"rt-{src}" / "logs" / f"{cjob}.cluster.log").read_text()
    assert f"{protocol.LEASE_LOST_REASON} for 2." in log, log[-2000:]
    again = wait_for(lambda: (lambda j: j["restarts"] == 1 and j["state"] in ("running", "done") and j)(c.job(cjob)),
                     60, "restarted on the other machine")
    assert again["machine"] != src
    c.start_daemon(src)                                   # gmuxd back: it finds the stopped copy's exit record
    c.wait_machines(2)
    unpace(tmp_path)
    jobs = c.wait_done([cjob], 240)
    assert jobs[cjob]["restarts"] == 1
    local = wait_for(lambda: [j for j in Client(str(tmp_path / f"rt-{src}")).call("ps", all=True)["jobs"]
                              if j["name"] == cjob], 30, "the restarted gmuxd's record of the stopped copy")
    assert local[0]["exit_status"] == protocol.LEASE_LOST_STATUS, local
    res = json.loads(out.read_text())
    assert res["sha256"] == ref["sha256"] and res["steps"] == int(STEPS)


@pytest.mark.parametrize("how", ["dies", "hangs", "hangs, the job holding the GIL"])
def test_a_job_that_reaches_no_boundary_stops_too_when_its_gmuxd_dies(cluster_factory, tmp_path, how):
    """Found by an outside-user review: a script whose steps gmux does not see sent gmuxd nothing, so it never
    learnt that its gmuxd had died, and trained on beside the copy the scheduler had started elsewhere (both
    writing the same file). Its launcher now watches gmuxd's process for it, and its beat: a gmuxd alive but
    stopped (SIGSTOP) or hung let the copy train on beside the new one for as long as it hung."""
    c = cluster_factory(policy="gandiva", machines=("m1", "m2"), sched_args=("--lost-after", "3"))
    script = tmp_path / "no_boundary.py"
    script.write_text("import time\nfor _ in range(6000):\n    time.sleep(0.05)\n" if "GIL" not in how else
                      # (a thread of the job's gets the GIL only every 100 s: as under one long C call)
                      "import sys, time\nsys.setswitchinterval(100)\nt = time.time()\n"
                      "while time.time() - t < 300:\n    pass\n")
    c.wait_machines(2)
    cjob = c.call("c_submit", argv=[PY, str(script)], cwd=ROOT, env={"OMP_NUM_THREADS": "1"})["cjob"]
    src = wait_for(lambda: (lambda j: j["state"] in ("starting", "running") and j["machine"])(c.job(cjob)), 60,
                   "the job placed")
    pid = wait_for(lambda: next((j["pid"] for j in Client(str(tmp_path / f"rt-{src}")).call("ps")["jobs"]
                                 if j["name"] == cjob and j["pid"]), None), 60, "its process")
    time.sleep(1.0)
    assert _alive(pid)
    c.daemons[src].send_signal(signal.SIGKILL if how == "dies" else signal.SIGSTOP)     # (hangs: alive, silent)
    if how == "dies":
        c.daemons[src].wait()
    killed_at = time.monotonic()
    try:
        wait_for(lambda: not _alive(pid), 30, "the orphaned copy stopped itself")
        # Its lease, 0.8 x --lost-after, counts from gmuxd's last beat, up to a beat before the kill or the stop
        # (CI: stopped 2.2 s after the SIGSTOP)
        assert 2.4 - REAP_EVERY_S <= time.monotonic() - killed_at < 10.0
    finally:
        if how != "dies":
            c.daemons[src].send_signal(signal.SIGCONT)
    log = (tmp_path / f"rt-{src}" / "logs" / f"{cjob}.cluster.log").read_text()
    assert protocol.LEASE_LOST_REASON in log, log[-2000:]


def _fake_gmuxd(tmp_path):
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/fake.sock"
    router.bind(endpoint)
    return router, endpoint


def _answer(router, n=100):
    """Replies to what the agent sent, as gmuxd does (every message gets one)."""
    for _ in range(n):
        if not router.poll(0):
            return
        ident, frame = router.recv_multipart()
        msg = protocol.decode(frame)
        router.send_multipart([ident, protocol.encode("reply", msg.id, ok=True)])


def test_the_lease_counts_only_silence_not_a_slow_boundary_or_unread_answers(tmp_path):
    router, endpoint = _fake_gmuxd(tmp_path)
    agent = Agent(endpoint, "j1", "t" * 32)
    lost = []
    agent.lease_s, agent.on_lease_lost = 0.5, lost.append
    try:
        agent.state = "running"
        assert agent.poll() is None                      # a heartbeat goes out
        assert router.poll(10000)                        # (an ipc connect is asynchronous: it may come late)
        _answer(router)
        time.sleep(1.0)                                  # a step longer than the lease, answers unread meanwhile
        assert agent.poll() is None and lost == []
        time.sleep(0.3)
        agent.poll()
        time.sleep(0.9)                                  # gmuxd silent for longer than the lease
        agent.poll()
        assert len(lost) == 1 and lost[0] > 0.5
        # While suspended (waiting for a command) it is counted too.
        lost.clear()
        agent.wait(timeout=1.5)
        assert lost and lost[0] > 0.5
        # Without a lease (local jobs) nothing is ever counted.
        lost.clear()
        agent.lease_s = None
        time.sleep(0.6)
        agent.poll()
        assert lost == []
    finally:
        agent.close()
        router.close(0)


def test_a_copy_that_stopped_for_its_lease_is_restarted_not_failed(sched):
    """gmuxd came back before the scheduler counted the machine lost, and reports the copy that stopped itself:
    the job restarts from its checkpoint; a job that merely exits 75 on its own still fails."""
    def ended(status, detail, local="j1", state="failed"):
        sched._daemon_node_report("m1", b"m1", {"name": "m1", "gpus": sched.machines["m1"].gpus,
                                                "transfer": "tcp://127.0.0.1:1",
                                                "jobs": [{"cjob": "c1", "local": local, "state": state, "step": 10,
                                                          "gpu": 0, "exit_status": status, "detail": detail}]}, None)
    job = sched.jobs["c1"]
    ended(protocol.LEASE_LOST_STATUS, f"exit status 75: {protocol.LEASE_LOST_REASON} for 3.0 s: ...")
    assert job.state == "pending" and job.restarts == 1 and job.machine is None, job
    assert f"it stopped on m1, {protocol.LEASE_LOST_REASON}; restarts from the beginning" in job.detail
    sched.tick(time.time())
    assert sched.wire[-1] == ("m1", "start", "c1")
    ended(None, "", local="j2", state="running")              # its new copy
    ended(75, "exit status 75; see `gmux logs`", local="j2")
    assert job.state == "failed" and job.exit_status == 75


def test_the_stopped_copys_record_does_not_undo_the_next_start_on_its_machine(sched):
    """The machine shows the copy that stopped until it starts the next one: placed there again, the job's start
    must not be undone by that record at every report (it was: restarts climbed and the job never started)."""
    job = sched.jobs["c1"]
    stopped = {"cjob": "c1", "local": "j1", "state": "failed", "step": 10, "gpu": 0,
               "exit_status": protocol.LEASE_LOST_STATUS, "detail": f"exit status 75: {protocol.LEASE_LOST_REASON}"}
    def report_jobs(*records):
        sched._daemon_node_report("m1", b"m1", {"name": "m1", "gpus": sched.machines["m1"].gpus,
                                                "transfer": "tcp://127.0.0.1:1", "jobs": list(records)}, None)
    report_jobs(stopped)
    assert job.state == "pending" and job.restarts == 1
    for _ in range(3):
        sched.tick(time.time())
        report_jobs(stopped)
        assert job.state == "starting" and job.restarts == 1 and job.machine == "m1", job
    # The new copy's own record (another local id, or the same id on another machine) speaks again.
    report_jobs({**stopped, "local": "j2", "state": "running", "exit_status": None, "detail": ""})
    assert job.state == "running"
    report_jobs({**stopped, "local": "j2", "state": "exited", "exit_status": 0, "detail": "finished"})
    assert job.state == "done"


def test_a_restart_says_it_restores_once_its_checkpoint_has_arrived(sched):
    """It said "sending its checkpoint to m1" for the whole start there (13 s in an outside user's run, while the
    process was up and restoring)."""
    job = sched.jobs["c1"]
    job.ckpt_step, job.state, job.machine = 372, "starting", "m1"
    sched.pushes.done.put(("c1", "m1", ["x0"], {"bytes": 10, "seconds": 0.1}, None))
    sched.pushes.drain()
    assert sched.wire[-1] == ("m1", "start", "c1")
    assert (job.state, job.detail) == ("starting", "restoring its checkpoint (step 372) on m1"), job
    # ... and no more once it has started there (an outside operator saw it still at step 974)
    sched._daemon_node_event("m1", b"m1", {"name": "m1", "cjob": "c1", "event": "started", "data": {"step": 372}},
                             None)
    assert (job.state, job.detail) == ("running", ""), job


def test_a_job_with_no_boundary_is_not_moved_between_machines(sched):
    """Its copy on the target started the script afresh while the one on the source computed on, for the 120 s
    the move waited for a checkpoint that could never be written (an outside cluster operator's, 3 of 3). A
    user's migrate is refused, saying why; a policy's is skipped, said once."""
    from gmux.cluster.scheduler.driver import Intent
    from gmux.cluster.scheduler.state import Machine
    from test_user_hold import client
    sched.machines["m2"] = Machine("m2", sched.machines["m1"].gpus, "tcp://127.0.0.1:2", last_seen=time.time())
    sched._daemon_node_report("m1", b"m1", {"name": "m1", "gpus": sched.machines["m1"].gpus,
                                            "transfer": "tcp://127.0.0.1:1",
                                            "jobs": [{"cjob": "c1", "local": "j1", "state": "running", "step": 0,
                                                      "gpu": 0, "boundless": True}]}, None)
    with pytest.raises(protocol.ProtocolError, match="c1 has reached no boundary since it started.*an unmodified "
                                                     "one. is never moved"):
        client(sched, "alice", "c_migrate", cjob="c1", machine="m2", gpu=0)
    for _ in range(2):
        sched.intents.carry_out(Intent("migrate", "c1", "m2", 0, "defragment", (0,)))
    job = sched.jobs["c1"]
    assert job.state == "running" and job.machine == "m1" and sched.wire == [], (job, sched.wire)
    said = [d["text"] for d in sched.state.decisions(50) if d["kind"] == "skip"]
    assert said == ["c1: defragment; not moved: it has reached no boundary, so it cannot be checkpointed"], said
    report(sched)     # (no boundless in the record: it has reached one) moves again
    assert client(sched, "alice", "c_migrate", cjob="c1", machine="m2", gpu=0)["to"] == "m2"
