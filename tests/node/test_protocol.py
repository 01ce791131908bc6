"""The wire: valid messages pass, every kind of bad one is refused with a message naming the problem."""
import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from gmux import protocol
from gmux.protocol import ProtocolError, decode, encode


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
    (frame(type="migrate", admin="a", job="../etc", gpu=0), "not a valid name"),
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


@settings(max_examples=3000, deadline=None)
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


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from(sorted(protocol.MESSAGES)), st.dictionaries(field_names, values, max_size=6))
def test_decode_structured_garbage(mtype, fields):
    obj = {"v": protocol.VERSION, "type": mtype, "id": 1, **fields}
    try:
        decode(msgpack.packb(obj))
    except ProtocolError:
        pass
