"""A suspend, resume, kill or move that a machine did not hear (its link was away when it was sent, or it was lost
on the way) is sent again once the machine's reports show it was not done; a report that agrees, or a local hold
that ends within the grace, sends nothing; a move the machine refused is not sent again, and the scheduler takes
the GPU the machine reports."""
import time

import msgpack
import pytest

from gmux import protocol
from gmux.cluster.scheduler import unheard
from gmux.cluster.scheduler.driver import Intent
from gmux.cluster.scheduler.service import Options, Scheduler
from gmux.cluster.scheduler.state import CJob, Machine
from gmux.wire import keys

GRACE = 1.0     # (two statements in a row never take this long, on a loaded machine too)


@pytest.fixture
def sched(tmp_path, monkeypatch):
    monkeypatch.setattr(unheard, "GRACE_S", GRACE)
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    s = Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*"))
    s.machines = {"m1": Machine("m1", [{"index": 0, "mem_total": 1 << 30}], "tcp://127.0.0.1:1",
                                last_seen=time.time())}
    s.jobs = {"c1": CJob("c1", ["python", "train.py"], "/", state="running", machine="m1", gpu=0, rank_gpus=[0],
                         local="j1", owner="tester")}
    s.reachable = True
    s.wire = []

    def send(ident, frame):
        if s.reachable:
            msg = msgpack.unpackb(frame)
            s.wire.append((ident.decode(), msg["action"], msg["args"]))
        return s.reachable
    s.server.send = send
    yield s
    s.close()


def report(s, state="running", held=False, gpu=0):
    s._daemon_node_report("m1", b"m1", {"name": "m1", "gpus": [{"index": 0, "mem_total": 1 << 30},
                                                                {"index": 1, "mem_total": 1 << 30}],
                                         "transfer": "tcp://127.0.0.1:1",
                                         "jobs": [{"cjob": "c1", "local": "j1", "state": state, "step": 10,
                                                   "gpu": gpu, "held": held}]}, None)


def event(s, name, detail, **data):
    """A link's event as the scheduler gets it: encoded and validated against the wire format."""
    frame = protocol.encode("node_event", table=protocol.CLUSTER_MESSAGES, name="m1", cjob="c1", event=name,
                            detail=detail, data=data)
    s._daemon_node_event("m1", b"m1", protocol.decode(frame, protocol.CLUSTER_MESSAGES), None)


def test_a_suspend_sent_while_the_link_was_away_is_sent_when_it_reports_again(sched):
    sched.reachable = False
    sched.intents.carry_out(Intent("suspend", "c1", why="its turn is over"))
    assert sched.jobs["c1"].state == "suspended" and sched.wire == []
    sched.reachable = True
    report(sched, "running", held=False)          # back: it still runs the job the scheduler counts suspended
    assert sched.wire == [("m1", "suspend", {})]
    assert any(d["kind"] == "resend" and "did not hear 'suspend'" in d["text"] for d in sched.recent)
    report(sched, "running", held=False)          # sent a moment ago and on its way: not again yet
    assert len(sched.wire) == 1
    report(sched, "suspended", held=True)         # done: nothing more
    time.sleep(GRACE * 1.5)
    report(sched, "suspended", held=True)
    assert len(sched.wire) == 1


def test_a_resume_lost_on_the_way_is_sent_again_after_the_grace(sched):
    sched.jobs["c1"].state = "suspended"
    sched.intents.carry_out(Intent("resume", "c1", machine="m1", gpu=0, gpus=(0,)))
    assert sched.wire == [("m1", "resume", {"gpu": 0})]
    report(sched, "suspended", held=True)         # not heard yet: within the grace, nothing is sent
    assert len(sched.wire) == 1
    time.sleep(GRACE * 1.5)
    report(sched, "suspended", held=True)         # still held a grace later: lost on the way
    assert sched.wire[1:] == [("m1", "resume", {"gpu": 0})]
    report(sched, "suspended", held=True)         # the second is on its way
    assert len(sched.wire) == 2


def test_a_hold_that_ends_within_the_grace_sends_nothing(sched):
    report(sched, "running", held=True)           # held there for a moment (a local command, a stop)
    time.sleep(GRACE * 0.5)
    report(sched, "running", held=False)
    time.sleep(GRACE * 0.7)
    report(sched, "running", held=True)           # a new hold: its own grace
    assert sched.wire == []


def test_a_kill_is_repeated_until_the_job_has_ended_and_then_forgotten(sched):
    sched.jobs["c1"].kill_requested = True
    time.sleep(GRACE * 1.5)
    report(sched, "running")
    time.sleep(GRACE * 1.5)
    report(sched, "running")
    assert [a for _, a, _ in sched.wire] == ["kill"]
    report(sched, "killed")
    assert sched.jobs["c1"].state == "killed"
    time.sleep(GRACE * 1.5)
    report(sched, "running")                      # news about an ended job changes nothing
    assert [a for _, a, _ in sched.wire] == ["kill"]


def test_a_move_lost_on_the_way_is_sent_again_once_then_the_machine_is_believed(sched):
    sched.intents.carry_out(Intent("move", "c1", machine="m1", gpu=1, gpus=(1,)))
    assert sched.wire == [("m1", "move", {"gpu": 1})] and sched.jobs["c1"].gpu == 1
    report(sched, gpu=0)                          # under way (it waits for a boundary): within the grace
    time.sleep(GRACE * 1.5)
    report(sched, gpu=0)                          # still on GPU 0 a grace later: lost on the way
    assert sched.wire[1:] == [("m1", "move", {"gpu": 1})]
    event(sched, "action_failed", "move: migrate: j1 is busy with a move; try again in a moment", action="move",
          busy=True)
    report(sched, gpu=0)                          # busy: the first is still under way, nothing is given up yet
    assert sched.jobs["c1"].gpu == 1
    time.sleep(GRACE * 1.5)
    report(sched, gpu=0)                          # not made a grace after the resend: the machine is believed
    assert len(sched.wire) == 2 and sched.jobs["c1"].gpu == 0 and sched.jobs["c1"].rank_gpus == [0]
    report(sched, gpu=1)                          # ...also when the first move lands after all
    assert len(sched.wire) == 2 and sched.jobs["c1"].gpu == 1


def test_a_move_the_machine_refused_is_not_sent_again(sched):
    sched.intents.carry_out(Intent("move", "c1", machine="m1", gpu=1, gpus=(1,)))
    event(sched, "action_failed", "move: migrate: GPU 1 cannot take j1: 900 MiB of 1 GiB in use", action="move")
    report(sched, gpu=0)                          # refused: the scheduler takes the machine's word at once
    assert sched.jobs["c1"].gpu == 0 and sched.jobs["c1"].rank_gpus == [0]
    time.sleep(GRACE * 1.5)
    report(sched, gpu=0)
    assert sched.wire == [("m1", "move", {"gpu": 1})]
    sched.intents.carry_out(Intent("move", "c1", machine="m1", gpu=1, gpus=(1,)))   # the policy's new move is its own
    report(sched, gpu=0)
    time.sleep(GRACE * 1.5)
    report(sched, gpu=0)
    assert [a for _, a, _ in sched.wire] == ["move", "move", "move"]


def test_a_move_whose_target_cannot_be_reached_is_given_up_and_the_job_runs_on(sched):
    """Just after a scheduler restart a target's link may not be connected yet: the move's start was lost, the
    source sent its checkpoint two minutes later to a machine with nothing to restore it, and the job stayed
    `migrating` (no training) until a machine was taken down."""
    sched.machines["m2"] = Machine("m2", [{"index": 0, "mem_total": 1 << 30}], "tcp://127.0.0.1:2",
                                   last_seen=time.time())
    job = sched.jobs["c1"]
    sched.reachable = False
    sched.moves.start(job, "m2", [0], "a test")
    assert (job.state, job.machine, job.gpu, job.source, job.move) == ("running", "m1", 0, None, {}), job
    assert "its move to m2 was given up: m2 could not be reached" in job.detail
    sched.reachable = True
    sched.moves.start(job, "m2", [0], "again")
    assert job.state == "migrating" and ("m2", "start") in [(m, a) for m, a, _ in sched.wire]


def test_a_copy_on_a_machine_the_job_left_is_killed_once_per_grace_not_at_every_report(sched):
    """Back after it was counted lost, m1 still showed the copy the job left there (until it had ended), in reports
    some 50 a second while it started a job: each sent a kill, and each kill was logged as failed ('job ended')."""
    sched.jobs["c1"].machine = "m2"
    for _ in range(20):
        report(sched, "waiting")
    assert sched.wire == [("m1", "kill", {})]
    time.sleep(GRACE * 1.5)
    report(sched, "waiting")                      # still shown: its kill may have been lost
    assert sched.wire == [("m1", "kill", {})] * 2
    report(sched, "killed")
    assert len(sched.wire) == 2


def test_a_job_parked_by_its_gmuxd_is_said_so_and_a_resume_onto_another_gpu_there_leaves_it_suspended(sched):
    j = sched.jobs["c1"]
    j.state = "suspended"
    sched._daemon_node_report("m1", b"m1", {"name": "m1", "gpus": [{"index": 0, "mem_total": 1 << 30},
                                                                   {"index": 1, "mem_total": 1 << 30}],
                                            "transfer": "tcp://127.0.0.1:1",
                                            "jobs": [{"cjob": "c1", "local": "j1", "state": "held", "step": 10,
                                                      "gpu": None, "held": True, "parked_gpu": 0}]}, None)
    assert j.parked and j.gpu == 0
    # A resume onto GPU 1 (sent before that report came), refused by the link: counted suspended on GPU 0 again.
    sched.intents.carry_out(Intent("resume", "c1", "m1", 1, "policy Resume", (1,)))
    assert (j.state, j.gpu) == ("running", 1)
    event(sched, "action_failed", "resume: c1 gave GPU 0 to another job while suspended and resumes only there",
          action="resume", parked_gpu=0)
    assert (j.state, j.gpu, j.rank_gpus, j.parked) == ("suspended", 0, [0], True)
    report(sched, "held", held=True, gpu=None)             # no longer parked (its GPU free again, say)
    assert not j.parked
