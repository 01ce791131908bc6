"""The shared server loop (gmux.wire.server): dispatch through a handler table, refusals and internal errors
answered (the latter counted), deferred replies, roles from the peer's key, sends that never block."""
import threading
import time

import msgpack
import pytest
import zmq

from gmux import protocol
from gmux.wire.server import DEFERRED, Refused, Server


@pytest.fixture
def router(tmp_path):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/s.sock"
    sock.bind(endpoint)
    yield sock, endpoint
    sock.close(0)


def captured(server):
    """Replaces the server's send with a recorder: [(identity, decoded frame)]."""
    sent = []
    server.send = lambda identity, frame: sent.append((identity, msgpack.unpackb(frame))) or True
    return sent


def handlers(later):
    def ping(req):
        return {"pong": req.msg.id}

    def refuse(req):
        raise Refused("no: say please")

    def boom(req):
        raise KeyError("a bug")

    def wait(req):
        later.append(req)
        return DEFERRED

    def quiet(req):
        return None
    return {"ping": ping, "ps": refuse, "kill": boom, "suspend": wait, "decisions": quiet}


def test_dispatch_refusals_internal_errors_and_deferred_replies(router):
    later = []
    server = Server(router[0], handlers(later), name="testd", unknown="{type} is sent by testd, not to it")
    sent = captured(server)
    server.receive(b"a", [protocol.encode("ping", 7)])
    assert sent[-1] == (b"a", {"v": protocol.VERSION, "type": "reply", "id": 7, "ok": True, "data": {"pong": 7}})
    server.receive(b"a", [protocol.encode("ps", 8, admin="x")])
    assert sent[-1][1]["ok"] is False and sent[-1][1]["error"] == "no: say please" and sent[-1][1]["id"] == 8
    server.receive(b"a", [protocol.encode("kill", 9, admin="x", job="j1")])
    assert "testd internal error on kill: KeyError('a bug')" == sent[-1][1]["error"]
    server.receive(b"a", [protocol.reply(3)])
    assert sent[-1][1]["error"] == "reply is sent by testd, not to it"
    server.receive(b"a", [b"\xc1", b"x"])
    assert sent[-1][1]["error"] == "expected one frame per message, got 2"
    server.receive(b"a", [b"\xc1"])
    assert not sent[-1][1]["ok"] and sent[-1][1]["id"] == 0
    # A one-way message is acknowledged with an empty reply.
    server.receive(b"a", [protocol.encode("decisions", 10, admin="x")])
    assert sent[-1][1] == {"v": protocol.VERSION, "type": "reply", "id": 10, "ok": True}
    # A deferred request is answered later, by the owner.
    n = len(sent)
    server.receive(b"b", [protocol.encode("suspend", 11, admin="x", job="j1")])
    assert len(sent) == n and later[0].identity == b"b" and later[0].received_at <= time.monotonic()
    server.reply(later[0].identity, later[0].msg.id, {"done": True})
    assert sent[-1] == (b"b", {"v": protocol.VERSION, "type": "reply", "id": 11, "ok": True, "data": {"done": True}})
    assert (server.messages, server.refused, server.internal_errors) == (8, 4, 1)


def test_roles_from_the_key_and_an_attached_frame(router):
    C = protocol.CLUSTER_MESSAGES
    report = protocol.encode("node_report", 1, table=C, name="m1", gpus=[], transfer="tcp://127.0.0.1:9", jobs=[])
    ps = protocol.encode("c_ps", 2, table=C)
    kill = protocol.encode("c_kill", 3, table=C, cjob="c1")
    # Stands in for the key's ZAP User-Id, which a real frame carries: here, who sent which frame.
    who = {report: ("daemon", "m1"), ps: ("client", "alice"), kill: ("client", "alice")}
    seen = []
    table = {"daemon": {"node_report": lambda req: seen.append((req.peer, req.attachment)) or None},
             "client": {"c_ps": lambda req: {"jobs": []}}}
    server = Server(router[0], table, name="sched", table=C, refusals=(protocol.ProtocolError,),
                    authenticate=who.get, attachments=True, reply_to_none=False)
    sent = captured(server)
    server.receive(b"m1", [report, b"chunk"])
    assert seen == [(("daemon", "m1"), b"chunk")] and not sent      # one-way: no reply
    server.receive(b"c", [ps])
    assert sent[-1][1]["data"] == {"jobs": []}
    server.receive(b"c", [kill])
    assert sent[-1][1]["error"] == "c_kill is not accepted from a client key"
    server.receive(b"x", [protocol.encode("c_ps", 4, table=C)])      # no known key: refused before parsing
    assert sent[-1][1]["error"] == "expected one message frame (two for a checkpoint chunk)"
    server.receive(b"m1", [report, b"a", b"b"])
    assert sent[-1][1]["error"] == "expected one message frame (two for a checkpoint chunk)"
    assert server.internal_errors == 0 and server.refused == 3


def test_the_loop_ticks_and_never_blocks_on_a_peer_that_does_not_read(router):
    sock, endpoint = router
    ticks = []
    stop = threading.Event()
    server = Server(sock, {"ping": lambda req: {"blob": "x" * 60000}}, name="testd")
    assert server.send(b"nobody", protocol.reply(1)) is False     # unroutable: dropped, not queued forever
    t = threading.Thread(target=server.serve, args=(lambda: ticks.append(1), stop.is_set),
                         kwargs={"poll_s": 0.01}, daemon=True)
    t.start()
    peer = zmq.Context.instance().socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.RCVHWM, 1)
    peer.connect(endpoint)
    try:
        for i in range(3000):      # never read: the server's queue to it fills, and its sends are dropped
            peer.send(protocol.encode("ping", i + 1))
        good = zmq.Context.instance().socket(zmq.DEALER)
        good.setsockopt(zmq.LINGER, 0)
        good.connect(endpoint)
        good.send(protocol.encode("ping", 5))
        assert good.poll(10000), "the loop is wedged by a peer that does not read"
        assert msgpack.unpackb(good.recv())["id"] == 5
        good.close(0)
    finally:
        peer.close(0)
        stop.set()
        t.join(10)
    assert not t.is_alive() and len(ticks) > 1 and server.internal_errors == 0
