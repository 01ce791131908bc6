"""A user's hold on a cluster job (`gmux suspend/resume --cluster`): the job is suspended where it runs and the
policy sees neither it nor its GPUs until its user releases it; a machine that shows it running anyway, or a
policy resume that lands after the hold, is told again to suspend it; a hold outlives the loss of its machine;
only the owner or an admin holds or releases, and a refusal changes nothing. The scheduler here has no daemons: the fixture records what it sends
them, and reports are fed to it as a machine's link would send them."""
import time

import msgpack
import pytest

from gmux import protocol
from gmux.cluster.scheduler import unheard
from gmux.cluster.scheduler.state import CJob, Machine
from scheduler_alone import C, client, scheduler_alone

GRACE = 0.3


@pytest.fixture
def sched(tmp_path, monkeypatch):
    monkeypatch.setattr(unheard, "GRACE_S", GRACE)
    s = scheduler_alone(
        tmp_path, {"m1": Machine("m1", [{"index": 0, "mem_total": 8 << 30}, {"index": 1, "mem_total": 8 << 30}],
                                 "tcp://127.0.0.1:1", last_seen=time.time())},
        {"c1": CJob("c1", ["python", "train.py"], "/", state="running", machine="m1", gpu=0, rank_gpus=[0],
                    local="j1", owner="alice", first_run=time.time())}, admins=("ops",))
    yield s
    s.close()


def report(s, state="running", held=False, cjob="c1"):
    s._daemon_node_report("m1", b"m1", {"name": "m1", "gpus": s.machines["m1"].gpus, "transfer": "tcp://127.0.0.1:1",
                                         "jobs": [{"cjob": cjob, "local": "j1", "state": state, "step": 10,
                                                   "gpu": 0, "held": held}]}, None)


def test_a_held_job_is_suspended_kept_so_and_runs_again_once_released(sched):
    assert client(sched, "alice", "c_suspend", cjob="c1") == {"cjob": "c1", "state": "held"}
    assert sched.wire == [("m1", "suspend", "c1")] and sched.jobs["c1"].state == "held"
    sched.tick(time.time())
    assert sched.wire == [("m1", "suspend", "c1")]            # the policy has GPUs and a job: it resumes nothing
    assert "held by alice" in sched.jobs["c1"].detail
    report(sched, "suspended", held=True)
    time.sleep(GRACE * 1.5)
    report(sched, "suspended", held=True)                     # held as asked: nothing sent, however long
    sched.tick(time.time())
    assert len(sched.wire) == 1
    report(sched, "running", held=False)                      # resumed on the machine: the hold is said again
    time.sleep(GRACE * 1.5)
    report(sched, "running", held=False)
    assert sched.wire[1:] == [("m1", "suspend", "c1")]
    assert client(sched, "alice", "c_suspend", cjob="c1")["state"] == "held"    # again: nothing new
    assert len(sched.wire) == 2
    assert client(sched, "alice", "c_resume", cjob="c1") == {"cjob": "c1", "state": "suspended"}
    sched.tick(time.time())
    assert sched.wire[2:] == [("m1", "resume", "c1")] and sched.jobs["c1"].state == "running"
    kinds = [d["kind"] for d in sched.recent]
    assert "hold" in kinds and "release" in kinds


def test_a_held_jobs_gpus_are_kept_for_it_and_a_late_resume_is_undone(sched):
    client(sched, "alice", "c_suspend", cjob="c1")                 # on GPU 0 of m1's two
    sched.jobs["c2"] = CJob("c2", ["python", "train.py"], "/", owner="bob")
    sched.jobs["c3"] = CJob("c3", ["python", "train.py"], "/", gpus=2, owner="bob")   # a gang of two
    sched.tick(time.time())
    assert sched.wire[1:] == [("m1", "start", "c2")] and sched.jobs["c2"].gpu == 1
    sched.tick(time.time())
    assert sched.jobs["c3"].state == "pending" and len(sched.wire) == 2
    assert not any("holds c1" in d["text"] for d in sched.recent)  # never proposed onto c1's GPU
    # The policy's resume of c1, sent before the hold, lands after it: the hold is said again at once.
    frame = protocol.encode("node_event", table=C, name="m1", cjob="c1", event="resumed", detail="")
    sched._daemon_node_event("m1", b"m1", protocol.decode(frame, C), None)
    assert sched.wire[2:] == [("m1", "suspend", "c1")] and sched.jobs["c1"].state == "held"


def test_a_pending_job_held_is_not_placed_until_released(sched):
    sched.jobs["c2"] = CJob("c2", ["python", "train.py"], "/", owner="alice")
    client(sched, "alice", "c_suspend", cjob="c2")
    sched.tick(time.time())
    assert sched.jobs["c2"].state == "held" and sched.jobs["c2"].machine is None and sched.wire == []
    client(sched, "alice", "c_resume", cjob="c2")
    assert sched.jobs["c2"].state == "pending"
    sched.tick(time.time())
    assert sched.wire == [("m1", "start", "c2")] and sched.jobs["c2"].state == "starting"


def test_a_hold_outlives_its_machine(sched):
    client(sched, "alice", "c_suspend", cjob="c1")
    sched.jobs["c1"].step = 2373
    sched.machines["m1"].last_seen -= 3600
    sched.tick(time.time())
    job = sched.jobs["c1"]
    assert job.state == "held" and job.machine is None and job.restarts == 1, job
    assert job.step == 0        # (no checkpoint: from the beginning; it showed the dead machine's last step)
    assert "once released" in job.detail
    client(sched, "alice", "c_resume", cjob="c1")
    assert job.state == "pending"


def test_only_the_owner_or_an_admin_holds_and_a_refusal_changes_nothing(sched):
    with pytest.raises(protocol.ProtocolError, match="c1 belongs to alice, not to bob"):
        client(sched, "bob", "c_suspend", cjob="c1")
    with pytest.raises(protocol.ProtocolError, match="c1 is not held by its user \\(it is running\\)"):
        client(sched, "alice", "c_resume", cjob="c1")
    with pytest.raises(protocol.ProtocolError, match="no live job 'c9'"):
        client(sched, "alice", "c_suspend", cjob="c9")
    sched.jobs["c1"].state = "starting"
    with pytest.raises(protocol.ProtocolError, match="c1 is starting .*hold it once it runs there"):
        client(sched, "alice", "c_suspend", cjob="c1")
    assert sched.jobs["c1"].state == "starting" and sched.wire == []
    sched.jobs["c1"].state = "running"
    assert client(sched, "ops", "c_suspend", cjob="c1")["state"] == "held"
    with pytest.raises(protocol.ProtocolError, match="belongs to alice, not to bob"):
        client(sched, "bob", "c_resume", cjob="c1")
    assert sched.jobs["c1"].state == "held"
    assert client(sched, "ops", "c_resume", cjob="c1")["state"] == "suspended"
    client(sched, "alice", "c_suspend", cjob="c1")
    client(sched, "alice", "c_kill", cjob="c1")
    with pytest.raises(protocol.ProtocolError, match="c1 is being killed"):
        client(sched, "alice", "c_resume", cjob="c1")
    assert sched.jobs["c1"].state == "held"
    with pytest.raises(protocol.ProtocolError, match="cjob"):
        protocol.decode(msgpack.packb({"v": protocol.VERSION, "type": "c_suspend", "id": 1, "cjob": ["c1"]}), C)


def test_a_job_killed_while_held_is_learned_with_the_service_it_had_when_held(sched):
    """gmux's size model learns each ended job's service: a job held (or suspended) and then killed must count
    what it ran, not the time it sat held as if it had run on."""
    learned = []
    model = sched.driver.policy.model
    model.add = lambda n, service, job_id=None: learned.append(service)
    ran_from = time.time()
    sched.tick(ran_from)                              # the policy sees c1 running from now on
    time.sleep(0.3)
    client(sched, "alice", "c_suspend", cjob="c1")
    ran_to = time.time()
    sched.tick(ran_to)                                # ...and no longer
    time.sleep(1.5)
    client(sched, "alice", "c_kill", cjob="c1")
    report(sched, "killed")
    sched.tick(time.time())
    assert sched.jobs["c1"].state == "killed"
    # what it ran (at least the 0.3 s slept), not the 1.5 s more it sat held
    assert len(learned) == 1 and 0.25 <= learned[0] <= ran_to - ran_from + 0.05, (learned, ran_to - ran_from)


def test_a_start_that_keeps_failing_is_held_with_the_reason_and_tries_again_when_released(sched):
    """A start that fails the same way every time (a --mem no GPU has) is not sent again for ever: after three
    failures in a row the job is held, saying why and how to try again; a start that gets going clears the count."""
    def failed(detail):
        frame = protocol.encode("node_event", table=C, name="m1", cjob="c2", event="start_failed", detail=detail)
        sched._daemon_node_event("m1", b"m1", protocol.decode(frame, C), None)

    sched.jobs["c2"] = CJob("c2", ["python", "train.py"], "/", owner="alice")
    for attempt in range(1, 4):
        sched.tick(time.time())
        assert sched.wire[-1] == ("m1", "start", "c2") and len(sched.wire) == attempt
        failed(f"refused {attempt}")
    job = sched.jobs["c2"]
    assert job.state == "held" and job.machine is None and job.start_failures == 3
    assert "failed 3 times in a row, the last on m1: refused 3" in job.detail
    assert "gmux resume --cluster ADDRESS c2" in job.detail
    sched.tick(time.time())
    assert len(sched.wire) == 3                                   # held: not started again
    assert sched.state.load_jobs()["c2"].start_failures == 3      # and so after a scheduler restart
    assert client(sched, "alice", "c_resume", cjob="c2")["state"] == "pending"
    assert job.start_failures == 0
    sched.tick(time.time())
    assert sched.wire[-1] == ("m1", "start", "c2")
    failed("refused again")
    assert job.state == "pending" and job.start_failures == 1     # three more tries after a release
    sched.tick(time.time())
    frame = protocol.encode("node_event", table=C, name="m1", cjob="c2", event="started", detail="")
    sched._daemon_node_event("m1", b"m1", protocol.decode(frame, C), None)
    assert job.state == "running" and job.start_failures == 0
    failed("an earlier start's failure, heard late")                 # (it runs: not a failure of this start)
    assert job.state == "running" and job.machine == "m1" and job.start_failures == 0


def test_a_pending_job_says_why_it_waits(sched):
    """`gmux ps --cluster` showed a pending job with no reason at all."""
    for cjob, gpus in (("c2", 1), ("c3", 2), ("c4", 3)):
        sched.jobs[cjob] = CJob(cjob, ["python", "train.py"], "/", gpus=gpus, owner="bob")
    sched.jobs["c5"] = CJob("c5", ["python", "train.py"], "/", owner="bob", detail="start on m1 failed: no GPU")
    details = lambda: {j["cjob"]: j["detail"] for j in client(sched, "alice", "c_ps")["jobs"]}
    d = details()          # m1 has 2 GPUs; c1 runs on GPU 0
    assert d["c2"].startswith("queued: 1 GPU(s) free on one machine")
    assert d["c3"] == "waiting for 2 GPU(s) on one machine: at most 1 free now"
    assert d["c4"] == "needs 3 GPUs on one machine; the widest machine up has 2"
    assert d["c5"] == "start on m1 failed: no GPU"          # a reason of its own is kept
    assert sched.jobs["c2"].detail == ""                    # shown, not stored
    sched.machines["m1"].state = "lost"
    assert details()["c3"] == "no machine is up (1 lost)"
    sched.machines.clear()
    assert details()["c2"] == "no machine is up (none has joined)"


def test_a_second_live_job_of_one_user_under_one_name_is_refused(sched):
    """Duplicate --names were accepted silently: a submit retried after a timeout ran the script twice."""
    sub = dict(argv=["python", "train.py"], cwd="/", name="sweep-1")
    first = client(sched, "alice", "c_submit", **sub)["cjob"]
    with pytest.raises(protocol.ProtocolError, match=f"your job {first} is named 'sweep-1' and runs on"):
        client(sched, "alice", "c_submit", **sub)
    assert client(sched, "bob", "c_submit", **sub)["cjob"] != first      # another user's name is theirs
    sched.jobs[first].state = "done"
    assert client(sched, "alice", "c_submit", **sub)["cjob"] not in (first,)


def test_a_move_target_that_says_it_started_at_step_0_does_not_release_the_source(sched):
    """A target reporting "started" at step 0 for a job at step 700 has restored none of it: the source was
    released and the job's work lost (a target waiting for its checkpoint taken for one that runs)."""
    from test_unheard import event
    job = sched.jobs["c1"]
    job.state, job.source, job.step, job.move = "migrating", "m0", 700, {"stage": "sending"}
    event(sched, "started", "", step=0, local="j2")
    assert job.state == "migrating" and job.source == "m0" and not [w for w in sched.wire if w[1] == "release"]
    event(sched, "started", "", step=1, local="j2")
    assert job.state == "running" and [w[:2] for w in sched.wire if w[1] == "release"] == [("m0", "release")]
    # (the step a target's first boundary counts is not the step it restored to: the log said "at step 1")
    assert [d["text"] for d in sched.recent if d["kind"] == "migrated"] == ["c1 restored on m1, training there; m0 "
                                                                            "releases it"], list(sched.recent)


def test_a_move_to_where_the_job_already_is_is_refused_at_once(sched):
    """The CLI said "moving c12 from m3 to m3 GPU 1"; only the scheduler's log showed the refusal."""
    with pytest.raises(protocol.ProtocolError, match="c1 is already on m1 GPU 0"):
        client(sched, "alice", "c_migrate", cjob="c1", machine="m1", gpu=0)
    assert sched.wire == []


def test_a_job_is_named_by_its_name_too_for_its_owner(sched):
    """`gmux kill --cluster NAME` said "no live job" while the job named so ran (as gmuxd takes a name)."""
    sched.jobs["c1"].name = "sweep-3"
    with pytest.raises(protocol.ProtocolError, match="no live job 'sweep-3'"):
        client(sched, "bob", "c_suspend", cjob="sweep-3")          # another user's job of that name
    assert client(sched, "alice", "c_suspend", cjob="sweep-3") == {"cjob": "c1", "state": "held"}
    assert client(sched, "alice", "c_resume", cjob="sweep-3")["cjob"] == "c1"
    assert client(sched, "alice", "c_kill", cjob="sweep-3")["cjob"] == "c1"


def test_a_moving_job_shows_the_step_its_source_trains_at(sched):
    """While its target started, ps showed the step of the move's start (113) as the source trained on (278)."""
    sched.machines["m2"] = Machine("m2", sched.machines["m1"].gpus, "tcp://127.0.0.1:2", last_seen=time.time())
    job = sched.jobs["c1"]
    job.state, job.source, job.machine, job.step = "migrating", "m1", "m2", 3
    report(sched)                                   # the source: running at step 10
    assert job.step == 10 and job.machine == "m2" and job.state == "migrating"
    report(sched, state="exited")                   # its end there is not the job's (the target's word is)
    assert job.step == 10 and job.state == "migrating"
