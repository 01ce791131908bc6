"""Talking to a gmuxd as its administrator (the CLI, the demo, tests): one request, one reply."""
from __future__ import annotations

import itertools
import os
from typing import Any, Optional

import zmq

from gmux import protocol
from gmux.job.agent import unavailable_message
from gmux.rundir import RuntimeDir, default_runtime_dir


class GmuxError(RuntimeError):
    """gmuxd refused a request or cannot be reached; the message says what to do."""


class Client:
    def __init__(self, runtime_dir: Optional[str] = None, timeout: float = 5.0):
        self.rundir = RuntimeDir(runtime_dir or default_runtime_dir())
        self.timeout = timeout
        if not os.path.exists(self.rundir.socket):
            raise GmuxError(unavailable_message(self.rundir.endpoint, 0).replace(" (waited 0 s)", "")
                            .replace("is not answering", "is not running"))
        try:
            self.admin = self.rundir.admin_token()
        except FileNotFoundError:
            raise GmuxError(f"no admin token in {self.rundir.root}: is gmuxd running there?") from None
        except PermissionError:
            raise GmuxError(f"cannot read {self.rundir.admin_token_file}: run gmux as the user running gmuxd")
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.rundir.endpoint)
        self._ids = itertools.count(1)

    def call(self, mtype: str, timeout: Optional[float] = None, **fields: Any) -> Any:
        if mtype in protocol.ADMIN_TYPES:
            fields["admin"] = self.admin
        mid = next(self._ids)
        self.sock.send(protocol.encode(mtype, mid, **fields))
        wait_ms = (timeout if timeout is not None else self.timeout) * 1000
        while True:
            if not self.sock.poll(wait_ms):
                raise GmuxError(unavailable_message(self.rundir.endpoint, wait_ms / 1000))
            try:
                msg = protocol.decode(self.sock.recv())
            except protocol.ProtocolError as e:
                raise GmuxError(f"gmuxd sent a bad reply: {e}") from None
            if msg.type == "reply" and msg.id == mid:
                break
        if not msg.get("ok"):
            raise GmuxError(msg.get("error") or "refused")
        return msg.get("data")

    def close(self) -> None:
        self.sock.close(0)
