"""The checkpoint format: a job's whole state as a versioned, checksummed stream of frames.

    MAGIC (8 bytes) | version (u16) | frame* | END frame
    frame = kind (u8) | length (u64) | payload | crc32 of kind+length+payload (u32)

Frames are HEAD (msgpack: the tensor table), SKEL (the nested structure with tensors replaced by references,
pickled, and read back by gmux.job.skeleton's bounded decoder of the pickle subset gmux writes, since a
checkpoint file is untrusted input), DATA (tensor bytes in table order, at most CHUNK bytes per frame) and END
(msgpack: frame count, data bytes and frames_crc32, the CRC-32 of the DATA frames' own checksums in order, so
a truncated stream is told from a complete one and DATA frames out of order from frames in order). Frames let
the same bytes go to a file or, chunk by chunk, to a socket, and let a reader name the exact place where a
stream is damaged.

Each byte of tensor data is checksummed once on each side (a move's bytes, 1 GiB of them, cross a link whose
own encryption authenticates them: these checksums are the end-to-end check, and the only ones). Version 1,
still read, checksummed the data a second time for END's data_crc32 (absent in its oldest files). Version 3 adds
sparse COO tensors (gmux.job.sparse_tensors); a stream without one is still written as version 2, as before.

A writer may mark tensors as zeros (`Zeros`): their rows stay in the table (dtype and shape) and are listed
in HEAD's "zeros", but no DATA carries them, and a reader gives them zeros. A job uses it for gradients its
loop is known to overwrite before they are read again (Job.grads_overwritten): a third of the bytes of a
model under SGD with momentum, a quarter under Adam. A reader from before "zeros" refuses such a stream (its
table claims more data than the stream carries).

A move's stream may leave out tensors its reader holds already (gmux.job.holdings): HEAD's "held" lists them
as [row, digest]; no DATA carries them, and the reader takes each from its own tensor with that digest, or
refuses the stream. Only a move's new process can read such a stream; files never hold one.

A reader checks the metadata first and allocates nothing until it has: the tensor table and the skeleton are read
and decoded with bounded memory and time, every tensor is referred to exactly once, the caller's `check`
(Job.restore: gmux.job.restore_check) compares them with the live job, and the table's claimed sizes are compared
with the bytes the file still holds. Only then are buffers allocated and the data read; the whole stream is
validated before `read` returns, and nothing is applied to a job until it has."""
from __future__ import annotations

import collections
import os
import pickle
import stat
import struct
from dataclasses import dataclass
from typing import BinaryIO, Callable, NamedTuple, Optional

import msgpack
import numpy as np
import torch

from gmux.util.atomic import atomic_open
from gmux.util.bounded_read import BoundedReader
from . import skeleton as _skeleton, sparse_tensors
from .checkpoint_error import CheckpointError
from .crc import crc32

MAGIC = b"GMUXCKPT"
VERSION, SPARSE_VERSION = 2, 3      # a stream of dense tensors only (older gmux reads it); one holding a sparse one
READS = (1, 2, 3)
HEAD, SKEL, DATA, END = 1, 2, 3, 4
_FRAME = struct.Struct("<BQ")
_CRC = struct.Struct("<I")
CHUNK = 16 << 20
MAX_META = 256 << 20  # a HEAD or SKEL frame larger than this is not one gmux wrote
MAX_FREE = 256 << 20  # tensors the job cannot vouch for (in state=), read from a stream of unknown length
MAX_RANK = 64

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128, torch.int64,
    torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2)}


@dataclass(frozen=True)
class TensorRef:
    index: int


@dataclass(frozen=True)
class Zeros:
    """A tensor in a snapshot to be written whose dtype and shape are recorded, not its values: it reads as zeros."""
    tensor: torch.Tensor


class Row(NamedTuple):
    """One tensor of the table: what the HEAD frame claims before any of its data is read."""
    dtype: str
    shape: tuple
    nbytes: int


# -- writing ------------------------------------------------------------------------------------------------
def _split(obj, tensors: list, zeros: list, sparse: list):
    if isinstance(obj, (np.float64, np.int64, np.bool_)):   # state["best"] = np.mean(...): computes as .item()
        return obj.item()
    if isinstance(obj, (np.generic, np.ndarray)):   # (a Python number or list would not compute like it)
        raise CheckpointError(f"the job's state holds a NumPy {obj.dtype} {'array' if obj.ndim else 'value'} "
                              f"({str(obj)[:40]}): store it as a tensor (torch.from_numpy), float(), int() or a list")
    if isinstance(obj, Zeros):
        obj = obj.tensor
        if obj.layout == torch.strided:      # (a sparse one is carried whole: zeroed indices are no tensor's)
            zeros.append(len(tensors))
    if isinstance(obj, torch.Tensor):
        if why := sparse_tensors.unstorable(obj):
            raise CheckpointError(f"the job holds {why}")
        if obj.layout != torch.strided:
            sparse.append(sparse_tensors.split(obj, lambda part: _split(part, tensors, zeros, sparse)))
            return sparse[-1]
        tensors.append(obj)
        return TensorRef(len(tensors) - 1)
    if type(obj) in _skeleton.MAPPINGS:        # (any other dict type is refused, by name, once pickled)
        return type(obj)({k: _split(v, tensors, zeros, sparse) for k, v in obj.items()})
    if type(obj) in (list, tuple):
        return type(obj)(_split(v, tensors, zeros, sparse) for v in obj)
    return obj


def host_bytes(t: torch.Tensor) -> memoryview:
    flat = t.detach().reshape(-1).cpu()     # (a CPU tensor's .cpu() is itself)
    return memoryview(flat.contiguous().view(torch.uint8).numpy()).cast("B")


def write(snapshot: dict, sink: Callable[[bytes], object],
          resolve: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
          announce: Optional[Callable[[int], object]] = None,
          held: Optional[Callable[[list], dict]] = None) -> int:
    """Serialises a captured job into `sink` (called with each piece of bytes); returns the bytes written.

    `resolve` maps a live tensor to the tensor holding its values (the host copy of a suspended tensor).
    `announce`, if given, is called before the first byte with an upper bound of the bytes to come (exact but
    for the END frame's checksum, whose encoding takes 1 to 5 bytes): what a stream tells its receiver first.
    `held`, given the live tensors in table order, names the rows the reader holds already ({row: digest}, a
    move's target: gmux.job.holdings); they are listed, not carried."""
    live, zeros, sparse = [], [], []     # the table's tensors, the rows of them written as zeros, the SparseRefs
    skeleton = pickle.dumps(_split(snapshot, live, zeros, sparse), protocol=5)
    tensors = [resolve(t) for t in live]
    try:
        _load_skeleton(skeleton)
    except _skeleton.SkeletonError as e:
        at = _skeleton.unstorable(snapshot, (torch.Tensor, Zeros, TensorRef, np.float64, np.int64, np.bool_))
        raise CheckpointError("(being written)", f"the job's state holds a value gmux cannot store{at}: {e}. A "
                              f"checkpoint holds numbers, strings, bytes, lists, tuples, dicts, deques, sets, tensors"
                              ) from None
    table = [[str(t.dtype).removeprefix("torch."), list(t.shape), t.numel() * t.element_size()] for t in tensors]
    for (dtype, *_), t in zip(table, tensors):
        if dtype not in DTYPES:
            raise CheckpointError("(being written)", f"tensors of dtype {t.dtype} are not supported")
    written = 0

    def frame(kind: int, payload) -> bytes:
        nonlocal written
        header = _FRAME.pack(kind, len(payload))
        trailer = _CRC.pack(crc32(payload, crc32(header)))
        for piece in (header, payload, trailer):
            sink(piece)
        written += len(header) + len(payload) + _CRC.size
        return trailer

    skip = set(zeros)
    held_rows = {i: d for i, d in (held(live) if held is not None else {}).items() if i not in skip}
    skip |= set(held_rows)
    head = {"tensors": table, **({"zeros": zeros} if zeros else {}),
            **({"held": sorted(held_rows.items())} if held_rows else {})}
    head = msgpack.packb(head)
    if announce is not None:
        carried = [row[2] for i, row in enumerate(table) if i not in skip]
        count = sum(-(-n // CHUNK) for n in carried)
        end = msgpack.packb({"data_frames": count, "data_bytes": sum(carried), "frames_crc32": 0xFFFFFFFF})
        overhead = _FRAME.size + _CRC.size
        announce(len(MAGIC) + 2 + len(head) + len(skeleton) + len(end) + sum(carried) + overhead * (count + 3))
    sink(MAGIC + struct.pack("<H", SPARSE_VERSION if sparse else VERSION))
    written += len(MAGIC) + 2
    frame(HEAD, head)
    frame(SKEL, skeleton)
    frames, data, crc = 0, 0, 0
    for i, t in enumerate(tensors):
        if i in skip:
            continue
        buf = host_bytes(t)
        for lo in range(0, len(buf), CHUNK):
            crc = crc32(frame(DATA, buf[lo:lo + CHUNK]), crc)
            frames += 1
        data += len(buf)
    frame(END, msgpack.packb({"data_frames": frames, "data_bytes": data, "frames_crc32": crc}))
    return written


def save(snapshot: dict, path: str, resolve=lambda t: t) -> int:
    """Writes atomically (gmux.util.atomic): a crash leaves the previous checkpoint whole."""
    with atomic_open(path) as f:
        return write(snapshot, f.write, resolve)


# -- reading ------------------------------------------------------------------------------------------------
def _make_ref(state) -> TensorRef:
    # BUILD sets a TensorRef's fields from a dict the file chose: only {'index': int} makes one.
    if type(state) is not dict or set(state) != {"index"} or type(state["index"]) is not int:
        raise _skeleton.SkeletonError("a tensor reference without an integer index")
    return TensorRef(state["index"])


_make_sparse = sparse_tensors.builder(TensorRef, MAX_RANK)
_ALLOWED = {("collections", "OrderedDict"): collections.OrderedDict, ("collections", "Counter"): collections.Counter,
            ("builtins", "set"): set, ("builtins", "frozenset"): frozenset, ("builtins", "complex"): complex,
            ("builtins", "bytearray"): bytearray, ("gmux.job.checkpoint", "TensorRef"): _make_ref,
            ("gmux.job.sparse_tensors", "SparseRef"): _make_sparse}


def _load_skeleton(data: bytes):
    return _skeleton.decode(data, (_make_ref, _make_sparse), _ALLOWED)


class _Frames:
    """A stream's frames, one at a time: `next` reads a header, then the payload comes whole (`payload`) or
    into the caller's buffers (`payload_into`, in pieces), and `close` checks the frame's checksum."""

    def __init__(self, read: BoundedReader, origin: str):
        self.read, self.origin, self.index = read, origin, 0
        head = read(len(MAGIC) + 2)
        if len(head) < len(MAGIC) + 2 or head[:len(MAGIC)] != MAGIC:
            raise CheckpointError(origin, "not a gmux checkpoint (bad magic bytes)")
        (self.version,) = struct.unpack("<H", head[len(MAGIC):])
        if self.version not in READS:
            raise CheckpointError(origin, f"format version {self.version}; this gmux reads versions "
                                          f"{', '.join(map(str, READS))}")
        self._crc = 0

    def next(self) -> tuple[int, int]:
        """The next frame's kind and payload length."""
        header = self.read(_FRAME.size)
        if len(header) == 0:
            raise CheckpointError(self.origin, f"truncated: the stream ends after frame {self.index} without an "
                                               f"END frame")
        if len(header) < _FRAME.size:
            raise CheckpointError(self.origin, f"truncated inside the header of frame {self.index}")
        kind, length = _FRAME.unpack(header)
        if kind not in (HEAD, SKEL, DATA, END):
            raise CheckpointError(self.origin, f"corrupt: frame {self.index} has unknown kind {kind}")
        if length > (CHUNK if kind == DATA else MAX_META):
            raise CheckpointError(self.origin, f"corrupt: frame {self.index} claims {length} bytes")
        self._crc = crc32(header)
        return kind, length

    def payload(self, length: int) -> memoryview:
        data = self.read(length)
        if len(data) < length:
            raise CheckpointError(self.origin, f"truncated or damaged: frame {self.index} says {length} bytes "
                                               f"follow, and only {len(data)} remain")
        self._crc = crc32(data, self._crc)
        return memoryview(data)

    def payload_into(self, view: memoryview) -> None:
        if (got := self.read.into(view)) < len(view):
            raise CheckpointError(self.origin, f"truncated or damaged: frame {self.index} says {len(view)} bytes "
                                               f"follow, and only {got} remain")
        self._crc = crc32(view, self._crc)

    def close(self) -> int:
        """Checks the frame just read against its trailer; returns the checksum (END's frames_crc32 chains
        the DATA frames' ones)."""
        trailer = self.read(_CRC.size)
        if len(trailer) < _CRC.size:
            raise CheckpointError(self.origin, f"truncated inside frame {self.index}")
        if self._crc != _CRC.unpack(trailer)[0]:
            raise CheckpointError(self.origin, f"corrupt: checksum mismatch in frame {self.index}")
        self.index += 1
        return self._crc

    def whole(self, expect: int, what: str) -> memoryview:
        """The next frame, which must be of kind `expect`, read whole and checked."""
        kind, length = self.next()
        if kind != expect:
            raise CheckpointError(self.origin, f"corrupt: the {what} frame is not {_KIND_NAMES[expect]}")
        payload = self.payload(length)
        self.close()
        return payload


_KIND_NAMES = {HEAD: "HEAD", SKEL: "SKEL", DATA: "DATA", END: "END"}
Check = Callable[[object, list], Optional[int]]


def read(source: BinaryIO, origin: str, check: Optional[Check] = None, into: Optional[dict] = None,
         holds: Optional[Callable[[bytes], Optional[torch.Tensor]]] = None) -> dict:
    """Reads and validates a whole checkpoint stream into a snapshot of host tensors.

    `check(skeleton, table)` is called once the metadata is decoded, before anything is allocated for the
    data; it raises CheckpointError for a checkpoint that does not fit, and returns how many of the table's
    bytes it has vouched for (checked against the live job), or None for none. `into` (table row -> a
    contiguous host tensor of the row's dtype and shape, as `check` leaves it) names tensors to read rows
    straight into instead of new buffers: they hold garbage if the checkpoint is then refused. `holds` finds
    the tensor this process holds with a digest (gmux.job.holdings.Offer.find): a row the stream lists as
    held takes that tensor's bytes; a stream with held rows and no `holds` is refused."""
    reader = BoundedReader(source, CHUNK)
    try:
        frames = _Frames(reader, origin)
        head = msgpack.unpackb(frames.whole(HEAD, "first"))
        table = _parse_table(head, origin)
        zeros = _parse_zeros(head, len(table), origin)
        held = _parse_held(head, table, zeros, holds, origin)
        skel = frames.whole(SKEL, "second")
        try:
            skeleton = _load_skeleton(skel)
        except _skeleton.SkeletonError as e:
            raise CheckpointError(origin, f"refused: the state holds {e}, which gmux never writes") from None
        _each_referred_once(skeleton, table, origin)
        vouched = check(skeleton, table) if check is not None else None
        _fits(table, zeros, held, reader.left, vouched, origin)
        buffers = _read_data(frames, table, zeros, held, origin, into or {})
        if reader(1):       # (a stream still arriving ends only once complete: gmux.wire.arriving)
            raise CheckpointError(origin, "corrupt: bytes after the END frame")
    except (msgpack.UnpackException, ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        # Untrusted input: whatever the checks above did not foresee is still refused, naming the file.
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(origin, f"corrupt: {type(e).__name__}: {_short(e)}") from None
    # set_, not views of the buffers: a view's base keeps the memory a suspend moves it out of (restored Adam state)
    return _join(skeleton, [torch.empty(0, dtype=DTYPES[r.dtype]).set_(b.view(DTYPES[r.dtype]).reshape(r.shape))
                            for r, b in zip(table, buffers)], origin)


def _fits(table: list, zeros: set, held: dict, left: Optional[int], vouched: Optional[int], origin: str) -> None:
    """Before any buffer is allocated: no more data than the file holds, no more zeros (gradients) than the rest
    (what they are gradients of); from a stream of unknown length, what the job vouched for + MAX_FREE at most."""
    need = sum(row.nbytes for row in table)
    zero = sum(table[i].nbytes for i in zeros)
    carried = need - zero - sum(table[i].nbytes for i in held)
    if left is not None and carried > left:
        raise CheckpointError(origin, f"corrupt: the tensor table claims {carried} bytes of tensor data, "
                                      f"but the file holds only {left} more bytes")
    if zero > need - zero:
        raise CheckpointError(origin, f"corrupt: the tensor table lists {zero} bytes of zeros, more than the "
                                      f"{need - zero} bytes of the tensors they are the gradients of")
    if left is None and need - (vouched or 0) > MAX_FREE:
        raise CheckpointError(origin, f"refused: the tensor table claims {need - (vouched or 0)} bytes of tensor "
                                      f"data the job does not hold (at most {MAX_FREE} from a stream)")


def _read_data(frames: _Frames, table: list, zeros: set, held: dict, origin: str, into: dict) -> list:
    # A held row's bytes are taken from its holder before anything is written (a holder may be another row's
    # `into`, which the data then overwrites); a row read into its own holder needs nothing.
    own = {i: into.get(i) is not None and into[i].device == holder.device and into[i].data_ptr() == holder.data_ptr()
           and into[i].is_contiguous() and holder.is_contiguous() for i, holder in held.items()}
    taken = {i: holder.detach().reshape(-1).view(torch.uint8).cpu().clone()
             for i, holder in held.items() if not own[i]}
    buffers = [torch.zeros(row.nbytes, dtype=torch.uint8) if i in zeros else
               into[i].view(-1).view(torch.uint8) if i in into else
               taken.pop(i) if i in taken else torch.empty(row.nbytes, dtype=torch.uint8)
               for i, row in enumerate(table)]
    for i, bytes_ in taken.items():        # (rows read into a tensor of the job's: their holder's bytes go there)
        buffers[i].copy_(bytes_)
    # DATA fills the other rows, in order; a zeros or held row is passed over like an empty one.
    carried = [memoryview(b.numpy()) for i, b in enumerate(buffers) if i not in zeros and i not in held]
    _fill(frames, carried, origin)
    return buffers


def _fill(frames: _Frames, buffers: list, origin: str) -> None:
    """Reads the DATA frames straight into `buffers` (memoryviews, in order), then checks END."""
    slot, filled, data_frames, data_bytes, chain, data_crc = 0, 0, 0, 0, 0, 0
    while True:
        kind, length = frames.next()
        if kind == END:
            end = msgpack.unpackb(frames.payload(length))
            frames.close()
            if not (isinstance(end, dict) and type(end.get("data_frames")) is int
                    and end["data_frames"] == data_frames and end.get("data_bytes") == data_bytes):
                raise CheckpointError(origin, "corrupt: the END frame does not match the data read")
            # (version 1's oldest files carry no data_crc32: read as they were)
            key, have = ("frames_crc32", chain) if frames.version >= 2 else ("data_crc32", data_crc)
            if end.get(key, have if frames.version == 1 else None) != have:
                raise CheckpointError(origin, "corrupt: the tensor data is not what was written "
                                              "(DATA frames missing, repeated or out of order)")
            break
        if kind != DATA:
            raise CheckpointError(origin, f"corrupt: unexpected frame kind {kind} among data")
        data_frames += 1
        data_bytes += length
        at = 0
        while at < length:
            while slot < len(buffers) and filled == len(buffers[slot]):
                slot, filled = slot + 1, 0
            if slot == len(buffers):
                raise CheckpointError(origin, "corrupt: more tensor data than the table describes")
            take = min(length - at, len(buffers[slot]) - filled)
            piece = buffers[slot][filled:filled + take]
            frames.payload_into(piece)
            if frames.version == 1:      # version 1 checksummed the data again, for END's data_crc32
                data_crc = crc32(piece, data_crc)
            filled += take
            at += take
        chain = crc32(_CRC.pack(frames.close()), chain)
    while slot < len(buffers) and filled == len(buffers[slot]):
        slot, filled = slot + 1, 0
    if slot != len(buffers):
        raise CheckpointError(origin, "corrupt: less tensor data than the table describes")


def load(path: str, check: Optional[Check] = None) -> dict:
    origin = repr(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)   # a FIFO must not hold this process in open()
    except FileNotFoundError:
        raise CheckpointError(origin, "no such file") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(origin, "is not a regular file")
    with open(fd, "rb") as f:
        return read(f, origin, check)


def _parse_table(table, origin: str) -> list:
    if not isinstance(table, dict) or not isinstance(table.get("tensors"), list):
        raise CheckpointError(origin, "corrupt: the HEAD frame has no tensor table")
    rows = []
    for i, row in enumerate(table["tensors"]):
        if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str) and row[0] in DTYPES
                and isinstance(row[1], list) and len(row[1]) <= MAX_RANK
                and all(type(d) is int and d >= 0 for d in row[1]) and type(row[2]) is int):
            raise CheckpointError(origin, f"corrupt: tensor {i} is described as {_short(row)}")
        dtype, shape, nbytes = row
        count = 1
        for d in shape:
            count *= d
        if count * torch.empty(0, dtype=DTYPES[dtype]).element_size() != nbytes:
            raise CheckpointError(origin, f"corrupt: tensor {i} ({dtype} {shape}) cannot hold {nbytes} bytes")
        rows.append(Row(dtype, tuple(shape), nbytes))
    return rows


def _parse_zeros(head: dict, count: int, origin: str) -> set:
    zeros = head.get("zeros", [])
    if not (isinstance(zeros, list) and all(type(i) is int and 0 <= i < count for i in zeros)
            and len(set(zeros)) == len(zeros)):
        raise CheckpointError(origin, f"corrupt: the HEAD frame's zeros are {_short(zeros)}")
    return set(zeros)


def _parse_held(head: dict, table: list, zeros: set, holds, origin: str) -> dict:
    """HEAD's "held" rows, each with the tensor of this process that holds its bytes: {row: tensor}."""
    pairs = head.get("held", [])
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 and type(p[0]) is int
                                              and 0 <= p[0] < len(table) and p[0] not in zeros
                                              and isinstance(p[1], bytes) for p in pairs):
        raise CheckpointError(origin, f"corrupt: 'held' is {_short(pairs)}, not [row, digest] pairs of distinct "
                                      f"rows that carry data")
    if len({p[0] for p in pairs}) != len(pairs):
        raise CheckpointError(origin, "corrupt: 'held' names a row twice")
    if pairs and holds is None:
        raise CheckpointError(origin, f"refused: {len(pairs)} of its tensors were left out as ones a move's new "
                                      f"process holds; it can only be restored there")
    held = {}
    for row, d in pairs:
        holder = holds(d)
        if holder is None:
            raise CheckpointError(origin, f"refused: tensor {row} was left out as one this process holds, and it "
                                          f"holds none with digest {d.hex()}")
        if holder.numel() * holder.element_size() != table[row].nbytes:
            raise CheckpointError(origin, f"refused: tensor {row} is {table[row].nbytes} bytes, the tensor this "
                                          f"process holds with its digest {holder.numel() * holder.element_size()}")
        held[row] = holder
    return held


def _short(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _each_referred_once(skeleton, table: list, origin: str) -> None:
    """Every tensor of the table appears exactly once in the skeleton (as gmux writes it; a sparse tensor's two
    rows by its SparseRef, which they must fit): no table row is read without a place to go, and no place receives
    another's data. The skeleton is bounded (size and depth, gmux.job.skeleton), so this walk is too."""
    count = len(table)
    seen = [False] * count
    stack = [skeleton]
    while stack:
        obj = stack.pop()
        if isinstance(obj, TensorRef):
            if not 0 <= obj.index < count:
                raise CheckpointError(origin, f"corrupt: reference to tensor {obj.index} of {count}")
            if seen[obj.index]:
                raise CheckpointError(origin, f"corrupt: tensor {obj.index} is referred to twice")
            seen[obj.index] = True
        elif isinstance(obj, sparse_tensors.SparseRef):
            stack.extend(sparse_tensors.rows(obj, table, origin))
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    if not all(seen):
        raise CheckpointError(origin, f"corrupt: tensor {seen.index(False)} of the table is never referred to")


def _join(obj, tensors: list, origin: str):
    if isinstance(obj, TensorRef):
        return tensors[obj.index]                     # in range: _each_referred_once
    if isinstance(obj, sparse_tensors.SparseRef):     # (its indices checked here: still before read returns)
        return sparse_tensors.join(obj, tensors, origin)
    if isinstance(obj, dict):      # dict, OrderedDict or Counter (the decoder builds no other): from a mapping
        return type(obj)({k: _join(v, tensors, origin) for k, v in obj.items()})
    if isinstance(obj, (list, tuple)):
        return type(obj)(_join(v, tensors, origin) for v in obj)
    return obj
