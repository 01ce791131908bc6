"""One server loop for a ROUTER socket, apart from what its messages mean: gmuxd and gmux-scheduler both run it.

The owner binds the socket and gives the loop a handler table (message type -> callable). The loop polls,
takes up to `batch` waiting messages, then calls the owner's `tick`, and again, until `until()` says stop.
Each message is decoded and validated against the owner's message table (gmux.protocol) before a handler
sees it. What a handler returns is the reply's data; what it raises decides the answer:
  - one of the owner's refusal exceptions (a valid message it will not carry out): an error reply with its text;
  - anything else is a bug of ours. It costs that one request, never the loop: an internal-error reply, logged
    and counted (`internal_errors`; the tests assert it stays 0).
With `credentials`, each request also says which local process sent it (a Caller: uid, gid and pid of an ipc
peer, from the kernel's SO_PEERCRED that ZeroMQ reports as the frame property Peer-Address), so a daemon
serving many users knows who asks without trusting anything the peer says or can read.
A handler whose answer must wait (for a job to acknowledge a command) returns DEFERRED, and the owner answers
later with `reply` or `refuse`. Sends never block: a peer that is gone or not reading loses its reply and the
loop goes on, since one stuck client must never wedge the loop that serves every other.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import zmq

from gmux import protocol
from gmux.util.text import digits

log = logging.getLogger("gmux.server")

DEFERRED = object()    # a handler's answer that the owner sends later (with reply or refuse)
# Replies queued for one peer before further ones are dropped: a client that sends requests and never reads
# the replies must not grow the server without bound, while one that sends a burst of requests and reads as it
# goes must lose none. ZeroMQ counts messages, not bytes, and a writer learns of its peer's reads only every
# SEND_QUEUE/2 messages: 512 leaves room for bursts of a few hundred, and costs at most 512 replies a peer
# (`ps` is bounded to ~100 jobs, a few hundred kB).
SEND_QUEUE = 512
MAX_ERROR = 1000       # an error text quoting a bad value can be long; the sender needs only its start


@dataclass(frozen=True)
class Caller:
    """The local process at the other end of an ipc connection, as the kernel saw it when it connected."""
    uid: int
    gid: int
    pid: int


def peer_credentials(frame) -> Optional[Caller]:
    """The Caller of a received zmq.Frame, or None when the transport has no credentials (tcp) or the library
    does not report them. libzmq fills Peer-Address with `localhost:UID:GID:PID` for ipc peers on Linux
    (SO_PEERCRED, taken by the kernel at connect time: the peer cannot choose it)."""
    try:
        address = frame.get("Peer-Address")
    except (zmq.ZMQError, AttributeError):   # a bytes frame, or an option this libzmq does not know
        return None
    parts = address.split(":") if isinstance(address, str) else []
    if len(parts) != 4 or not all(digits(p) for p in parts[1:]):
        return None
    return Caller(int(parts[1]), int(parts[2]), int(parts[3]))


class Refused(Exception):
    """A valid message that will not be carried out; its text goes back to the sender."""


class Busy(Refused):
    """Refused only for now: the target is in the middle of something that ends by itself (a suspend, a move),
    and the same request may succeed in a moment. The reply says so (`busy`), so callers that wait need not
    read the text."""


class UnknownJob(Refused):
    """The job a message names is not in the table (a gmuxd whose table was lost): the reply says so
    (`unknown`), so the job can register again to be adopted."""


@dataclass(frozen=True)
class Request:
    """One validated message and where it came from, as a handler gets it."""
    identity: bytes                    # the ROUTER routing id: where replies to it go
    msg: protocol.Message
    received_at: float                 # time.monotonic() on arrival: a deferred reply's latency counts from here
    peer: Any = None                   # who the peer's key says it is, from `authenticate` (e.g. (role, name))
    attachment: Optional[bytes] = None  # a raw second frame (a checkpoint chunk), where the owner takes one
    caller: Optional[Caller] = None    # who sent it, from the kernel (with `credentials`), else None


Handler = Callable[[Request], Any]


def configure(sock: zmq.Socket) -> zmq.Socket:
    """Settings a served ROUTER needs before it binds (a listener keeps the options it was bound with)."""
    sock.setsockopt(zmq.SNDHWM, SEND_QUEUE)
    sock.setsockopt(zmq.LINGER, 0)
    return sock


def _bytes(frame) -> bytes:
    return frame if isinstance(frame, bytes) else frame.bytes


class Server:
    """The loop over one bound ROUTER socket.

    handlers: message type -> handler; with `authenticate`, role -> (message type -> handler) instead, since
      what a daemon's key may send is not what a client's key may.
    name: says whose internal error an internal-error reply reports ("gmuxd").
    table: the protocol message table frames are validated against (None: gmux.protocol.MESSAGES).
    refusals: exceptions a handler raises to refuse a message (answered, counted in `refused`, not logged).
    authenticate: frame -> (role, name), or None for a peer without a known key; from the frame's
      properties (ZAP User-Id), never from what the peer says.
    attachments: a message may carry one raw frame after it (a checkpoint chunk).
    reply_to_none: a handler returning None is answered with an empty ok reply (gmuxd: a job's one-way messages
      are acknowledged), or not at all (gmux-scheduler: a link's reports are one-way).
    unknown: the refusal text for a message type no handler takes ({type}, and with roles {role}).
    credentials: every request carries its sender's Caller (ipc peers only); a message whose sender the kernel
      did not name is refused, never served as nobody in particular.
    """

    def __init__(self, sock: zmq.Socket, handlers: Mapping, *, name: str, table: Optional[dict] = None,
                 refusals: tuple = (Refused,), authenticate: Optional[Callable[[Any], Any]] = None,
                 attachments: bool = False, reply_to_none: bool = True,
                 unknown: str = "{type} is not accepted from a {role} key", credentials: bool = False):
        self.sock = sock
        self.handlers = handlers
        self.name = name
        self.table = table
        self.refusals = refusals
        self.authenticate = authenticate
        self.attachments = attachments
        self.reply_to_none = reply_to_none
        self.unknown = unknown
        self.credentials = credentials
        # An unroutable send must raise (and be dropped here) rather than vanish silently inside ZeroMQ.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if sock.getsockopt(zmq.SNDHWM) != SEND_QUEUE:
            raise ValueError("configure(sock) before binding it: a bound socket keeps the queue limits it had")
        self.messages = 0          # frames received
        self.refused = 0           # of which answered with an error: malformed, unknown, or refused by a handler
        self.internal_errors = 0   # of which a handler failed on (a bug)

    def serve(self, tick: Callable[[], None], until: Callable[[], bool], poll_s: float = 0.02,
              batch: int = 1000, beside: Optional[dict] = None) -> None:
        """Runs until `until()` is true. `tick` runs after each poll: at least every `poll_s`, and after every
        `batch` messages, so a flood of messages cannot starve the owner's timers. `beside`: other sockets of
        the owner's, each with what drains it, called when it has something (a bounded amount, like `batch`)."""
        # The frame's properties (the key's User-Id, the peer's credentials) need a zmq.Frame.
        copy = self.authenticate is None and not self.credentials
        beside = beside or {}
        poller = zmq.Poller()
        for sock in (self.sock, *beside):
            poller.register(sock, zmq.POLLIN)
        while not until():
            ready = dict(poller.poll(poll_s * 1000))
            if self.sock in ready:
                for _ in range(batch):
                    try:
                        identity, *frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=copy)
                    except zmq.Again:
                        break
                    self.receive(identity, frames)
            for sock, drain in beside.items():
                if sock in ready:
                    drain()
            tick()

    def receive(self, identity, frames: list) -> None:
        """One message from `identity` (its frames after the routing id): decoded, handled, answered."""
        identity = _bytes(identity)
        self.messages += 1
        received_at = time.monotonic()
        peer = self.authenticate(frames[0]) if self.authenticate is not None and frames else None
        most = 2 if self.attachments else 1
        if not 1 <= len(frames) <= most or (self.authenticate is not None and peer is None):
            self._refuse(identity, 0, "expected one message frame (two for a checkpoint chunk)" if self.attachments
                         else f"expected one frame per message, got {len(frames)}")
            return
        try:
            msg = protocol.decode(_bytes(frames[0]), self.table)
        except protocol.ProtocolError as e:
            self._refuse(identity, 0, str(e))
            return
        caller = peer_credentials(frames[0]) if self.credentials else None
        if self.credentials and caller is None:
            self._refuse(identity, msg.id, f"{self.name} cannot tell which local user sent {msg.type} (it serves "
                                           f"ipc peers, whose uid the kernel reports)")
            return
        role = peer[0] if self.authenticate is not None else None
        handler = (self.handlers if role is None else self.handlers.get(role, {})).get(msg.type)
        if handler is None:
            self._refuse(identity, msg.id, self.unknown.format(type=msg.type, role=role))
            return
        request = Request(identity, msg, received_at, peer, _bytes(frames[1]) if len(frames) == 2 else None, caller)
        try:
            data = handler(request)
        except self.refusals as e:
            self._refuse(identity, msg.id, str(e), isinstance(e, Busy), isinstance(e, UnknownJob))
            return
        except Exception as e:
            self.internal_errors += 1
            log.exception("%s: internal error handling %s", self.name, msg.type)
            self.refuse(identity, msg.id, f"{self.name} internal error on {msg.type}: {e!r}")
            return
        if data is DEFERRED or (data is None and not self.reply_to_none):
            return
        self.reply(identity, msg.id, data)

    def _refuse(self, identity: bytes, msg_id, text: str, busy: bool = False, unknown: bool = False) -> None:
        self.refused += 1
        self.refuse(identity, msg_id, text, busy, unknown)

    # --- sending (also for deferred answers, and for messages the owner starts itself) ---
    def reply(self, identity: bytes, msg_id: int, data: Any = None) -> bool:
        frame = protocol.reply(msg_id, True, data=data)
        if len(frame) > protocol.MAX_FRAME:    # the client would refuse it: say so instead, and how to ask for less
            log.warning("%s: a reply of %d bytes was not sent", self.name, len(frame))
            return self.refuse(identity, msg_id, f"the reply is {len(frame)} bytes, over the {protocol.MAX_FRAME}-byte "
                                                 f"limit of a message; ask for less (e.g. a smaller --limit or --tail)")
        return self.send(identity, frame)

    def refuse(self, identity: bytes, msg_id, text: str, busy: bool = False, unknown: bool = False) -> bool:
        return self.send(identity, protocol.error_reply(msg_id, text[:MAX_ERROR], busy, unknown))

    def send(self, identity: bytes, frame: bytes) -> bool:
        """False when the frame could not be queued: the peer is gone (EHOSTUNREACH) or not reading (EAGAIN)."""
        try:
            self.sock.send_multipart([identity, frame], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            return False
