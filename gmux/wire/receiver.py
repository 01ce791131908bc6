"""The receiving end of a checkpoint transfer (gmux.wire.transfer): a daemon's cluster link and gmux-scheduler
host one on their ROUTER sockets and hand it each xfer_* message.

- It appends a chunk only if it starts exactly where its file ends; every answer says how much it holds
  ("have"), and a sender that hears less than it expected rewinds to it.
- At the end it checks it holds the whole size, fsyncs and renames the partial file to NAME.ckpt: a reader sees
  a complete file or none. A reader that cannot wait for that (a move's new process, restoring as the bytes
  arrive) follows the partial file (gmux.wire.arriving).
- A receiver that need not outlive a crash (durable=False: a move's target, whose source still holds the job
  until the target has restored it) renames without fsync; and a transfer whose reader its host announced
  (`expect_reader`: a move's new process, waiting for it) goes through a FIFO, not a file (gmux.wire.piped).
  Its answers also say how much more it takes now ("room"; an empty chunk asks): a chunk beyond that is refused
  like one out of place, so a process that reads slowly, or not at all, holds up its sender rather than this
  host's memory. One whose process has ended (`reader_gone`, from its host) is refused from then on, so its
  sender hears it at once rather than waiting for room that will never come.
- A host that serves many senders in one loop (gmux-scheduler) passes `later` and gets its answers to xfer_end
  from `finished()`: the fsync runs on a thread of the receiver's, since on a disk another tenant saturates one
  takes seconds, and a loop held that long stops hearing every machine's reports. The answer still comes only
  once the bytes are on disk: a sender drops its own copy when it hears it.
- xfer_holds asks what the process waiting for a transfer already holds (gmux.job.holdings: it wrote that
  beside the partial file).
- A partial file nobody has added to for STALE_S (its sender gave up, or died) is deleted by `expire`, which
  the hosts of a receiver call as they tick; a sender that comes back later starts that file again.
- Sealed chunks (gmux.wire.sealed) come from the host's bulk socket through `handle_sealed`.
"""
from __future__ import annotations

import errno
import hmac
import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from gmux import protocol
from gmux.wire import sealed
from gmux.wire.piped import Piped
from gmux.wire.transfer import CHUNK, open_regular

STALE_S = 600.0      # far beyond a sender's reconnect timeout: a partial file this idle is abandoned


def partial_path(path: str) -> str:
    """Where a receiver appends the bytes of NAME.ckpt until its transfer completes."""
    return path.removesuffix(".ckpt") + ".part"


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
        self.readers: set[str] = set()        # transfers a process waits to read as they arrive
        self.gone: dict[str, float] = {}      # of those, the ones whose process ended (refused) -> since when
        self.draining: dict[str, Piped] = {}  # completed piped transfers whose writer is still writing
        self.completed = 0
        self.rejected_chunks = 0
        self.refused_full = 0                 # chunks refused while a piped transfer's reader was behind
        self.expired = 0
        self._swept = 0.0

    def expect_reader(self, xfer: str) -> None:
        """A process will read transfer `xfer` as it arrives (gmux.wire.arriving): if it has not begun yet, it
        goes through a FIFO (not on a receiver that must outlive a crash)."""
        if not self.durable:
            self.readers.add(xfer)

    def reader_gone(self, path: str) -> None:
        """The process that was to read the transfer arriving at `path` has ended (its start is over): the transfer
        is refused, its sender told at its next message (its begin, a chunk, or a question about room), and what
        arrived of it is deleted now: a sender that hears of the failed move elsewhere sends nothing more, and its
        partial file or FIFO would wait STALE_S for `expire`."""
        x = os.path.basename(path).removesuffix(".ckpt")
        if path != self.path(x) or x not in self.readers:
            return
        self.readers.discard(x)
        self.gone[x] = time.time()
        st = self.open.get(x)
        if st is None:
            return
        st["error"] = OSError(errno.EPIPE, "the process that was to restore it has ended")
        if st["pipe"] is not None:
            st["pipe"].fail(st["error"])
        else:
            os.close(st["fd"])
            st["fd"] = None
        self._unlink_part(x)     # (the open record stays, small, for a sealed chunk's sealed answer)

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
            return False, _cannot_store(msg.type, x, e)

    def _handle(self, msg: protocol.Message, data: Optional[bytes], later) -> tuple[bool, object]:
        x = msg["xfer"]
        if x in self.flushing:
            return self._while_flushing(x, msg, later)
        if x in self.gone and msg.type != "xfer_holds":
            if x in self.open:
                self._discard(x)
            return False, f"{msg.type} {x}: the process that was to restore it on this machine has ended"
        if msg.type == "xfer_begin":
            self._begin(x, msg["size"], msg.get("seal"))
            return True, {**_answer(self.open[x]), **({"bulk": self.bulk_port} if self.open[x]["seal"] else {})}
        if msg.type == "xfer_holds":
            return True, {"holds": self._holds(x)}
        st = self.open.get(x)
        if st is None:
            return False, f"{msg.type}: no transfer {x!r} in progress (send xfer_begin first)"
        st["seen"] = time.time()
        if msg.type == "xfer_chunk":
            if data is None or len(data) > protocol.XFER_MAX_CHUNK:
                return False, f"xfer_chunk {x}: needs one data frame of 0..{protocol.XFER_MAX_CHUNK} bytes"
            self._append(st, msg["offset"], data)
            return True, _answer(st)
        # xfer_end (a stream's begin gave a bound; its end says the size)
        size = msg.get("size", st["size"])
        if st["have"] != size or size > st["size"]:
            return False, f"xfer_end {x}: holds {st['have']} of {size} bytes"
        del self.open[x]
        if st["pipe"] is not None:
            return True, self._complete_piped(x, st["pipe"], size)
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

    def _complete_piped(self, x: str, pipe: Piped, size: int) -> dict:
        answer = self._complete(x, size)     # renamed before the writer's end closes: see gmux.wire.piped
        pipe.end()
        self.readers.discard(x)
        self.draining[x] = pipe
        return answer

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
                ok, answer = False, _cannot_store("xfer_end", x, error)
            for later in fl["waiters"]:
                yield later, ok, answer

    def _append(self, st: dict, off: int, data: bytes) -> None:
        """Appends a chunk if it starts where the file ends (and, piped, if its writer has room for it); the
        transfer's "have" says whether it did."""
        if off != st["have"] or off + len(data) > st["size"]:
            self.rejected_chunks += 1         # out of place (after a loss): the sender rewinds
            return
        if st.get("error") is not None:
            raise st["error"]
        if st["pipe"] is not None and st["pipe"].error is not None:
            raise st["pipe"].error
        if not data:
            return                            # a sender asking for room
        if st["pipe"] is not None:
            if len(data) > st["pipe"].room:
                self.refused_full += 1        # its reader is behind: the sender waits for room
                return
            st["pipe"].put(data)
        else:
            view = memoryview(data)
            while view:                       # (a short write: the disk filled up, and the next one says so)
                view = view[os.write(st["fd"], view):]
        st["have"] += len(data)

    def bulk_login(self, x: str, password: bytes) -> bool:
        """Whether a peer of the host's bulk socket that logs in as transfer `x` with `password` may send: the
        transfer is open here for sealed chunks and the password is its login (gmux.wire.keys.Guard asks, from
        its own thread, at each handshake)."""
        st = self.open.get(x)
        seal = st["seal"] if st is not None else None
        return seal is not None and hmac.compare_digest(seal.login, password)

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
        if seal is None or not sealed.TAG_BYTES <= len(data) <= protocol.XFER_MAX_CHUNK + sealed.TAG_BYTES:
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
            self._append(st, msg["offset"], chunk)
            answer = _answer(st)
            self.sealed_bytes += answer["have"] - had
        except OSError as e:
            self._discard(x)
            answer = {"error": _cannot_store("xfer_sealed", x, e)}
        nonce, body = seal.seal_answer(msg.id, answer)
        return protocol.reply(msg.id, data={"nonce": nonce, "sealed": body})

    def _holds(self, x: str) -> bytes:
        """What the process that waits for transfer `x` offers (gmux.job.holdings, a file it wrote here); a file
        that is not a regular one of at most HOLDS_MAX digests offers nothing."""
        limit = protocol.HOLDS_MAX * protocol.HOLDS_DIGEST_BYTES
        try:
            fd = open_regular(self._offer(x))
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
        self._drained(x)
        if x in self.readers:
            self.open[x] = {"size": size, "have": 0, "fd": None, "seen": time.time(), "seal": seal,
                            "pipe": Piped(self._part(x), self.path(x), STALE_S)}
            return 0
        # A partial file left by a receiver that restarted was appended only with whole chunks of CHUNK bytes; a
        # torn last chunk is cut off.
        fd = os.open(self._part(x), os.O_RDWR | os.O_CREAT, 0o600)
        have = os.fstat(fd).st_size
        if have > size:
            have = 0
        have -= have % CHUNK
        os.ftruncate(fd, have)
        os.lseek(fd, have, os.SEEK_SET)
        self.open[x] = {"size": size, "have": have, "fd": fd, "seen": time.time(), "seal": seal, "pipe": None}
        return have

    def expire(self, now: Optional[float] = None, every: float = 30.0) -> int:
        """Deletes partial files idle for STALE_S (open here, or left by a receiver that stopped); returns how
        many. Looks at most once every `every` seconds, so a host may call it on every tick."""
        now = time.time() if now is None else now
        if now - self._swept < every:
            return 0
        self._swept = now
        self.gone = {x: t for x, t in self.gone.items() if now - t <= STALE_S}
        gone = [x for x, st in self.open.items() if now - st["seen"] > STALE_S]
        for x in gone:
            self._discard(x)
        for x in list(self.draining):
            if not os.path.exists(self.path(x)):   # its start is over (gmux.node.cluster_starts), read or not
                self._drained(x)
            elif self.draining[x].done:
                del self.draining[x]
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
        if st["pipe"] is not None:
            st["pipe"].abort()
        elif st["fd"] is not None:
            os.close(st["fd"])
        self._unlink_part(x)

    def _drained(self, x: str) -> None:
        """Stops the writer of an earlier piped transfer of the same name, should it still be at work."""
        pipe = self.draining.pop(x, None)
        if pipe is not None:
            pipe.abort()

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
        for st in self.open.values():
            if st["pipe"] is not None:
                st["pipe"].abort()
            elif st["fd"] is not None:
                os.close(st["fd"])
        for fl in self.flushing.values():
            os.close(fl["fd"])
        for pipe in self.draining.values():
            pipe.abort()
        self.open.clear()
        self.draining.clear()
        self.flushing.clear()


def _answer(st: dict) -> dict:
    """What the receiver holds of a transfer, and, piped, how much more it takes now."""
    return {"have": st["have"]} if st["pipe"] is None else {"have": st["have"], "room": st["pipe"].room}


def _cannot_store(mtype: str, x: str, e: OSError) -> str:
    return f"{mtype} {x}: cannot store it on this machine: {e.strerror or e}"
