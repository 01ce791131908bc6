"""Commands in flight and the requests waiting on them (gmux.node.commands), with the sends recorded."""
import msgpack

from gmux import protocol
from gmux.node.commands import WAIT_S, Commands
from gmux.node.jobs import Job
from gmux.wire.server import DEFERRED, Request


class Recorder:
    """The part of gmux.wire.server.Server that Commands uses, recording instead of sending."""

    def __init__(self, reachable=True):
        self.sent, self.reachable = [], reachable

    def send(self, identity, frame):
        if self.reachable:
            self.sent.append((identity, msgpack.unpackb(frame)))
        return self.reachable

    def reply(self, identity, msg_id, data=None):
        return self.send(identity, protocol.reply(msg_id, True, data=data))

    def refuse(self, identity, msg_id, text):
        return self.send(identity, protocol.error_reply(msg_id, text))


def request(msg_id, at=0.0):
    return Request(b"cli", protocol.Message("suspend", msg_id, {}), at)


def test_a_command_waits_in_the_outbox_until_the_job_is_heard_from():
    server = Recorder()
    c = Commands(server)
    job = Job("j1", "t", "", ["x"])
    cmd = c.send(job, "suspend", {})
    assert not server.sent and len(job.outbox) == 1 and c.inflight[cmd][:2] == ("j1", "suspend")
    c.heard_from(job, b"agent")
    assert server.sent[0][0] == b"agent" and server.sent[0][1]["cmd"] == cmd and not job.outbox
    assert c.answered(cmd, "j2") is None and cmd not in c.inflight    # another job's answer: dropped
    cmd = c.send(job, "resume", {"gpu": 0, "env": {}})
    assert c.answered(cmd, "j1")[0] == "resume" and c.answered(cmd, "j1") is None   # a repeat finds nothing


def test_a_gangs_request_is_answered_once_every_rank_has_acknowledged():
    server = Recorder()
    c = Commands(server)
    assert c.defer(["r0", "r1"], "suspend", request(5), named="r0") is DEFERRED
    c.wake("r0", "suspend", True, 0.1)
    assert not server.sent
    c.wake("r1", "suspend", True, 0.2, boundary_wait=0.05)
    (_, reply), = server.sent
    assert reply["id"] == 5 and reply["data"]["jobs"] == ["r0", "r1"] and reply["data"]["boundary_wait_s"] == 0.05
    assert "warnings" not in reply["data"]
    c.defer(["r0", "r1"], "migrate", request(6), named="r0")
    c.wake("r0", "migrate", True, 0.1, warning="counts from 0 again")    # what each rank said it will change
    c.wake("r1", "migrate", True, 0.1)
    assert server.sent[-1][1]["data"]["warnings"] == {"r0": "counts from 0 again"}


def test_a_failure_an_end_or_silence_answers_with_an_error():
    server = Recorder()
    c = Commands(server)
    c.defer("a", "migrate", request(1))
    c.wake("a", "migrate", False, 0.1, error="disk full")
    assert server.sent[-1][1]["error"] == "migrate of a failed: disk full"
    job = Job("b", "t", "", ["x"])
    c.defer("b", "checkpoint", request(2))
    c.send(job, "checkpoint", {"path": "/x"})
    c.ended(job, "killed: killed by gmux kill")
    assert server.sent[-1][1]["error"] == "checkpoint: job b ended (killed: killed by gmux kill)"
    assert not c.inflight and not job.outbox
    c.defer("d", "suspend", request(3, at=0.0))
    c.expire(WAIT_S + 1)
    assert "no acknowledgement in 120 s" in server.sent[-1][1]["error"]


def test_a_checkpoint_reply_names_the_step_the_checkpoints_hold():
    # The jobs step on once their checkpoints are written; the requester (the cluster link, recording a
    # restart point) must hear the step each one wrote, not what a later report says.
    server = Recorder()
    c = Commands(server)
    c.defer(("g0", "g1"), "checkpoint", request(1))
    c.wake("g0", "checkpoint", True, 0.1, step=345)
    c.wake("g1", "checkpoint", True, 0.1, step=344)
    reply = server.sent[-1][1]["data"]
    assert reply["step"] == 344 and reply["jobs"] == ["g0", "g1"]
    c.defer("s", "suspend", request(2))
    c.wake("s", "suspend", True, 0.1)
    assert "step" not in server.sent[-1][1]["data"]      # said only when every job said it
