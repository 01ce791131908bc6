"""A cluster link tells the scheduler what its workers learn as they learn it: an event queued by a worker thread
(a move's "migrate_sent", a failed action) wakes the link's loop instead of waiting for its next look at gmuxd.
A real link, real CurveZMQ sockets, a stand-in scheduler; no gmuxd (its looks fail and are logged)."""
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
