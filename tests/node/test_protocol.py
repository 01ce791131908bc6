"""The wire: valid messages pass, every kind of bad one is refused with a message naming the problem."""
import re

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from gmux import protocol
from gmux.protocol import ProtocolError, decode, encode
from gmux_testkit import fuzz_examples


def frame(**obj):
    return msgpack.packb({"v": protocol.VERSION, "id": 1, **obj})


def test_round_trip_every_client_type():
    samples = {
        "ping": {}, "register": {"pid": 5, "argv": ["python", "t.py"], "weight": 2.0, "mem": None},
        "report": {"job": "j1", "token": "t", "report": {"step": 3, "rate": 1.5}, "state": "running"},
        "heartbeat": {"job": "j1", "token": "t", "state": "suspended", "boundaries": 10, "t": 1.5},
        "result": {"job": "j1", "token": "t", "cmd": 7, "kind": "suspend", "result": {"ok": True}},
        "bye": {"job": "j1", "token": "t", "status": 0},
        "ps": {"admin": "a"}, "migrate": {"admin": "a", "job": "j1", "gpu": 1},
        "submit": {"admin": "a", "argv": ["python", "t.py"], "cwd": "/", "env": {"A": "b"}},
        "command": {"cmd": 1, "kind": "resume", "args": {"gpu": 0}},
    }
    assert set(samples) | {"reply"} >= set(protocol.MESSAGES) - {"suspend", "resume", "kill", "logs", "decisions",
                                                                 "shutdown", "checkpoint"}
    for mtype, fields in samples.items():
        msg = decode(encode(mtype, 9, **fields))
        assert msg.type == mtype and msg.id == 9 and msg.fields == fields


@pytest.mark.parametrize("data,needle", [
    (b"\xc1", "not a msgpack"),
    (msgpack.packb([1, 2]), "must be a map"),
    (msgpack.packb({"v": 99, "type": "ping"}), "version 99"),
    (frame(type="nope"), "unknown message type"),
    (frame(type="ping", extra=1), "unknown field 'extra'"),
    (frame(type="register", argv=["x"]), "missing field 'pid'"),
    (frame(type="register", pid="5", argv=["x"]), "register.pid: expected an integer"),
    (frame(type="register", pid=True, argv=["x"]), "expected an integer, got bool"),
    (frame(type="register", pid=1, argv=["x"], weight=float("nan")), "register.weight"),
    (frame(type="register", pid=1, argv=["x"], weight=-1), "register.weight"),
    # a weight of 5e-324 made every share on its GPU infinite (vtime inf), so weights no longer counted
    (frame(type="submit", admin="a", argv=["python", "t.py"], cwd="/", weight=5e-324),
     "submit.weight: 5e-324 is not a weight in [0.001, 1000]"),
    (frame(type="submit", admin="a", argv=["python", "t.py"], cwd="/", weight=1e6), "is not a weight"),
    (frame(type="migrate", admin="a", job="../etc", gpu=0), "not a valid name"),
    # a name reading as another job's id: `gmux kill j3` found no job 'j3' while ps showed one named so
    # (a registration's is refused by gmuxd, for a new job only: test_daemon_handler.py; its alphabet, here)
    (frame(type="register", pid=1, argv=["x"], name="a/../b"), "register.name: 'a/../b' is not a valid name"),
    (frame(type="submit", admin="a", argv=["python", "t.py"], cwd="/", name="j12"), "'j12' looks like a job id"),
    (frame(type="migrate", admin="a", job="j1", gpu=-1), "outside"),
    (frame(type="report", job="j1", token="t", report={"x": "y" * 70000}), "exceeds"),
    (frame(type="submit", admin="a", argv=[], cwd="/"), "argv is empty"),
    (frame(type="heartbeat", job="j1", token="t", state="dancing"), "not one of"),
    (b"\x80" + b"x" * (protocol.MAX_FRAME + 1), "exceeds the"),
])
def test_bad_messages_are_refused_with_reason(data, needle):
    with pytest.raises(ProtocolError) as e:
        decode(data)
    assert needle in str(e.value)


def test_encode_refuses_what_decode_would():
    with pytest.raises(ProtocolError):
        encode("register", 1, pid=-3, argv=["x"])


@settings(max_examples=fuzz_examples(1500), deadline=None)
@given(st.binary(max_size=300))
def test_decode_never_raises_anything_but_protocol_error_on_bytes(data):
    try:
        decode(data)
    except ProtocolError:
        pass


values = st.recursive(st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats() | st.text(max_size=20)
                      | st.binary(max_size=20), lambda c: st.lists(c, max_size=4) | st.dictionaries(
                          st.text(max_size=8), c, max_size=4), max_leaves=10)
field_names = st.sampled_from(sorted({f for spec in protocol.MESSAGES.values() for f in spec} | {"v", "type", "id"}))


@settings(max_examples=fuzz_examples(1000), deadline=None)
@given(st.sampled_from(sorted(protocol.MESSAGES)), st.dictionaries(field_names, values, max_size=6))
def test_decode_structured_garbage(mtype, fields):
    obj = {"v": protocol.VERSION, "type": mtype, "id": 1, **fields}
    try:
        decode(msgpack.packb(obj))
    except ProtocolError:
        pass


cluster_field_names = st.sampled_from(sorted({f for spec in protocol.CLUSTER_MESSAGES.values() for f in spec}
                                             | {"v", "type", "id"}))
endpoints = st.builds(lambda host, port: f"tcp://{host}:{port}", st.text(max_size=5), st.text(max_size=5))


@settings(max_examples=fuzz_examples(700), deadline=None)
@given(st.sampled_from(sorted(protocol.CLUSTER_MESSAGES)),
       st.dictionaries(cluster_field_names, values | endpoints, max_size=6))
def test_decode_structured_garbage_of_the_cluster(mtype, fields):
    obj = {"v": protocol.VERSION, "type": mtype, "id": 1, **fields}
    try:
        decode(msgpack.packb(obj), protocol.CLUSTER_MESSAGES)
    except ProtocolError:
        pass


# --- typed nested payloads: a command's args by its kind, a cluster action's by the action, figures bounded ---
@pytest.mark.parametrize("mtype,fields,needle", [
    ("command", {"cmd": 1, "kind": "spill", "args": {}}, "command.args: missing field 'path'"),
    ("command", {"cmd": 1, "kind": "suspend", "args": {"path": "/x"}}, "command.args: unknown field 'path'"),
    ("command", {"cmd": 1, "kind": "resume", "args": {"gpu": -1}}, "command.args: gpu:"),
    ("command", {"cmd": 1, "kind": "checkpoint", "args": {"path": "a\0b"}}, "NUL"),
    ("result", {"job": "j1", "token": "t", "cmd": 1, "kind": "suspend", "result": {"bytes": 5}},
     "result.result: missing field 'ok'"),
    ("result", {"job": "j1", "token": "t", "cmd": 1, "kind": "suspend", "result": {"ok": True, "bytes": -1}},
     "bytes:"),
    ("report", {"job": "j1", "token": "t", "report": {"step": "3"}}, "report.report: step:"),
    ("report", {"job": "j1", "token": "t", "report": {"by_tag": {"a": {"b": 1}}}}, "expected a name and a number"),
    ("report", {"job": "j1", "token": "t", "report": {f"k{i}": 1 for i in range(100)}}, "exceeds 64"),
])
def test_nested_payloads_are_typed(mtype, fields, needle):
    with pytest.raises(ProtocolError, match=needle.replace("(", r"\(")):
        decode(msgpack.packb({"v": protocol.VERSION, "type": mtype, "id": 1, **fields}))
    with pytest.raises(ProtocolError):
        encode(mtype, 1, **fields)     # a sender's bug fails at the sender


START = {"argv": ["python", "t.py"], "cwd": "/", "gpus": [0, 1], "restore": ["m-c1-0", "m-c1-1"], "mem": None,
         "weight": 1.0, "ckpt_every": None}


@pytest.mark.parametrize("action,args,needle", [
    ("start", {**START, "restore": ["m-c1-0"]}, "one received checkpoint per rank"),
    ("start", {**START, "gpus": [0, 0]}, "distinct GPU indices"),
    ("start", {**START, "argv": []}, "argv is empty"),
    ("start", {**START, "surprise": 1}, "unknown field 'surprise'"),
    ("move", {}, "missing field 'gpu'"),
    ("migrate_out", {"target": "m2", "endpoint": "http://x", "xfer": "x"}, "tcp://"),
    ("kill", {"gpu": 1}, "unknown field 'gpu'"),
    # '²' is a digit to str.isdigit but not to int(): the scheduler died of the ValueError
    ("migrate_out", {"target": "m2", "endpoint": "tcp://h:\u00b2", "xfer": "x"}, "port is not a number"),
])
def test_cluster_actions_are_typed(action, args, needle):
    raw = msgpack.packb({"v": protocol.VERSION, "type": "node_action", "id": 1, "action": action, "cjob": "c1",
                         "args": args})
    with pytest.raises(ProtocolError, match=needle):
        decode(raw, protocol.CLUSTER_MESSAGES)
    # the link can still say which job's action was refused
    assert protocol.peek_action(raw) == (action, "c1")


def test_typed_payloads_round_trip():
    for action, args in [("start", START), ("move", {"gpu": 3}), ("resume", {"gpu": None}), ("release", {}),
                         ("migrate_out", {"target": "m2", "endpoint": "tcp://127.0.0.1:7000", "xfer": "m1-c1-4"})]:
        msg = decode(encode("node_action", 2, table=protocol.CLUSTER_MESSAGES, action=action, cjob="c1", args=args),
                     protocol.CLUSTER_MESSAGES)
        assert msg["args"] == args
    data = {"xfers": ["m1-c1-0"], "bytes": 10, "seconds": 0.5, "step": 4}
    msg = decode(encode("node_event", 3, table=protocol.CLUSTER_MESSAGES, name="m1", cjob="c1", event="checkpointed",
                        data=data), protocol.CLUSTER_MESSAGES)
    assert msg["data"] == data
    assert protocol.peek_action(b"\xc1") == (None, None)
    with pytest.raises(ProtocolError, match="xfers: item 0"):
        encode("node_event", 3, table=protocol.CLUSTER_MESSAGES, name="m1", cjob="c1", event="checkpointed",
               data={"xfers": ["../etc"]})


@pytest.mark.parametrize("fields", [
    {"argv": ["python", "a\0b"], "cwd": "/"},
    {"argv": ["python"], "cwd": "/tmp\0x"},
    {"argv": ["python"], "cwd": "/", "env": {"A": "b\0c"}},
    {"argv": ["python"], "cwd": "/", "env": {"A=B": "c"}},
    {"argv": ["python"], "cwd": "/", "env": {"": "c"}},
])
def test_submit_refuses_what_exec_cannot_take(fields):
    """A NUL byte in argv, env or cwd made the spawn fail inside gmuxd and left ghost jobs; it is refused at the edge."""
    with pytest.raises(ProtocolError, match="NUL|without '='"):
        decode(frame(type="submit", admin="a", **fields))


@pytest.mark.parametrize("env, said", [
    ({"TORCH_X": "x" * 5000}, "entry 'TORCH_X': its value: string of 5000 characters exceeds 4096"),
    ({"A": 5}, "entry 'A': its value: expected a string, got int"),
    ({"N" * 300: "v"}, "its name: string of 300 characters exceeds 256"),
])
def test_an_environment_entry_refused_says_what_is_wrong_with_it(env, said):
    """A 5,000-character value was refused as 'keys and values must be strings'."""
    with pytest.raises(ProtocolError, match=re.escape(said)):
        decode(frame(type="submit", admin="a", argv=["python", "t.py"], cwd="/", env=env))
