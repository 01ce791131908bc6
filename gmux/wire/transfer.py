"""Moving a checkpoint between machines over ZeroMQ, the sending end: chunked, resumable.

Sender (a DEALER, CurveZMQ client) -> receiver (hosted on a CurveZMQ ROUTER by a daemon's cluster link or by
gmux-scheduler). See the xfer_* messages in gmux/protocol.py.

- Chunks of CHUNK bytes travel as [header, raw bytes]; up to WINDOW chunks are in flight, so the link is never
  idle waiting for an acknowledgement.
- Sealed, beside Curve, where the receiver offers it: the sender puts a fresh key in xfer_begin; a receiver with
  a bulk socket (a daemon's cluster link, gmux-scheduler) answers with its port, and the chunks and their
  acknowledgements go there sealed with AES-GCM (gmux.wire.sealed), a third of Curve's time per byte; begin and
  end stay on Curve. Otherwise (a receiver without one, GMUX_BULK=curve, no `cryptography`) the chunks go through Curve.
- The receiver (gmux.wire.receiver) appends a chunk only where its file ends and answers how much it holds
  ("have"); a sender that hears a smaller "have" than it expected rewinds to it.
- No checksum of its own: every message is authenticated by CurveZMQ (Poly1305: a changed byte fails the
  message), and what travels is a checkpoint whose frames carry their own checksums, checked by its reader
  (gmux.job.checkpoint) on the other side. A checksum here as well cost a pass over every byte on each side
  (0.8 s per GiB each on this VM), a third of a move's CPU.
- A dropped connection shows as silence: after `timeout` the sender opens a new connection, sends begin again,
  learns "have" and goes on from there (bytes already received are not sent again). A receiver that restarted
  also answers from the length of its partial file.
- The transfer completes once the receiver holds the whole size (and, where it must survive a crash, has it
  on disk).
- A stream (send_stream: a checkpoint read from a pipe as the job writes it, never staged in a file) announces
  an upper bound of its size first and its exact size at the end; the sender keeps the chunks not yet
  acknowledged (at most WINDOW), so it resumes after a cut like a file does, from what the receiver holds.
- A receiver that feeds a process as the bytes arrive (gmux.wire.piped) answers how much more it takes now
  ("room"): the sender keeps no more than that in flight; with no room, it waits (PAUSE_S, doubling to
  PAUSE_MAX_S) and asks again with an empty chunk. A receiver that takes nothing for as long as the sender
  would wait through silences fails the transfer: the process it feeds has stopped reading.
- A move's source asks what the process waiting for a transfer already holds (`ask_holds`, xfer_holds) before
  it suspends, and leaves those tensors out.
- A send given up by its caller (`stop`, an event: a move whose target restarted its gmuxd, whose endpoint is
  dead) ends within STOP_LOOK_S of any wait for an answer, not after `attempts` silences of `timeout`.
"""
from __future__ import annotations

import itertools
import os
import stat
import struct
import threading
import time
from collections import deque
from typing import Callable, Optional

import zmq

from gmux import protocol
from gmux.wire import keys, sealed

# 1 MiB: a message (and its reply) costs Python time on both ends; a quarter of the messages of 256 KiB chunks
# gave 64 MiB moves 0.90-0.94 of issue 15's downtime bound against 0.95-1.11 (three runs each, this VM)
CHUNK = 1 << 20
WINDOW = 16          # 16 MiB in flight
PAUSE_S, PAUSE_MAX_S = 0.002, 0.1     # while a receiver has no room, between asking again
STOP_LOOK_S = 0.2    # how often a wait for an answer looks whether its send was given up


def _room(answer: dict) -> Optional[int]:
    """How many more bytes the receiver takes now, if it says (a valid count), else None."""
    room = answer.get("room")
    return room if isinstance(room, int) and not isinstance(room, bool) and room >= 0 else None


def rank_xfers(base: str, ranks: int) -> list:
    """The transfer names of a job's checkpoints, one per rank, taken together under one name."""
    return [f"{base}.{r}" for r in range(ranks)]


class TransferError(RuntimeError):
    """A transfer that could not complete; the text says where and why."""


def open_regular(path: str) -> int:
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
        self.fd = open_regular(path)
        self.size = os.fstat(self.fd).st_size
        self.final: Optional[int] = None      # a file's size is told at its begin

    def get(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, min(n, self.size - offset), offset) if offset < self.size else b""

    def more(self, offset: int) -> bool:
        return offset < self.size

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

    def more(self, offset: int) -> bool:
        """Whether bytes may follow `offset` (unknown until a read came short)."""
        return self.final is None or offset < self.final

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
          before_end: Optional[Callable[[], None]] = None, stop: Optional[threading.Event] = None) -> dict:
    """The sender of both: `before_end` (if given) runs once all bytes are acknowledged, before the transfer is
    completed, and may raise to leave it incomplete (a stream whose writer has not vouched for it); `stop`, once
    set, ends the send with a TransferError."""
    ctx = context or zmq.Context.instance()
    ids = itertools.count(1)
    t0 = time.perf_counter()
    resent = 0
    sent_max = 0
    reconnects = -1
    rewinds = 0
    sealed_bytes = 0
    sock = bulk = None
    pause, progress, taken = 0.0, time.monotonic(), 0     # (taken: the most the receiver said it holds)
    try:
        for attempt in range(attempts):
            _given_up(stop, xfer)
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
                while _heard(sock, timeout, stop, xfer):
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
            room = _room(rep)
            port = rep.get("bulk") if key else None
            if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
                bulk = sealed.BulkSender(ctx, endpoint, port, key, xfer, window, timeout)

                def send_chunk(data, offset):
                    return bulk.send(epoch, data, offset)

                def chunk_answer():
                    got = bulk.answer(epoch, lambda s, seconds: _heard(s, seconds, stop, xfer))
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
                limit = window if room is None else min(window, room // chunk)
                if limit == 0 and not inflight and src.more(offset):
                    if time.monotonic() - progress > timeout * attempts:
                        raise TransferError(f"the receiver at {endpoint} took nothing of {xfer} for "
                                            f"{timeout * attempts:g} s: the process it feeds has stopped reading")
                    pause = min(PAUSE_MAX_S, max(PAUSE_S, 2 * pause))
                    time.sleep(pause)
                    _given_up(stop, xfer)
                    if not send_chunk(b"", offset):      # asks for room
                        lost = True
                    else:
                        inflight.append(offset)
                while len(inflight) < limit:
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
                have, room = int(rep["have"]), _room(rep)
                if have == inflight[0]:
                    inflight.popleft()
                    src.release(have)
                    if have > taken:
                        taken, progress = have, time.monotonic()
                    if room is None or room >= chunk:
                        pause = 0.0
                    continue
                # A chunk was refused (damaged, out of place after a loss, or no room for it): go back to what
                # it holds, on a fresh epoch so the answers to the chunks already on the wire are not mistaken
                # for new ones.
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


def _heard(sock: zmq.Socket, seconds: float, stop: Optional[threading.Event], xfer: str) -> bool:
    """Whether `sock` has something to read within `seconds`; raises once `stop` is set."""
    deadline = time.monotonic() + seconds
    while True:
        _given_up(stop, xfer)
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if sock.poll(min(left, STOP_LOOK_S if stop is not None else left) * 1000):
            return True


def _given_up(stop: Optional[threading.Event], xfer: str) -> None:
    if stop is not None and stop.is_set():
        raise TransferError(f"sending {xfer} was given up")
