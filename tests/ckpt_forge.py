"""Hand-made checkpoint files for the restore tests: framed with valid checksums, so that only the content
(tensor table, skeleton, data) is wrong, as an attacker or a bug elsewhere would make it.

A plain module (not a conftest), shared by test_restore_validation.py and test_checkpoint_fuzz.py.
"""
import io
import pickle
import struct
import zlib

import msgpack

from gmux.job import checkpoint as ckpt

PREFIX = ckpt.MAGIC + struct.pack("<H", ckpt.VERSION)
_FRAME = struct.Struct("<BQ")


def frame(kind: int, payload: bytes) -> bytes:
    header = _FRAME.pack(kind, len(payload))
    return header + payload + struct.pack("<I", zlib.crc32(payload, zlib.crc32(header)))


def split(data: bytes) -> list:
    """The frames of a well-formed checkpoint (of any version this gmux reads), as [kind, payload] pairs."""
    assert data[:len(PREFIX)] in [ckpt.MAGIC + struct.pack("<H", v) for v in ckpt.READS]
    out, at = [], len(PREFIX)
    while at < len(data):
        kind, length = _FRAME.unpack_from(data, at)
        at += _FRAME.size
        out.append([kind, bytes(data[at:at + length])])
        at += length + 4
    return out


def join(frames, prefix: bytes = PREFIX) -> bytes:
    return prefix + b"".join(frame(k, p) for k, p in frames)


def written(snapshot: dict) -> bytes:
    """A snapshot (nested values and tensors, as Job.snapshot() gives) written in the checkpoint format."""
    sink = io.BytesIO()
    ckpt.write(snapshot, sink.write)
    return sink.getvalue()


def skeleton_of(data: bytes):
    """The decoded skeleton of a checkpoint gmux wrote (TensorRefs in place of tensors)."""
    return pickle.loads(split(data)[1][1])


def with_skeleton(data: bytes, skel: bytes) -> bytes:
    frames = split(data)
    frames[1][1] = skel
    return join(frames, data[:len(PREFIX)])


SENTINEL = "@@gmux-forge-sentinel@@"


def spliced(skeleton, raw_ops: bytes) -> bytes:
    """Pickles `skeleton` (protocol 2: no FRAME opcodes to keep consistent) with the value SENTINEL replaced
    by the hand-written opcodes `raw_ops`, which must push exactly one value."""
    data = pickle.dumps(skeleton, protocol=2)
    encoded = SENTINEL.encode()
    op = b"X" + struct.pack("<I", len(encoded)) + encoded   # BINUNICODE, as protocol 2 writes a str
    assert data.count(op) == 1
    return data.replace(op, raw_ops)


# -- values that cost little to write and much to decode ---------------------------------------------------
def shared_reference_bomb(levels: int, width: int) -> bytes:
    """A list of `width` references to a list of `width` references to ... (`levels` deep): a few hundred
    bytes that stand for width**levels values. Memo slots from 900000 up, clear of the pickler's own."""
    def put(i):
        return b"r" + struct.pack("<I", 900000 + i)        # LONG_BINPUT

    def get(i):
        return b"j" + struct.pack("<I", 900000 + i)        # LONG_BINGET

    ops = b"]" + put(0) + b"(" + b"N" * width + b"e"      # [None] * width
    for i in range(1, levels):
        ops = b"]" + put(i) + b"(" + ops + get(i - 1) * (width - 1) + b"e"
    return ops


def deep_list(depth: int) -> bytes:
    """[[[...]]] `depth` deep, built on the stack: EMPTY_LIST * depth, APPEND * (depth - 1)."""
    return b"]" * depth + b"a" * (depth - 1)


def deep_tuple(depth: int) -> bytes:
    """((((),),),) `depth` deep: EMPTY_TUPLE, TUPLE1 * depth (hashing it recurses once per level)."""
    return b")" + b"\x85" * depth


def table_of(data: bytes) -> list:
    return msgpack.unpackb(split(data)[0][1])["tensors"]


def with_table(data: bytes, rows: list) -> bytes:
    frames = split(data)
    frames[0][1] = msgpack.packb({"tensors": rows})
    return join(frames, data[:len(PREFIX)])
