"""A machine's cluster link's line to its own gmuxd (gmux.node.cluster_link): the admin socket, asked as the CLI
asks it, and whether gmuxd answers. The link looks at gmuxd's jobs twice a second, and more often while a job
starts; a link whose gmuxd has stopped (or, run as its own process, was started before any) said so at every
look, for ever. Now it is said once when gmuxd stops answering and once when it answers again.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

from gmux.wire.daemon_client import Client, GmuxError

log = logging.getLogger("gmux.cluster_link")


class LocalGmuxd:
    def __init__(self, root: str):
        self.root = root
        self.away_since: Optional[float] = None     # monotonic time of the first look it did not answer

    def call(self, mtype: str, timeout: float = 130.0, **fields):
        c = Client(self.root, timeout=timeout)   # one per call and thread: zmq sockets are not shared
        try:
            return c.call(mtype, timeout=timeout, **fields)
        finally:
            c.close()

    def look(self, **fields) -> Optional[dict]:
        """gmuxd's `ps`, or None while it does not answer."""
        try:
            ps = self.call("ps", timeout=5.0, **fields)
        except GmuxError as e:
            if self.away_since is None:
                self.away_since = time.monotonic()
                log.warning("gmuxd not answering: %s (said again once it answers)", e)
            return None
        if self.away_since is not None:
            log.warning("gmuxd answers again, after %.0f s", time.monotonic() - self.away_since)
            self.away_since = None
        return ps
