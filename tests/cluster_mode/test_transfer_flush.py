"""A durable receiver whose host passes `later` fsyncs beside the host's loop: the end is answered only once
the file is on disk, a sender that asks again meanwhile is told it holds everything and waits with the first,
and a failed fsync leaves no file and tells every waiter why."""
import os
import threading
import time

import pytest

from gmux import protocol
from gmux.wire import receiver
from gmux.wire.receiver import Receiver


def _msg(mtype, mid=1, **fields):
    return protocol.decode(protocol.encode(mtype, mid, table=protocol.CLUSTER_MESSAGES, **fields),
                           protocol.CLUSTER_MESSAGES)


def _answers(rx, n, timeout=10.0):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += list(rx.finished())
        time.sleep(0.01)
    return got


@pytest.fixture
def held_fsync(monkeypatch):
    """os.fsync as the receiver calls it, held until the test lets it go (and failing if it says so)."""
    gate = {"go": threading.Event(), "error": None, "calls": 0}
    real = os.fsync

    def fsync(fd):
        gate["calls"] += 1
        assert gate["go"].wait(10)
        if gate["error"]:
            raise gate["error"]
        real(fd)
    monkeypatch.setattr(receiver.os, "fsync", fsync)
    return gate


def _received(rx, payload):
    assert rx.handle(_msg("xfer_begin", xfer="m1-c1", size=len(payload)), None) == (True, {"have": 0})
    ok, out = rx.handle(_msg("xfer_chunk", xfer="m1-c1", offset=0), payload)
    assert ok and out == {"have": len(payload)}


def test_the_end_is_answered_once_on_disk_and_a_repeated_end_waits_with_it(tmp_path, held_fsync):
    rx = Receiver(str(tmp_path / "in"))
    payload = os.urandom(3 << 20)
    _received(rx, payload)
    assert rx.handle(_msg("xfer_end", 2, xfer="m1-c1"), None, later="first") == (True, Receiver.LATER)
    time.sleep(0.2)
    assert list(rx.finished()) == [] and not os.path.exists(rx.path("m1-c1"))
    # the sender heard nothing and came back on a new connection
    assert rx.handle(_msg("xfer_begin", 3, xfer="m1-c1", size=len(payload)), None) == (True, {"have": len(payload)})
    ok, out = rx.handle(_msg("xfer_chunk", 4, xfer="m1-c1", offset=0), payload[:10])
    assert not ok and "being written to disk" in out
    assert rx.handle(_msg("xfer_end", 5, xfer="m1-c1"), None, later="second") == (True, Receiver.LATER)
    held_fsync["go"].set()
    got = _answers(rx, 2)
    assert [(later, ok) for later, ok, _ in got] == [("first", True), ("second", True)]
    assert got[0][2] == {"have": len(payload), "path": rx.path("m1-c1")}
    with open(rx.path("m1-c1"), "rb") as f:
        assert f.read() == payload
    assert held_fsync["calls"] == 1 and rx.completed == 1 and rx.flushing == {}
    rx.close()


def test_a_failed_fsync_keeps_nothing_and_says_why(tmp_path, held_fsync):
    rx = Receiver(str(tmp_path / "in"))
    _received(rx, b"x" * 1000)
    held_fsync["error"] = OSError(5, "Input/output error")
    assert rx.handle(_msg("xfer_end", 2, xfer="m1-c1"), None, later="it") == (True, Receiver.LATER)
    held_fsync["go"].set()
    [(later, ok, why)] = _answers(rx, 1)
    assert later == "it" and not ok and "Input/output error" in why and "m1-c1" in why
    assert os.listdir(rx.dir) == [] and rx.completed == 0
    # the same transfer again starts from nothing
    assert rx.handle(_msg("xfer_begin", 3, xfer="m1-c1", size=1000), None) == (True, {"have": 0})
    rx.close()


def test_without_later_the_end_is_answered_at_once(tmp_path):
    rx = Receiver(str(tmp_path / "in"))
    _received(rx, b"y" * 5000)
    ok, out = rx.handle(_msg("xfer_end", 2, xfer="m1-c1"), None)
    assert ok and out["path"] == rx.path("m1-c1") and os.path.getsize(out["path"]) == 5000
    rx.close()
