"""Talking to gmux-scheduler as a client (gmux submit/ps/kill --cluster, tests, benchmarks): one request, one reply,
over TCP with this user's client key. A refused key looks like silence (CurveZMQ never completes the
handshake), so the timeout message names both possible causes."""
from __future__ import annotations

import itertools
from typing import Any, Optional

import zmq

from gmux import protocol
from gmux.wire import keys


class ClusterError(RuntimeError):
    """The scheduler refused a request or cannot be reached; the message says what to do."""


class ClusterClient:
    def __init__(self, endpoint: str, keydir: str, name: str, timeout: float = 5.0, role: str = "client"):
        self.endpoint, self.keydir, self.name, self.timeout = endpoint, keydir, name, timeout
        try:
            server_key = keys.load_public(keydir, "scheduler")
            self.sock = keys.client_socket(zmq.Context.instance(), zmq.DEALER, keydir, role, name, server_key)
        except (keys.KeyError_, ValueError) as e:
            raise ClusterError(str(e)) from None
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self._ids = itertools.count(1)

    def call(self, mtype: str, timeout: Optional[float] = None, **fields: Any) -> Any:
        mid = next(self._ids)
        self.sock.send(protocol.encode(mtype, mid, table=protocol.CLUSTER_MESSAGES, **fields))
        wait_ms = (self.timeout if timeout is None else timeout) * 1000
        while True:
            if not self.sock.poll(wait_ms):
                raise ClusterError(f"gmux-scheduler did not answer at {self.endpoint} in {wait_ms / 1000:g} s: it is "
                                   f"not running there, or it refused this key (client.{self.name}.pub must be in "
                                   f"its key directory; create one with `gmux keys --dir DIR --client {self.name}`)")
            try:
                msg = protocol.decode(self.sock.recv(), protocol.CLUSTER_MESSAGES)
            except protocol.ProtocolError as e:
                raise ClusterError(f"gmux-scheduler sent a bad reply: {e}") from None
            if msg.type == "reply" and msg.id == mid:
                break
        if not msg.get("ok"):
            raise ClusterError(msg.get("error") or "refused")
        return msg.get("data")

    def close(self) -> None:
        self.sock.close(0)
