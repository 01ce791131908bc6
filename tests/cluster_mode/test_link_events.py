"""A cluster link tells the scheduler what its workers learn as they learn it: an event queued by a worker thread
(a move's "migrate_sent", a failed action) wakes the link's loop instead of waiting for its next look at gmuxd.
A real link, real CurveZMQ sockets, a stand-in scheduler; no gmuxd (its looks fail and are logged)."""
import logging
import threading
import time

import pytest
import zmq

from gmux import protocol
from gmux.node import cluster_link
from gmux.node.cluster_link import ClusterLink
from gmux.wire import keys

C = protocol.CLUSTER_MESSAGES


@pytest.fixture
def link_and_scheduler(tmp_path, monkeypatch):
    # The loop's idle poll made far longer than the test waits: only a wake-up can deliver the event in time.
    monkeypatch.setattr(cluster_link, "IDLE_POLL_MS", 60_000)
    monkeypatch.setattr(cluster_link, "REPORT_S", 1e9)
    kd = str(tmp_path / "keys")
    keys.create(kd, "scheduler")
    keys.create(kd, "daemon", "m1")
    ctx = zmq.Context()
    guard = keys.Guard(ctx, kd, ("daemon",))
    sched = keys.server_socket(ctx, zmq.ROUTER, kd, "scheduler")
    port = sched.bind_to_random_port("tcp://127.0.0.1")
    (tmp_path / "run").mkdir()
    link = ClusterLink(str(tmp_path / "run"), "m1", f"tcp://127.0.0.1:{port}", kd, warm_starts=0)
    done = threading.Event()
    loop = threading.Thread(target=link.serve, kwargs={"until": done.is_set}, daemon=True)
    loop.start()
    yield link, sched
    done.set()
    link.wakeup.set()                   # (out of its minute-long poll now)
    loop.join(10)
    sched.close(0)
    guard.stop()
    ctx.term()


def events(sched, wait_s: float) -> list:
    got, deadline = [], time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if sched.poll(100):
            _, frame = sched.recv_multipart()
            msg = protocol.decode(frame, C)
            if msg.type == "node_event":
                got.append((msg["event"], msg["cjob"], msg["detail"]))
                break
    return got


def test_an_event_a_worker_queues_goes_up_at_once(link_and_scheduler):
    link, sched = link_and_scheduler
    time.sleep(0.5)                     # the loop is asleep in its (minute-long) idle poll
    threading.Thread(target=link._event, args=("action_failed", "c7", "checkpoint: disk full")).start()
    assert events(sched, 10.0) == [("action_failed", "c7", "checkpoint: disk full")]


def test_a_migration_refused_by_a_machine_cut_off_is_answered_as_failed(link_and_scheduler):
    """A scheduler restarted during a move sent its migrate_out while the link still counted itself cut off: the
    link refused it and said nothing, the move waited at "sending" for good, and the job stayed "migrating"."""
    link, sched = link_and_scheduler
    link._event("action_failed", "c0", "hello")          # (the scheduler learns the link's address from it)
    deadline = time.monotonic() + 10
    while not sched.poll(100):
        assert time.monotonic() < deadline
    ident, _ = sched.recv_multipart()
    link.fence.fence_s, link.fence.heard_at = 1.0, time.monotonic() - 60     # unanswered for a minute
    sched.send_multipart([ident, protocol.encode(
        "node_action", table=C, action="migrate_out", cjob="c7",
        args={"target": "m2", "endpoint": "tcp://127.0.0.1:1", "xfer": "m1-c7-0"})])
    assert events(sched, 10.0) == [("migrate_failed", "c7", "m1 was cut off from the scheduler as it arrived")]


def _hello(link, sched) -> bytes:
    """The link's routing id, learned from an event of its own."""
    link._event("action_failed", "c0", "hello")
    deadline = time.monotonic() + 10
    while not sched.poll(100):
        assert time.monotonic() < deadline
    ident, _ = sched.recv_multipart()
    return ident


def _abandon(sched, ident, cjob: str, of: str, **more) -> None:
    sched.send_multipart([ident, protocol.encode("node_action", table=C, action="abandon", cjob=cjob,
                                                 args={"of": of, **more})])


# A scheduler restarted after it told a move's machine to give its part up, but before it heard the answer, tells
# it again: the link answered only a start or a send still under way, and the move waited for good, the job
# "migrating". Now what ended before the word came is said again.
def test_a_start_given_up_before_the_word_came_is_said_failed_again(link_and_scheduler):
    link, sched = link_and_scheduler
    ident = _hello(link, sched)
    _abandon(sched, ident, "c7", "start")
    assert events(sched, 10.0) == [("start_failed", "c7",
                                    "its move was given up: the checkpoint it waited for will not come")]


def test_a_start_that_restored_before_the_word_came_is_said_started_again(link_and_scheduler):
    link, sched = link_and_scheduler
    ident = _hello(link, sched)
    link._jobs["c7"] = {"cjob": "c7", "state": "running", "step": 41, "local": "j3"}
    _abandon(sched, ident, "c7", "start")
    assert events(sched, 10.0) == [("started", "c7", "")]


@pytest.mark.parametrize("more,after,resumed", [({}, "runs on here", True),
                                                ({"resume": False}, "stays suspended here", False)])
def test_a_send_over_before_the_word_came_is_said_failed_and_the_job_runs_on(link_and_scheduler, more, after,
                                                                            resumed):
    # (resume false: the scheduler had suspended the job before its move; before, it was resumed here all the
    # same, beside what the scheduler had since put on its GPUs)
    link, sched = link_and_scheduler
    ident = _hello(link, sched)
    asked = []
    link.admin = lambda mtype, **fields: asked.append((mtype, fields.get("job"))) or {}
    link._jobs["c7"], link.locals["c7"] = {"cjob": "c7", "state": "suspended", "step": 41, "local": "j3"}, ["j3"]
    _abandon(sched, ident, "c7", "send", **more)
    assert events(sched, 10.0) == [("migrate_failed", "c7", f"no send of it is under way on m1: it {after}")]
    assert asked == ([("resume", "j3")] if resumed else [])


def test_a_parked_job_asked_to_resume_on_another_gpu_is_refused_and_left_as_it_is(link_and_scheduler):
    link, sched = link_and_scheduler
    asked = []
    link.admin = lambda mtype, **fields: asked.append((mtype, fields.get("job"), fields.get("gpu"))) or {}
    link._jobs["c7"] = {"cjob": "c7", "state": "held", "step": 41, "local": "j3", "gpu": None, "parked_gpu": 0}
    link._resume("c7", ["j3"], 1)
    (got,) = events(sched, 10.0)
    assert got == ("action_failed", "c7", "resume: c7 gave GPU 0 to another job while suspended and resumes only "
                                          "there (or on another machine)")
    assert asked == []                # (before: resumed as it was, to run on GPU 0, counted on GPU 1)
    link._resume("c7", ["j3"], 0)     # on its own GPU: resumed (it runs once the GPU is free)
    assert asked == [("resume", "j3", None)]


@pytest.mark.parametrize("resume", [True, False])
def test_a_failed_send_resumes_the_job_only_if_it_was_not_suspended_before(tmp_path, resume):
    from types import SimpleNamespace
    from gmux.node.cluster_send import migrate_out
    said = []
    link = SimpleNamespace(keydir=str(tmp_path / "no-keys"), _jobs={}, sending={},
                           _admin_reply=lambda mtype, local, **f: said.append((mtype, local)) or (None, {}),
                           _event=lambda ev, cjob, detail, **d: said.append((ev, cjob)))
    migrate_out(link, "c7", ["j3", "j4"], "m2", "tcp://127.0.0.1:1", "x", threading.Event(), resume)  # (no key)
    # The move failed before it began: a running job runs on; one the policy had suspended stays suspended
    # (before: resumed here, beside what the scheduler had since put on its GPUs).
    assert said == ([("resume", "j3"), ("resume", "j4")] if resume else []) + [("migrate_failed", "c7")]


def test_a_gmuxd_not_answering_is_said_once_and_again_once_it_answers(tmp_path, caplog):
    """A link with no gmuxd (run as its own process before one started, or after it stopped) logged "gmuxd not
    answering" at every look at it, twice a second for ever."""
    kd = str(tmp_path / "keys")
    keys.create(kd, "scheduler")
    keys.create(kd, "daemon", "m1")
    (tmp_path / "run").mkdir()
    link = ClusterLink(str(tmp_path / "run"), "m1", "tcp://127.0.0.1:1", kd, warm_starts=0)
    try:
        with caplog.at_level(logging.INFO, logger="gmux.cluster_link"):
            for full in (True, False, True, True):
                link._report(time.monotonic(), full=full)
            assert len(caplog.records) == 1, caplog.text
            away = link.gmuxd.call
            link.gmuxd.call = lambda mtype, timeout=130.0, **fields: {"jobs": [], "gpus": []}
            for _ in range(3):
                link._report(time.monotonic())
            link.gmuxd.call = away
            for _ in range(3):
                link._report(time.monotonic())
    finally:
        link.close()
    said = [r.getMessage() for r in caplog.records if r.name == "gmux.cluster_link"]
    assert [m.split(":")[0].split(",")[0] for m in said] == ["gmuxd not answering", "gmuxd answers again",
                                                              "gmuxd not answering"], said
