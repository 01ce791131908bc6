"""The checkpoint format: a job's whole state as a versioned, checksummed stream of frames.

    MAGIC (8 bytes) | version (u16) | frame* | END frame
    frame = kind (u8) | length (u64) | payload | crc32 of kind+length+payload (u32)

Frames are HEAD (msgpack: the tensor table), SKEL (the nested structure with tensors replaced by references,
pickled, and read back only through an allow-list, since a checkpoint file is untrusted input), DATA (tensor
bytes in table order, at most CHUNK bytes per frame) and END (msgpack: frame count and data bytes, so a
truncated stream is told from a complete one). Frames let the same bytes go to a file or, chunk by chunk, to
a socket, and let a reader name the exact place where a stream is damaged.

A reader validates the whole stream and builds every tensor on the host before returning; nothing is
applied to a job until all of it has been read and checked.
"""
from __future__ import annotations

import io
import pickle
import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

import msgpack
import torch

from gmux.util.atomic import atomic_open

MAGIC = b"GMUXCKPT"
VERSION = 1
HEAD, SKEL, DATA, END = 1, 2, 3, 4
_FRAME = struct.Struct("<BQ")
_CRC = struct.Struct("<I")
CHUNK = 16 << 20
MAX_META = 256 << 20  # a HEAD or SKEL frame larger than this is not one gmux wrote

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.float8_e4m3fn, torch.float8_e5m2)}


class CheckpointError(ValueError):
    def __init__(self, origin: str, problem: str):
        super().__init__(f"checkpoint {origin}: {problem}")
        self.origin, self.problem = origin, problem


@dataclass(frozen=True)
class TensorRef:
    index: int


# -- writing ------------------------------------------------------------------------------------------------
def _split(obj, tensors: list, resolve: Callable[[torch.Tensor], torch.Tensor]):
    if isinstance(obj, torch.Tensor):
        tensors.append(resolve(obj))
        return TensorRef(len(tensors) - 1)
    if isinstance(obj, dict):
        return type(obj)((k, _split(v, tensors, resolve)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(_split(v, tensors, resolve) for v in obj)
    return obj


def _host_bytes(t: torch.Tensor) -> memoryview:
    flat = t.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    return memoryview(flat.contiguous().view(torch.uint8).numpy()).cast("B")


def write(snapshot: dict, sink: Callable[[bytes], object],
          resolve: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> int:
    """Serialises a captured job into `sink` (called with each piece of bytes); returns the bytes written.

    `resolve` maps a live tensor to the tensor holding its values (the host copy of a suspended tensor)."""
    tensors: list[torch.Tensor] = []
    skeleton = pickle.dumps(_split(snapshot, tensors, resolve), protocol=5)
    try:
        _load_skeleton(skeleton)
    except pickle.UnpicklingError as e:
        raise CheckpointError("(being written)", f"the job's state holds a value gmux cannot store: {e}. "
                              "Keep state= to numbers, strings, bytes, lists, tuples, dicts and tensors") from None
    table = [[str(t.dtype).removeprefix("torch."), list(t.shape), t.numel() * t.element_size()] for t in tensors]
    for (dtype, *_), t in zip(table, tensors):
        if dtype not in _DTYPES:
            raise CheckpointError("(being written)", f"tensors of dtype {t.dtype} are not supported")
    written = 0

    def frame(kind: int, payload) -> None:
        nonlocal written
        header = _FRAME.pack(kind, len(payload))
        crc = zlib.crc32(payload, zlib.crc32(header))
        for piece in (header, payload, _CRC.pack(crc)):
            sink(piece)
        written += len(header) + len(payload) + _CRC.size

    sink(MAGIC + struct.pack("<H", VERSION))
    written += len(MAGIC) + 2
    frame(HEAD, msgpack.packb({"tensors": table}))
    frame(SKEL, skeleton)
    frames, data = 0, 0
    for t in tensors:
        buf = _host_bytes(t)
        for lo in range(0, len(buf), CHUNK):
            frame(DATA, buf[lo:lo + CHUNK])
            frames += 1
        data += len(buf)
    frame(END, msgpack.packb({"data_frames": frames, "data_bytes": data}))
    return written


def save(snapshot: dict, path: str, resolve=lambda t: t) -> int:
    """Writes atomically (gmux.util.atomic): a crash leaves the previous checkpoint whole."""
    with atomic_open(path) as f:
        return write(snapshot, f.write, resolve)


# -- reading ------------------------------------------------------------------------------------------------
class _Allowed(pickle.Unpickler):
    SAFE = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
            ("builtins", "complex"), ("gmux.job.checkpoint", "TensorRef")}

    def find_class(self, module, name):
        if (module, name) in self.SAFE:
            return TensorRef if name == "TensorRef" else super().find_class(module, name)
        raise pickle.UnpicklingError(f"a value of type {module}.{name}")


def _load_skeleton(data: bytes):
    return _Allowed(io.BytesIO(data)).load()


def _frames(read: Callable[[int], bytes], origin: str) -> Iterator[tuple[int, memoryview]]:
    head = read(len(MAGIC) + 2)
    if len(head) < len(MAGIC) + 2 or head[:len(MAGIC)] != MAGIC:
        raise CheckpointError(origin, "not a gmux checkpoint (bad magic bytes)")
    (version,) = struct.unpack("<H", head[len(MAGIC):])
    if version != VERSION:
        raise CheckpointError(origin, f"format version {version}; this gmux reads version {VERSION}")
    index = 0
    while True:
        header = read(_FRAME.size)
        if len(header) == 0:
            raise CheckpointError(origin, f"truncated: the stream ends after frame {index} without an END frame")
        if len(header) < _FRAME.size:
            raise CheckpointError(origin, f"truncated inside the header of frame {index}")
        kind, length = _FRAME.unpack(header)
        if kind not in (HEAD, SKEL, DATA, END):
            raise CheckpointError(origin, f"corrupt: frame {index} has unknown kind {kind}")
        if length > (CHUNK if kind == DATA else MAX_META):
            raise CheckpointError(origin, f"corrupt: frame {index} claims {length} bytes")
        payload = read(length)
        trailer = read(_CRC.size)
        if len(payload) < length or len(trailer) < _CRC.size:
            raise CheckpointError(origin, f"truncated inside frame {index}")
        if zlib.crc32(payload, zlib.crc32(header)) != _CRC.unpack(trailer)[0]:
            raise CheckpointError(origin, f"corrupt: checksum mismatch in frame {index}")
        yield kind, memoryview(payload)
        if kind == END:
            return
        index += 1


def _reader(source: BinaryIO) -> Callable[[int], bytearray]:
    """Exactly n bytes (fewer only at the end of the stream), into a writable buffer torch can wrap."""
    def read(n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = source.readinto(view[got:])
            if not k:
                break
            got += k
        view.release()
        if got < n:
            del buf[got:]
        return buf
    return read


def read(source: BinaryIO, origin: str) -> dict:
    """Reads and validates a whole checkpoint stream into a snapshot of host tensors."""
    frames = _frames(_reader(source), origin)
    try:
        kind, head = next(frames)
        if kind != HEAD:
            raise CheckpointError(origin, "corrupt: the first frame is not HEAD")
        table = _parse_table(msgpack.unpackb(head), origin)
        kind, skel = next(frames)
        if kind != SKEL:
            raise CheckpointError(origin, "corrupt: the second frame is not SKEL")
        try:
            skeleton = _load_skeleton(bytes(skel))
        except pickle.UnpicklingError as e:
            raise CheckpointError(origin, f"refused: the state holds {e}, which gmux never writes") from None
        tensors, data_frames = [], 0
        buffers = [torch.empty(nbytes, dtype=torch.uint8) for _, _, nbytes in table]
        slot, filled = 0, 0
        for kind, payload in frames:
            if kind == END:
                end = msgpack.unpackb(payload)
                if not isinstance(end, dict) or end.get("data_frames") != data_frames:
                    raise CheckpointError(origin, "corrupt: the END frame does not match the data read")
                break
            if kind != DATA:
                raise CheckpointError(origin, f"corrupt: unexpected frame kind {kind} among data")
            data_frames += 1
            view = torch.frombuffer(payload, dtype=torch.uint8) if len(payload) else torch.empty(0, dtype=torch.uint8)
            at = 0
            while at < len(payload):
                while slot < len(buffers) and filled == buffers[slot].numel():
                    slot, filled = slot + 1, 0
                if slot == len(buffers):
                    raise CheckpointError(origin, "corrupt: more tensor data than the table describes")
                take = min(len(payload) - at, buffers[slot].numel() - filled)
                buffers[slot][filled:filled + take].copy_(view[at:at + take])
                filled += take
                at += take
        while slot < len(buffers) and filled == buffers[slot].numel():
            slot, filled = slot + 1, 0
        if slot != len(buffers):
            raise CheckpointError(origin, "corrupt: less tensor data than the table describes")
    except StopIteration:
        raise CheckpointError(origin, "truncated: the stream ends before its data") from None
    except (msgpack.UnpackException, ValueError, TypeError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(origin, f"corrupt: {e}") from None
    for (dtype, shape, _), buf in zip(table, buffers):
        tensors.append(buf.view(_DTYPES[dtype]).reshape(shape))
    return _join(skeleton, tensors, origin)


def load(path: str) -> dict:
    origin = repr(path)
    try:
        with open(path, "rb") as f:
            return read(f, origin)
    except FileNotFoundError:
        raise CheckpointError(origin, "no such file") from None
    except IsADirectoryError:
        raise CheckpointError(origin, "is a directory") from None


def _parse_table(table, origin: str) -> list:
    if not isinstance(table, dict) or not isinstance(table.get("tensors"), list):
        raise CheckpointError(origin, "corrupt: the HEAD frame has no tensor table")
    rows = []
    for i, row in enumerate(table["tensors"]):
        if not (isinstance(row, list) and len(row) == 3 and row[0] in _DTYPES and isinstance(row[1], list)
                and all(isinstance(d, int) and d >= 0 for d in row[1]) and isinstance(row[2], int)):
            raise CheckpointError(origin, f"corrupt: tensor {i} is described as {row!r}")
        dtype, shape, nbytes = row
        count = 1
        for d in shape:
            count *= d
        if count * torch.empty(0, dtype=_DTYPES[dtype]).element_size() != nbytes:
            raise CheckpointError(origin, f"corrupt: tensor {i} ({dtype} {shape}) cannot hold {nbytes} bytes")
        rows.append(row)
    return rows


def _join(obj, tensors: list, origin: str):
    if isinstance(obj, TensorRef):
        if not 0 <= obj.index < len(tensors):
            raise CheckpointError(origin, f"corrupt: reference to tensor {obj.index} of {len(tensors)}")
        return tensors[obj.index]
    if isinstance(obj, dict):
        return type(obj)((k, _join(v, tensors, origin)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_join(v, tensors, origin) for v in obj)
    return obj
