"""A transfer's bulk bytes sealed with AES-256-GCM, so they can travel beside CurveZMQ instead of through it.

CurveZMQ (XSalsa20-Poly1305 in libzmq, a copy and a pass on each end) moved a 1 GiB checkpoint in ~2 s here
where plain ZeroMQ takes ~0.5 s; AES-GCM with the CPU's AES instructions seals ~7 GB/s on one core. So a
transfer agrees a fresh key over its authenticated Curve connection (the sender puts 32 random bytes in
xfer_begin; a receiver that accepts answers with the port of its bulk socket) and sends its chunks, sealed,
over a plain ZeroMQ connection to that port (gmux.wire.transfer). What this keeps from Curve:
- **Secrecy and integrity of every byte:** only the two ends of the Curve connection know the key; each chunk is
  sealed with the whole header frame (transfer, offset, epoch, nonce) as its associated data, so a changed byte,
  a chunk moved to another offset or transfer, or a forged one fails to open and is dropped unanswered.
- **Authenticated answers:** the receiver's acknowledgements (how much it holds, or why it refuses) are sealed
  too, in the other direction, with the epoch of the chunk they answer as associated data.
- **No nonce twice under one key:** a nonce is a direction byte and a counter; each xfer_begin brings a new key.
A replayed chunk opens, but says only what was said: the receiver appends a chunk only where its file ends, and
a transfer's bytes at an offset never change (a stream resends the chunk it kept). A peer of the bulk port has
no Curve key; its handshake (ZeroMQ's PLAIN) names a transfer open there and a password only the two ends of that
transfer's Curve connection can make (an HMAC of its key), from an address that passed a Curve handshake with the
host lately (gmux.wire.keys.Guard). Anyone else, a stranger on a sender's own host included, is refused at the
handshake, before any frame of theirs reaches the receiver's loop; the password is not secret from someone who
can read the network between the two hosts, who then reaches the loop and can only have frames dropped, each
costing at most one chunk's decryption. Without the `cryptography` package both ends fall back to Curve for
everything.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import struct
from typing import Callable, Optional

import msgpack
import zmq

from gmux import protocol
from gmux.wire import keys

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
except ImportError:         # (a GPU machine's python without it: transfers stay on Curve)
    AESGCM = None

    class InvalidTag(Exception):
        pass

KEY_BYTES = 32
TAG_BYTES = 16
MAX_NONCE = 1 << 62          # (as protocol.BULK_MESSAGES allows)
_TO_RECEIVER, _TO_SENDER = 0, 1


def available() -> bool:
    return AESGCM is not None and os.environ.get("GMUX_BULK") != "curve"


def new_key() -> bytes:
    return os.urandom(KEY_BYTES)


def _nonce(direction: int, n: int) -> bytes:
    return struct.pack("<IQ", direction, n)


class Unsealed(ValueError):
    """A sealed frame that did not open: forged, damaged, or sealed under another key."""


class Seal:
    """One transfer's key, as one end holds it. The sender seals chunks and opens answers; the receiver opens
    chunks and seals answers. Counters make every nonce this end uses under this key new."""

    def __init__(self, key: bytes):
        if AESGCM is None:
            raise RuntimeError("sealed transfers need the 'cryptography' package")
        if not isinstance(key, bytes) or len(key) != KEY_BYTES:
            raise ValueError(f"a transfer key is {KEY_BYTES} bytes")
        self._aead = AESGCM(key)
        self._sent = 0
        # the password of the transfer's bulk connection (PLAIN: a login, not the key, crosses the network)
        self.login = hmac.new(key, b"gmux-bulk-login", hashlib.sha256).hexdigest().encode()

    def next_nonce(self) -> int:
        """The nonce a header must carry for the next `seal` (the header is sealed's associated data)."""
        return self._sent

    def seal(self, header: bytes, data: bytes, direction: int = _TO_RECEIVER) -> bytes:
        if self._sent > MAX_NONCE:
            raise OverflowError("a transfer key has sealed all it may")
        n, self._sent = self._sent, self._sent + 1
        return self._aead.encrypt(_nonce(direction, n), data, header)

    def open(self, header: bytes, nonce: int, sealed: bytes, direction: int = _TO_RECEIVER) -> bytes:
        if not 0 <= nonce <= MAX_NONCE or len(sealed) < TAG_BYTES:
            raise Unsealed("not a sealed frame")
        try:
            return self._aead.decrypt(_nonce(direction, nonce), sealed, header)
        except InvalidTag:
            raise Unsealed("the frame does not open with this transfer's key") from None

    # The receiver's answers: a map ({"have": n} or {"error": text}) bound to the epoch it answers.
    def seal_answer(self, epoch: int, answer: dict) -> tuple:
        n = self._sent
        return n, self.seal(_answer_aad(epoch), msgpack.packb(answer), _TO_SENDER)

    def open_answer(self, epoch: int, nonce: int, sealed: bytes) -> dict:
        answer = msgpack.unpackb(self.open(_answer_aad(epoch), nonce, sealed, _TO_SENDER), raw=False)
        if not isinstance(answer, dict):
            raise Unsealed("a sealed answer is a map")
        return answer


def _answer_aad(epoch: int) -> bytes:
    return b"gmux-xfer-answer" + struct.pack("<Q", epoch)


def bulk_socket(ctx: zmq.Context, beside: str) -> tuple:
    """(socket, port): the ROUTER where a receiving host takes sealed chunks, on the interface of its Curve
    endpoint `beside`, a port of its own. A peer logs in with an open transfer's name and login (PLAIN, checked by
    its context's Guard); a frame is believed only once it opens with a transfer's key, and each peer's queue
    holds a few chunks at most."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.plain_server = True
    sock.setsockopt_string(zmq.ZAP_DOMAIN, keys.BULK_DOMAIN)   # its context's Guard admits whom (gmux.wire.keys)
    sock.setsockopt(zmq.MAXMSGSIZE, protocol.XFER_MAX_CHUNK + TAG_BYTES)
    sock.setsockopt(zmq.RCVHWM, 64)
    sock.bind(beside.rsplit(":", 1)[0] + ":0")
    return sock, int(sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])


def serve_bulk(sock: zmq.Socket, handle, batch: int = 200) -> None:
    """Answers what waits on a bulk socket (read without copying), at most `batch` frames: `handle(header,
    data)` (a Receiver's handle_sealed) gives the answer, or None for a frame dropped unanswered."""
    for _ in range(batch):
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        answer = handle(frames[1].bytes, frames[2].buffer) if len(frames) == 3 else None
        if answer is not None:
            try:
                sock.send_multipart([frames[0].bytes, answer], zmq.NOBLOCK)
            except zmq.Again:
                pass          # (a peer that does not read its answers: the sender times out and begins again)


def seal_or_none(key: Optional[bytes]) -> Optional[Seal]:
    """The receiver's side of a begin: a Seal for the key the sender sent, if this end can open it."""
    return Seal(key) if key is not None and AESGCM is not None else None


class BulkSender:
    """A sender's plain connection to a receiver's bulk socket (the host of its Curve endpoint, the port it
    named) for one connection attempt: chunks go sealed, answers come back opened."""

    def __init__(self, ctx: zmq.Context, endpoint: str, port: int, key: bytes, xfer: str, window: int,
                 timeout: float):
        self.seal = Seal(key)
        self.xfer, self.timeout = xfer, timeout
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, window * 4)
        self.sock.setsockopt(zmq.SNDTIMEO, max(1, int(timeout * 1000)))
        self.sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_FRAME)
        self.sock.plain_username, self.sock.plain_password = xfer.encode(), self.seal.login
        self.sock.connect(f"{endpoint.rsplit(':', 1)[0]}:{port}")

    def send(self, epoch: int, data: bytes, offset: int) -> bool:
        """False if the connection did not take it within the timeout."""
        header = protocol.encode("xfer_sealed", epoch, table=protocol.BULK_MESSAGES, xfer=self.xfer, offset=offset,
                                 nonce=self.seal.next_nonce())
        try:
            self.sock.send_multipart([header, self.seal.seal(header, data)], copy=False)
        except zmq.Again:
            return False
        return True

    def answer(self, epoch: int, heard: Optional[Callable[[zmq.Socket, float], bool]] = None) -> Optional[dict]:
        """The receiver's next answer of this epoch ({"have": n} or {"error": text}), or None after `timeout` of
        silence; what does not open is no answer. `heard(sock, seconds)`, if given, waits for something to read
        in poll's stead (a send that may be given up meanwhile)."""
        wait = heard or (lambda sock, seconds: sock.poll(seconds * 1000))
        while wait(self.sock, self.timeout):
            try:
                rep = protocol.decode(self.sock.recv(), protocol.BULK_MESSAGES)
                data = rep.get("data")
                if rep.type != "reply" or rep.id != epoch or not isinstance(data, dict):
                    continue
                return self.seal.open_answer(epoch, data.get("nonce", -1), data.get("sealed", b""))
            except (protocol.ProtocolError, Unsealed, ValueError, TypeError):
                continue
        return None

    def close(self, linger: int = 0) -> None:
        self.sock.close(linger)
