"""One request, one reply, over a DEALER socket: the request/reply code of every client role (the CLI and the
cluster link to gmuxd, clients to gmux-scheduler, a job registering with gmuxd).

A request gets an id; the reply carrying that id answers it. Anything else that arrives meanwhile is not lost:
it goes to `on_message` (a job queues the commands gmuxd pushes to it). Silence past the timeout raises the
caller's error class with a message that says what to do.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Optional

import zmq

from gmux import protocol


GONE_EVERY_S = 1.0    # how often a long wait asks whether the peer is still there


class Requester:
    def __init__(self, sock: zmq.Socket, peer: str, error: type, silence: Callable[[float], str],
                 table: Optional[dict] = None, on_message: Optional[Callable[[protocol.Message], None]] = None,
                 on_bad: Optional[Callable[[protocol.ProtocolError], None]] = None, unanswered: type = None,
                 refused: Callable[[str, str], str] = lambda mtype, error: error, busy: type = None,
                 gone: Optional[Callable[[], Optional[str]]] = None):
        self.sock, self.peer, self.error, self.silence = sock, peer, error, silence
        self.busy = busy or error      # raised for a refusal the reply marks `busy` (only for now)
        self.table, self.on_message, self.on_bad = table, on_message, on_bad
        self.unanswered = unanswered or error
        self.refused = refused
        self.gone = gone       # why the peer can no longer answer (it ended), asked while a reply is awaited
        self.ids = itertools.count(1)

    def send(self, mtype: str, **fields: Any) -> int:
        """A one-way message (never blocks: a full queue raises zmq.Again to the caller). Returns its id."""
        mid = next(self.ids)
        self.sock.send(protocol.encode(mtype, mid, table=self.table, **fields), zmq.NOBLOCK)
        return mid

    def call(self, mtype: str, timeout: float, **fields: Any) -> Any:
        mid = next(self.ids)
        frame = protocol.encode(mtype, mid, table=self.table, **fields)
        if len(frame) > protocol.MAX_FRAME:     # (the peer would refuse it unread, with no id to answer)
            raise self.error(f"{mtype}: the request is {len(frame):,} bytes, over the {protocol.MAX_FRAME:,}-byte "
                             f"limit of one message; send less (fewer or shorter arguments or values)")
        deadline = time.monotonic() + timeout
        # A send waits for a peer at most as long as the reply would (a peer that never completes its handshake,
        # as a refused CurveZMQ key, would otherwise hold it for ever).
        self.sock.setsockopt(zmq.SNDTIMEO, max(1, int(timeout * 1000)))
        try:
            self.sock.send(frame)
        except zmq.Again:
            raise self.unanswered(self.silence(timeout)) from None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.unanswered(self.silence(timeout))
            if not self.sock.poll(min(left, GONE_EVERY_S) * 1000):
                why = self.gone() if self.gone is not None else None
                if why:
                    raise self.unanswered(why)
                continue
            msg = self.receive()
            # (id 0: the refusal of a message the peer could not read, which has no id it could answer to)
            if msg is not None and msg.type == "reply" and (msg.id == mid or msg.id == 0 and not msg.get("ok")):
                break
            if msg is not None and self.on_message is not None:
                self.on_message(msg)
        if not msg.get("ok"):
            raise (self.busy if msg.get("busy") else self.error)(self.refused(mtype, msg.get("error") or "refused"))
        return msg.get("data")

    def receive(self) -> Optional[protocol.Message]:
        """One message if one is waiting, validated; None if none is, or it was bad and `on_bad` kept it."""
        try:
            frame = self.sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return None
        try:
            return protocol.decode(frame, self.table)
        except protocol.ProtocolError as e:
            if self.on_bad is None:
                raise self.error(f"{self.peer} sent a bad reply: {e}") from None
            self.on_bad(e)
            return None
