"""The shared server loop (gmux.wire.server): dispatch through a handler table, refusals and internal errors
answered (the latter counted), deferred replies, roles from the peer's key, sends that never block."""
import threading
import time

import msgpack
import pytest
import zmq

from gmux import protocol
from gmux.wire.request import Requester
from gmux.wire.server import DEFERRED, SEND_QUEUE, Busy, Refused, Server, configure


@pytest.fixture
def router(tmp_path):
    ctx = zmq.Context.instance()
    sock = configure(ctx.socket(zmq.ROUTER))
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



class Final(Exception):
    pass


class NotYet(Final):
    pass


def test_a_refusal_only_for_now_says_so_in_the_reply_and_reaches_the_caller_as_its_busy_error(router):
    sock, endpoint = router

    def busy(req):
        raise Busy("j1 is busy with a move; try again in a moment")

    def final(req):
        raise Refused("j1 is busy with a move")       # the same words, but a final refusal: only the flag counts
    server = Server(sock, {"migrate": busy, "kill": final}, name="testd")
    stop = threading.Event()
    t = threading.Thread(target=server.serve, args=(lambda: None, stop.is_set), daemon=True)
    t.start()
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.connect(endpoint)
    try:
        asks = Requester(client, "testd", Final, lambda waited: "silent", busy=NotYet)
        with pytest.raises(NotYet, match="busy with a move; try again"):
            asks.call("migrate", 5, admin="x", job="j1", gpu=1)
        with pytest.raises(Final) as refused:
            asks.call("kill", 5, admin="x", job="j1")
        assert type(refused.value) is Final
        plain = Requester(client, "testd", Final, lambda waited: "silent")   # a caller that does not wait
        with pytest.raises(Final) as refused:
            plain.call("migrate", 5, admin="x", job="j1", gpu=1)
        assert type(refused.value) is Final
    finally:
        stop.set()
        t.join(5)
        client.close(0)
    assert server.refused == 3 and server.internal_errors == 0


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


def serve_with_a_non_reader(server, tick, stop, endpoint):
    """The server's loop on a thread, and a peer that will never read (it holds at most one reply)."""
    t = threading.Thread(target=server.serve, args=(tick, stop.is_set), kwargs={"poll_s": 0.01}, daemon=True)
    t.start()
    peer = zmq.Context.instance().socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.RCVHWM, 1)
    peer.connect(endpoint)
    return t, peer


def test_the_loop_ticks_and_never_blocks_on_a_peer_that_does_not_read(router):
    sock, endpoint = router
    ticks = []
    stop = threading.Event()
    server = Server(sock, {"ping": lambda req: {"blob": "x" * 60000}}, name="testd")
    assert server.send(b"nobody", protocol.reply(1)) is False     # unroutable: dropped, not queued forever
    t, peer = serve_with_a_non_reader(server, lambda: ticks.append(1), stop, endpoint)
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
        deadline = time.monotonic() + 10      # (the good ping may be read in the loop's first batch: fair queueing)
        while len(ticks) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        peer.close(0)
        stop.set()
        t.join(10)
    assert not t.is_alive() and len(ticks) > 1 and server.internal_errors == 0


def test_a_peer_that_never_reads_costs_at_most_the_send_queue(router):
    """A client sending requests and never reading its replies once grew gmuxd from 34 to 173 MiB."""
    sock, endpoint = router
    stop = threading.Event()
    server = Server(sock, {"ping": lambda req: {"blob": "x" * 100_000}}, name="testd")
    queued = []
    send = server.send
    server.send = lambda identity, frame: queued.append(send(identity, frame)) or queued[-1]
    t, peer = serve_with_a_non_reader(server, lambda: None, stop, endpoint)
    try:
        for i in range(1000):
            peer.send(protocol.encode("ping", i + 1))
        deadline = time.monotonic() + 30
        while len(queued) < 1000 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        peer.close(0)
        stop.set()
        t.join(10)
    assert len(queued) == 1000
    # what went out beyond the queue can only be in the kernel's socket buffers and the peer's one-message queue
    assert sum(queued) <= SEND_QUEUE + 16, f"{sum(queued)} replies of 100 kB queued for a peer that never reads"


def test_a_reply_too_big_for_any_client_becomes_an_error_that_says_so(router):
    server = Server(router[0], {"ping": lambda req: {"blob": "x" * (protocol.MAX_FRAME + 10)}}, name="testd")
    sent = captured(server)
    server.receive(b"c1", [protocol.encode("ping", 3)])
    ident, frame = sent[-1]
    assert frame["id"] == 3 and frame["ok"] is False and "over the 1048576-byte limit" in frame["error"]


def test_a_socket_bound_before_configure_is_refused(tmp_path):
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"ipc://{tmp_path}/late.sock")
    try:
        with pytest.raises(ValueError, match="before binding"):
            Server(sock, {}, name="testd")
    finally:
        sock.close(0)
