"""Moving a checkpoint file between machines over ZeroMQ: chunked, checksummed, resumable.

Sender (a DEALER, CurveZMQ client) -> receiver (hosted on a CurveZMQ ROUTER by a daemon's cluster link or by
gmux-scheduler). See the xfer_* messages in gmux/protocol.py.

- Chunks of CHUNK bytes travel as [header, raw bytes]; up to WINDOW chunks are in flight, so the link is never
  idle waiting for an acknowledgement.
- Sealed, beside Curve, where the receiver offers it: the sender puts a fresh key in xfer_begin; a receiver with
  a bulk socket (a daemon's cluster link, gmux-scheduler) answers with its port, and the chunks and their acknowledgements go
  there sealed with AES-GCM (gmux.wire.sealed), a third of Curve's time per byte; begin and end stay on
  Curve. Otherwise (a receiver without one, GMUX_BULK=curve, no `cryptography`) the chunks go through Curve.
- The receiver appends a chunk only if it starts exactly where its file ends; every answer says how much it
  holds ("have"). A sender that hears a smaller "have" than it expected rewinds to it.
- No checksum of its own: every message is authenticated by CurveZMQ (Poly1305: a changed byte fails the
  message), and what travels is a checkpoint whose frames carry their own checksums, checked by its reader
  (gmux.job.checkpoint) on the other side. A checksum here as well cost a pass over every byte on each side
  (0.8 s per GiB each on this VM), a third of a move's CPU.
- A dropped connection shows as silence: after `timeout` the sender opens a new connection, sends begin again,
  learns "have" and goes on from there (bytes already received are not sent again). A receiver that restarted
  also answers from the length of its partial file.
- At the end the receiver checks it holds the whole size, fsyncs and renames the partial file to NAME.ckpt: a
  reader sees a complete file or none. A reader that cannot wait for that (a move's new process, restoring as
  the bytes arrive) follows the partial file (gmux.wire.follow).
- A stream (send_stream: a checkpoint read from a pipe as the job writes it, never staged in a file) announces
  an upper bound of its size first and its exact size at the end; the sender keeps the chunks not yet
  acknowledged (at most WINDOW), so it resumes after a cut like a file does, from what the receiver holds.
- A receiver that need not outlive a crash (durable=False: a move's target, whose source still holds the job
  until the target has restored it) renames without fsync.
- A host that serves many senders in one loop (gmux-scheduler) passes `later` and gets its answers to xfer_end
  from `finished()`: the fsync runs on a thread of the receiver's, since on a disk another tenant saturates one
  takes seconds, and a loop held that long stops hearing every machine's reports. The answer still comes only
  once the bytes are on disk: a sender drops its own copy when it hears it.
- xfer_holds asks what the process waiting for a transfer already holds (gmux.job.holdings: it wrote that
  beside the partial file); a move's source asks before it suspends (`ask_holds`) and leaves those tensors out.
- A partial file nobody has added to for STALE_S (its sender gave up, or died) is deleted by `expire`, which
  the hosts of a receiver call as they tick; a sender that comes back later starts that file again.
"""
from __future__ import annotations

import itertools
import os
import queue
import stat
import struct
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import zmq

from gmux import protocol
from gmux.wire import keys, sealed

# 1 MiB: a message (and its reply) costs Python time on both ends; a quarter of the messages of 256 KiB chunks
# gave 64 MiB moves 0.90-0.94 of issue 15's downtime bound against 0.95-1.11 (three runs each, this VM)
CHUNK = 1 << 20
WINDOW = 16          # 16 MiB in flight
STALE_S = 600.0      # far beyond a sender's reconnect timeout: a partial file this idle is abandoned


def rank_xfers(base: str, ranks: int) -> list:
    """The transfer names of a job's checkpoints, one per rank, taken together under one name."""
    return [f"{base}.{r}" for r in range(ranks)]


def partial_path(path: str) -> str:
    """Where a receiver appends the bytes of NAME.ckpt until its transfer completes."""
    return path.removesuffix(".ckpt") + ".part"


class TransferError(RuntimeError):
    """A transfer that could not complete; the text says where and why."""


class Receiver:
    """Keeps incoming checkpoints in `directory`; `handle` answers one xfer_* message (never raises on bad input
    from a peer: the problem goes back as an error reply)."""

    LATER = object()    # handle's answer to an xfer_end whose fsync runs in the background: see finished()

    def __init__(self, directory: str, durable: bool = True, bulk_port: Optional[int] = None):
        self.dir = directory
        self.durable = durable
        self.flushing: dict[str, dict] = {}   # transfer -> its state while its fsync runs, with who waits for it
        self._flushed: queue.SimpleQueue = queue.SimpleQueue()
        self._flusher: Optional[ThreadPoolExecutor] = None
        self.bulk_port = bulk_port            # where the host's bulk socket takes sealed chunks (or None)
        self.sealed_bytes = 0                 # appended from sealed chunks
        self.dropped_sealed = 0
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.open: dict[str, dict] = {}
        self.completed = 0
        self.rejected_chunks = 0
        self.expired = 0
        self._swept = 0.0

    def path(self, xfer: str) -> str:
        return os.path.join(self.dir, f"{xfer}.ckpt")

    def handle(self, msg: protocol.Message, data: Optional[bytes], later=None) -> tuple[bool, object]:
        """(ok, reply data or error text). A transfer this machine cannot store (its disk full, say) is given
        up here, its partial file deleted: the sender hears why, and a move fails with its job at its source.
        With `later` (whatever the host needs to answer this message), a durable xfer_end answers (True, LATER)
        and its answer comes from finished() once the file is on disk."""
        try:
            return self._handle(msg, data, later)
        except OSError as e:
            x = msg["xfer"]
            if x in self.open:
                self._discard(x)
            return False, f"{msg.type} {x}: cannot store it on this machine: {e.strerror or e}"

    def _handle(self, msg: protocol.Message, data: Optional[bytes], later) -> tuple[bool, object]:
        x = msg["xfer"]
        if x in self.flushing:
            return self._while_flushing(x, msg, later)
        if msg.type == "xfer_begin":
            have = self._begin(x, msg["size"], msg.get("seal"))
            return True, {"have": have, **({"bulk": self.bulk_port} if self.open[x]["seal"] else {})}
        if msg.type == "xfer_holds":
            return True, {"holds": self._holds(x)}
        st = self.open.get(x)
        if st is None:
            return False, f"{msg.type}: no transfer {x!r} in progress (send xfer_begin first)"
        st["seen"] = time.time()
        if msg.type == "xfer_chunk":
            if data is None or len(data) > protocol.XFER_MAX_CHUNK or len(data) == 0:
                return False, f"xfer_chunk {x}: needs one data frame of 1..{protocol.XFER_MAX_CHUNK} bytes"
            return True, {"have": self._append(st, msg["offset"], data)}
        # xfer_end (a stream's begin gave a bound; its end says the size)
        size = msg.get("size", st["size"])
        if st["have"] != size or size > st["size"]:
            return False, f"xfer_end {x}: holds {st['have']} of {size} bytes"
        del self.open[x]
        if self.durable and later is not None:
            self._flush_later(x, st, later)
            return True, self.LATER
        try:
            if self.durable:
                os.fsync(st["fd"])
        finally:
            os.close(st["fd"])
        return True, self._complete(x, size)

    def _complete(self, x: str, size: int) -> dict:
        os.rename(self._part(x), self.path(x))
        self.completed += 1
        return {"have": size, "path": self.path(x)}

    def _flush_later(self, x: str, st: dict, later) -> None:
        if self._flusher is None:
            self._flusher = ThreadPoolExecutor(1, thread_name_prefix="gmux-fsync")
        self.flushing[x] = {"size": st["have"], "fd": st["fd"], "waiters": [later]}
        future = self._flusher.submit(os.fsync, st["fd"])
        future.add_done_callback(lambda f: self._flushed.put((x, f.exception())))

    def _while_flushing(self, x: str, msg: protocol.Message, later) -> tuple[bool, object]:
        """A sender that heard nothing while its file was being written to disk, and asks again: it holds
        everything, and its end is answered with the first one's."""
        fl = self.flushing[x]
        if msg.type == "xfer_begin" and msg["size"] == fl["size"]:
            return True, {"have": fl["size"]}
        if msg.type == "xfer_end" and later is not None and msg.get("size", fl["size"]) == fl["size"]:
            fl["waiters"].append(later)
            return True, self.LATER
        return False, f"{msg.type} {x}: its transfer of {fl['size']} bytes is being written to disk; ask again"

    def finished(self):
        """(later, ok, answer) for each xfer_end answered LATER whose fsync has ended since the last call: the
        completed file's figures, or why it could not be kept (its partial file is gone then)."""
        while True:
            try:
                x, error = self._flushed.get_nowait()
            except queue.Empty:
                return
            fl = self.flushing.pop(x)
            os.close(fl["fd"])
            if error is None:
                try:
                    ok, answer = True, self._complete(x, fl["size"])
                except OSError as e:
                    error = e
            if error is not None:
                self._unlink_part(x)
                ok, answer = False, f"xfer_end {x}: cannot store it on this machine: {error.strerror or error}"
            for later in fl["waiters"]:
                yield later, ok, answer

    def _append(self, st: dict, off: int, data: bytes) -> int:
        """Appends a chunk if it starts where the file ends; returns how much the file holds."""
        if off != st["have"] or off + len(data) > st["size"]:
            self.rejected_chunks += 1         # out of place (after a loss): the sender rewinds
            return st["have"]
        view = memoryview(data)
        while view:                           # (a short write: the disk filled up, and the next one says so)
            view = view[os.write(st["fd"], view):]
        st["have"] += len(data)
        return st["have"]

    def handle_sealed(self, header: bytes, data: bytes) -> Optional[bytes]:
        """The answer to [header, data] from the host's bulk socket (gmux.wire.sealed), or None: what is not a
        chunk sealed with the key of a transfer open here is dropped unanswered (anyone may send it)."""
        try:
            msg = protocol.decode(header, protocol.BULK_MESSAGES)
        except protocol.ProtocolError:
            msg = None
        x = msg["xfer"] if msg is not None and msg.type == "xfer_sealed" else None
        st = self.open.get(x)
        seal = st["seal"] if st is not None else None
        if seal is None or not sealed.TAG_BYTES < len(data) <= protocol.XFER_MAX_CHUNK + sealed.TAG_BYTES:
            self.dropped_sealed += 1
            return None
        try:
            chunk = seal.open(header, msg["nonce"], data)
        except sealed.Unsealed:
            self.dropped_sealed += 1
            return None
        st["seen"] = time.time()
        try:
            had = st["have"]
            answer = {"have": self._append(st, msg["offset"], chunk)}
            self.sealed_bytes += answer["have"] - had
        except OSError as e:
            self._discard(x)
            answer = {"error": f"xfer_sealed {x}: cannot store it on this machine: {e.strerror or e}"}
        nonce, body = seal.seal_answer(msg.id, answer)
        return protocol.reply(msg.id, data={"nonce": nonce, "sealed": body})

    def _holds(self, x: str) -> bytes:
        """What the process that waits for transfer `x` offers (gmux.job.holdings, a file it wrote here); a file
        that is not a regular one of at most HOLDS_MAX digests offers nothing."""
        limit = protocol.HOLDS_MAX * protocol.HOLDS_DIGEST_BYTES
        try:
            fd = _open_regular(self._offer(x))
        except OSError:
            return b""
        try:
            wire = os.read(fd, limit + 1)
        finally:
            os.close(fd)
        return wire if protocol.holds_problem(wire) is None else b""

    def _offer(self, x: str) -> str:
        return self.path(x).removesuffix(".ckpt") + ".holds"

    def _part(self, x: str) -> str:
        return partial_path(self.path(x))

    def _begin(self, x: str, size: int, key: Optional[bytes] = None) -> int:
        """Opens (or finds again) transfer `x`; its chunks may come sealed with `key` (each begin brings a new
        one) if this host has a bulk socket."""
        seal = sealed.seal_or_none(key) if self.bulk_port else None
        st = self.open.get(x)
        if st is not None and st["size"] == size:
            st["seal"] = seal
            return st["have"]                  # a resume on a new connection
        if st is not None:
            self._discard(x)
        if os.path.exists(self.path(x)) and os.path.getsize(self.path(x)) == size:
            os.unlink(self.path(x))            # the same name again: a retry of a finished transfer; take it anew
        # A partial file left by a receiver that restarted was appended only with whole chunks of CHUNK bytes; a
        # torn last chunk is cut off.
        fd = os.open(self._part(x), os.O_RDWR | os.O_CREAT, 0o600)
        have = os.fstat(fd).st_size
        if have > size:
            have = 0
        have -= have % CHUNK
        os.ftruncate(fd, have)
        os.lseek(fd, have, os.SEEK_SET)
        self.open[x] = {"size": size, "have": have, "fd": fd, "seen": time.time(), "seal": seal}
        return have

    def expire(self, now: Optional[float] = None, every: float = 30.0) -> int:
        """Deletes partial files idle for STALE_S (open here, or left by a receiver that stopped); returns how
        many. Looks at most once every `every` seconds, so a host may call it on every tick."""
        now = time.time() if now is None else now
        if now - self._swept < every:
            return 0
        self._swept = now
        gone = [x for x, st in self.open.items() if now - st["seen"] > STALE_S]
        for x in gone:
            self._discard(x)
        busy = self.open.keys() | self.flushing.keys()
        for f in os.listdir(self.dir):
            path = os.path.join(self.dir, f)
            if f.endswith(".holds") or f.endswith(".part") and f[:-len(".part")] not in busy:
                try:
                    if now - os.path.getmtime(path) > STALE_S:
                        os.unlink(path)
                        gone.append(f)
                except FileNotFoundError:
                    pass
        self.expired += len(gone)
        return len(gone)

    def _discard(self, x: str) -> None:
        st = self.open.pop(x)
        os.close(st["fd"])
        self._unlink_part(x)

    def _unlink_part(self, x: str) -> None:
        try:
            os.unlink(self._part(x))
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Closes every open file; fsyncs under way are waited for (their partial files stay, as a restarted
        receiver finds them, and their senders, unanswered, send again)."""
        if self._flusher is not None:
            self._flusher.shutdown(wait=True)
        for st in [*self.open.values(), *self.flushing.values()]:
            os.close(st["fd"])
        self.open.clear()
        self.flushing.clear()


def _open_regular(path: str) -> int:
    """A file opened to read, not through a symlink and only if it is a regular one (an OSError otherwise): a
    link sends, and serves, files from directories others may write, where a planted link could point at a
    file only root may read, or a pipe that never ends."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path}: not a regular file")
    return fd


class _File:
    """What a sender sends from a file: any part, at any time."""

    def __init__(self, path: str):
        self.fd = _open_regular(path)
        self.size = os.fstat(self.fd).st_size
        self.final: Optional[int] = None      # a file's size is told at its begin

    def get(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, min(n, self.size - offset), offset) if offset < self.size else b""

    def release(self, upto: int) -> None:
        pass

    def close(self) -> None:
        os.close(self.fd)


class _Stream:
    """What a sender sends from a stream read once: `read(n)` gives n bytes (fewer only at its end). It starts
    with its size's upper bound (8 bytes, little-endian); the chunks not yet acknowledged are kept for resending."""

    def __init__(self, read: Callable[[int], bytes], chunk: int):
        head = read(8)
        if len(head) != 8:
            raise TransferError("the stream ended before its length")
        (self.size,) = struct.unpack("<Q", head)
        self.read, self.chunk = read, chunk
        self.kept: deque = deque()           # (offset, bytes), in order, from the oldest unacknowledged
        self.produced = 0
        self.final: Optional[int] = None      # the exact size, once the stream has ended

    def get(self, offset: int, n: int) -> bytes:
        if offset < self.produced:
            if not self.kept or offset < self.kept[0][0]:
                raise TransferError(f"the receiver holds {offset} bytes, fewer than this sender still keeps")
            data = self.kept[(offset - self.kept[0][0]) // self.chunk][1]
            return data[:n]
        if offset > self.produced:
            raise TransferError(f"the receiver holds {offset} bytes, more than this stream has given")
        if self.final is not None:
            return b""
        data = self.read(n)
        if len(data) < n:
            self.final = self.produced + len(data)
        if self.produced + len(data) > self.size:
            raise TransferError(f"the stream is longer than the {self.size} bytes it announced")
        if data:
            self.kept.append((offset, data))
            self.produced += len(data)
        return data

    def release(self, upto: int) -> None:
        while self.kept and self.kept[0][0] + len(self.kept[0][1]) <= upto:
            self.kept.popleft()

    def close(self) -> None:
        self.kept.clear()


def send_file(path: str, endpoint: str, server_key: bytes, keydir: str, role: str, name: Optional[str],
              xfer: str, **options) -> dict:
    """Sends `path` to the receiver at `endpoint` as transfer `xfer`; blocks until it is verified there.
    Returns figures: bytes, seconds, resent bytes, reconnects, path on the receiver. Options: see _send."""
    return _send(_File(path), endpoint, server_key, keydir, role, name, xfer, **options)


def send_stream(read: Callable[[int], bytes], endpoint: str, server_key: bytes, keydir: str, role: str,
                name: Optional[str], xfer: str, **options) -> dict:
    """Sends a stream as transfer `xfer` as it is read (see _Stream), pipelined with whoever writes it; blocks
    until it is verified there. A stream that ends short of a complete checkpoint is the reader's to refuse."""
    chunk = options.get("chunk", CHUNK)
    return _send(_Stream(read, chunk), endpoint, server_key, keydir, role, name, xfer, **options)


def ask_holds(endpoint: str, server_key: bytes, keydir: str, role: str, name: Optional[str], xfer: str,
              timeout: float = 5.0, context: Optional[zmq.Context] = None) -> bytes:
    """What the process waiting for transfer `xfer` at `endpoint` offers (digests, gmux.job.holdings); empty
    if it offers nothing or cannot be asked: then the whole checkpoint goes, as before there were offers."""
    ctx = context or zmq.Context.instance()
    sock = keys.client_socket(ctx, zmq.DEALER, keydir, role, name, server_key)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, max(1, int(timeout * 1000)))
        sock.connect(endpoint)
        sock.send(protocol.encode("xfer_holds", 1, table=protocol.CLUSTER_MESSAGES, xfer=xfer))
        deadline = time.monotonic() + timeout
        while sock.poll(max(0.0, deadline - time.monotonic()) * 1000):
            rep = protocol.decode(sock.recv(), protocol.CLUSTER_MESSAGES)
            if rep.type == "reply" and rep.id == 1:
                holds = (rep.get("data") or {}).get("holds", b"") if rep.get("ok") else b""
                return holds if protocol.holds_problem(holds) is None else b""
    except (zmq.ZMQError, protocol.ProtocolError, AttributeError):
        pass
    finally:
        sock.close(0)
    return b""


def _send(src, endpoint: str, server_key: bytes, keydir: str, role: str, name: Optional[str],
          xfer: str, timeout: float = 10.0, attempts: int = 6, context: Optional[zmq.Context] = None,
          chunk: int = CHUNK, window: int = WINDOW, on_connect: Optional[Callable[[int], None]] = None,
          before_end: Optional[Callable[[], None]] = None) -> dict:
    """The sender of both: `before_end` (if given) runs once all bytes are acknowledged, before the transfer is
    completed, and may raise to leave it incomplete (a stream whose writer has not vouched for it)."""
    ctx = context or zmq.Context.instance()
    ids = itertools.count(1)
    t0 = time.perf_counter()
    resent = 0
    sent_max = 0
    reconnects = -1
    rewinds = 0
    sealed_bytes = 0
    sock = bulk = None
    try:
        for attempt in range(attempts):
            reconnects += 1
            for s in (sock, bulk):
                if s is not None:
                    s.close(0)
            bulk = None
            if on_connect is not None:
                on_connect(attempt)
            sock = keys.client_socket(ctx, zmq.DEALER, keydir, role, name, server_key)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, window * 4)
            # A DEALER's send waits for a peer, and a receiver that refuses our key never becomes one: a send
            # that waits `timeout` counts as that connection's silence.
            sock.setsockopt(zmq.SNDTIMEO, max(1, int(timeout * 1000)))
            sock.connect(endpoint)
            epoch = next(ids)

            def call(mtype, data=None, **fields):
                frames = [protocol.encode(mtype, epoch, table=protocol.CLUSTER_MESSAGES, xfer=xfer, **fields)]
                if data is not None:
                    frames.append(data)
                try:
                    sock.send_multipart(frames, copy=data is None or len(data) < 65536)
                except zmq.Again:
                    return False
                return True

            def answer():
                """The next reply of this connection, or None after `timeout` of silence."""
                while sock.poll(timeout * 1000):
                    rep = protocol.decode(sock.recv(), protocol.CLUSTER_MESSAGES)
                    if rep.type != "reply" or rep.id != epoch:
                        continue
                    if not rep.get("ok"):
                        raise TransferError(f"receiver at {endpoint} refused {xfer}: {rep.get('error')}")
                    return rep.get("data") or {}
                return None

            key = sealed.new_key() if sealed.available() else None
            if not call("xfer_begin", size=src.size, **({"seal": key} if key else {})):
                continue
            rep = answer()
            if rep is None:
                continue
            offset = int(rep["have"])
            port = rep.get("bulk") if key else None
            if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
                bulk = sealed.BulkSender(ctx, endpoint, port, key, xfer, window, timeout)

                def send_chunk(data, offset):
                    return bulk.send(epoch, data, offset)

                def chunk_answer():
                    got = bulk.answer(epoch)
                    if got is not None and "error" in got:
                        raise TransferError(f"receiver at {endpoint} refused {xfer}: {got['error']}")
                    return got
            else:
                def send_chunk(data, offset):
                    return call("xfer_chunk", data=data, offset=offset)
                chunk_answer = answer
            inflight: deque = deque()
            lost = False
            while True:
                while len(inflight) < window:
                    data = src.get(offset, chunk)
                    if not data:
                        break
                    if offset < sent_max:
                        resent += len(data)
                    if not send_chunk(data, offset):
                        lost = True
                        break
                    if bulk is not None:
                        sealed_bytes += len(data)
                    offset += len(data)
                    sent_max = max(sent_max, offset)
                    inflight.append(offset)
                if lost or not inflight:
                    break
                rep = chunk_answer()
                if rep is None:
                    lost = True
                    break
                have = int(rep["have"])
                if have == inflight[0]:
                    inflight.popleft()
                    src.release(have)
                    continue
                # A chunk was refused (damaged, or out of place after a loss): go back to what it holds, on a
                # fresh epoch so the answers to the chunks already on the wire are not mistaken for new ones.
                epoch = next(ids)
                rewinds += 1
                inflight.clear()
                offset = have
            if lost:
                continue
            if before_end is not None:
                before_end()
            if not call("xfer_end", **({} if src.final is None else {"size": src.final})):
                continue
            rep = answer()
            if rep is None:
                continue
            seconds = time.perf_counter() - t0
            size = src.size if src.final is None else src.final
            return {"bytes": size, "seconds": seconds, "resent": resent, "reconnects": reconnects,
                    "rewinds": rewinds, "sealed_bytes": sealed_bytes, "path": rep.get("path"),
                    "gib_per_s": size / max(seconds, 1e-9) / (1 << 30)}
        raise TransferError(f"sending {xfer} ({src.size} bytes) to {endpoint}: no answer after {attempts} "
                            f"connections of {timeout:g} s silence each (is the receiving gmuxd up, and is its key "
                            f"in the key directory?)")
    finally:
        src.close()
        for s in (sock, bulk):
            if s is not None:
                s.close(0)

