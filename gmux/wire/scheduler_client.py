"""Talking to gmux-scheduler as a client (gmux submit/ps/kill --cluster, tests, benchmarks): one request, one reply,
over TCP with this user's client key. A refused key looks like silence (CurveZMQ never completes the
handshake), so the timeout message names both possible causes."""
from __future__ import annotations

from typing import Any, Optional

import zmq

from gmux import protocol
from gmux.wire import keys
from gmux.wire.request import Requester


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
        self.requests = Requester(self.sock, "gmux-scheduler", ClusterError, self._silence,
                                  table=protocol.CLUSTER_MESSAGES)

    def _silence(self, waited: float) -> str:
        return (f"gmux-scheduler did not answer at {self.endpoint} in {waited:g} s: it is not running there, or it "
                f"refused this key (client.{self.name}.pub must be in its key directory; create one with "
                f"`gmux keys --dir DIR --client {self.name}`)")

    def call(self, mtype: str, timeout: Optional[float] = None, **fields: Any) -> Any:
        return self.requests.call(mtype, self.timeout if timeout is None else timeout, **fields)

    def close(self) -> None:
        self.sock.close(0)
