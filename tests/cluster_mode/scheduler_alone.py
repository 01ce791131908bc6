"""A gmux-scheduler in this process with no daemons: what it sends them is recorded in `s.wire` as (machine,
action, cluster job), and a client's request is handed over as its server would, validated against the wire
format first. For fast tests of its answers to clients and of what it tells machines."""
import time

import msgpack

from gmux import protocol
from gmux.cluster.scheduler.service import Options, Scheduler
from gmux.wire import keys
from gmux.wire.server import Request

C = protocol.CLUSTER_MESSAGES


def scheduler_alone(tmp_path, machines: dict, jobs: dict, **options) -> Scheduler:
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    s = Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*", **options))
    s.machines, s.jobs, s.wire = machines, jobs, []

    def send(ident, frame):
        msg = msgpack.unpackb(frame)
        s.wire.append((ident.decode(), msg["action"], msg["cjob"]))
        return True
    s.server.send = send
    return s


def client(s, who, mtype, **fields):
    """A client's request as the scheduler's server hands it over: validated against the wire format first."""
    msg = protocol.decode(protocol.encode(mtype, 1, table=C, **fields), C)
    return s.server.handlers["client"][mtype](Request(b"x", msg, time.monotonic(), peer=("client", who)))
