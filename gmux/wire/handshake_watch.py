"""Says why a CurveZMQ client socket is not getting through, which ZeroMQ keeps to itself: a peer that refuses
our key, a handshake that fails because we hold the wrong key for it, or no answer at all. Without it a machine
whose key the scheduler does not know retries for ever and the scheduler's table simply never shows it.

A monitor socket on the client (libzmq's handshake events) is read from the owner's poll loop; each cause is
logged once, and again only after a handshake has succeeded and been lost or failed anew. libzmq never
reconnects after its key was refused, so that case connects again every RETRY_S from here: adding the key lets
it in, no restart."""
from __future__ import annotations

import logging
import time
from typing import Optional

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger("gmux.handshake")
SILENCE_S = 10.0      # no handshake by then: said once
RETRY_S = 5.0         # after a refusal of our key


class HandshakeWatch:
    EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
              | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED)

    def __init__(self, sock: zmq.Socket, endpoint: str, peer: str, our_key: str, their_key: str):
        self.sock = sock
        self.socket = sock.get_monitor_socket(self.EVENTS)
        self.refused_at: Optional[float] = None
        self.endpoint, self.peer, self.our_key, self.their_key = endpoint, peer, our_key, their_key
        self.since = time.monotonic()
        self.joined = False
        self.said: set = set()
        self.retries = 0

    def handle(self) -> None:
        """Reads the events waiting on `socket` (poll it for POLLIN)."""
        while self.socket.poll(0):
            self._event(recv_monitor_message(self.socket))

    def _event(self, ev: dict) -> None:
        kind = ev["event"]
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            if self.said:
                log.info("the %s at %s accepted us: connected", self.peer, self.endpoint)
            self.joined, self.said, self.retries, self.refused_at = True, set(), 0, None
            return
        if kind == zmq.EVENT_CONNECT_RETRIED:
            self.retries += 1
            return
        if kind == zmq.EVENT_DISCONNECTED:
            if self.joined:            # (a peer gone later, a restarted scheduler: said again if it stays away)
                self.joined, self.since = False, time.monotonic()
            return
        self.joined = False
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.refused_at = time.monotonic()
        self._say(kind, self.why(kind, ev.get("value")))

    def why(self, kind: int, value: Optional[int]) -> str:
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (f"the {self.peer} at {self.endpoint} refused this party's key ({self.our_key}.pub, status "
                    f"{value}): is that file in the {self.peer}'s key directory? (tried again every {RETRY_S:.0f} s)")
        return (f"the CurveZMQ handshake with the {self.peer} at {self.endpoint} failed: does the "
                f"{self.their_key}.pub here match the {self.peer}'s own key?")

    def check(self, now: Optional[float] = None) -> None:
        """Call now and then (from the thread that owns the socket): a handshake that has not happened after
        SILENCE_S is said once; a refused key is tried again."""
        now = time.monotonic() if now is None else now
        if self.refused_at is not None and now - self.refused_at >= RETRY_S:
            self.refused_at = None
            self.sock.disconnect(self.endpoint)
            self.sock.connect(self.endpoint)
        if not self.joined and not self.said and now - self.since >= SILENCE_S:
            refused = f" (connection refused or unreachable, {self.retries} tries)" if self.retries else ""
            self._say("silent", f"no answer from the {self.peer} at {self.endpoint} after {SILENCE_S:.0f} s"
                                f"{refused}: is it running and reachable from here, and does its key match "
                                f"{self.their_key}.pub?")

    def _say(self, key, text: str) -> None:
        if key not in self.said:
            self.said.add(key)
            log.warning("%s", text)

    def close(self) -> None:
        self.socket.close(0)
