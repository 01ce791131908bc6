"""Keeps a daemon's open files far below its limit when peers open connections without end (gmuxd, and
gmux-scheduler, whose ports anyone on the network may reach).

libzmq accepts every connection to gmuxd's socket, each into a file of gmuxd's, and aborts the process when
accept() finds no file left (EMFILE: its ipc listener takes that for a bug). A user who may reach the socket (a
member of the socket group of a system daemon), or a script of theirs that leaks clients, would thus stop the
multiplexer of every user of the machine. gmuxd cannot refuse a connection before libzmq takes it (and unbinding
the socket leaves every accepted connection dead but open), so a thread of its own counts gmuxd's files every
PERIOD_S, and past `high` ends connections until gmuxd holds `low`: those of whoever holds the most, newest
first, down to the next holder's number and then theirs too. A user under the mark keeps their connections; one
ended, a ZeroMQ client connects again by itself. TCP ports are watched alike, their peers told apart by address:
a cluster link's in gmuxd, and gmux-scheduler's (a plain ZeroMQ peer on a bulk port, which needs no key, holds
its connection for ever; at its limit gmux-scheduler could list no directory and ended). `high` is at most a quarter
of the limit gmuxd raised its own to (gmux.util.fd_limit), and what lies above it is what a flood may open
while a pass runs, on a machine the flood also loads (benchmarks/connection_flood.py measures both).
"""
from __future__ import annotations

import contextlib
import heapq
import logging
import os
import socket
import struct
import threading
import time
from collections import defaultdict
from typing import Optional

from gmux.util import heap
from gmux.util.faults import Faults
from gmux.util.fd_limit import open_files

MOST = 4096          # files: a thousand jobs' connections, and far below the limit a daemon raises itself to
PERIOD_S = 0.05     # (a flood of thousands a second opens some hundreds in one: far under the margin)
LOG_EVERY_S = 10.0

log = logging.getLogger("gmux.connections")


class ConnectionGuard:
    """name: whose connections (for the log); socket_path: the ipc socket watched, if any; ports: the TCP ports
    watched (a cluster link's, gmux-scheduler's), which may be added to until start()."""

    def __init__(self, name: str, socket_path: Optional[str], limit: int, faults: Faults):
        self.name = name
        self.path = socket_path
        self.ports: set[int] = set()
        self.high = max(16, min(limit // 4, MOST))
        self.low = self.high // 2
        self.faults = faults
        self._ending: set[int] = set()         # sockets ended, not yet closed by libzmq
        self._slowed: list = []                # libzmq's threads put behind others during a flood, (tid, nice)
        self._flooded = False                  # held more than `high` since it last held `low`
        self._unlogged: dict[str, int] = defaultdict(int)
        self._logged_at = 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="connection-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.report()

    def _run(self) -> None:
        # Ahead of the processes that flood it (a root daemon may): the kernel schedules each thread by its own
        # nice, and the processes gmuxd starts inherit its main thread's, not this one's.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)
        while not self._stop.wait(PERIOD_S):
            with self.faults.guard("ending connections"):
                self.check(time.monotonic())

    def check(self, now: float) -> int:
        """Ends connections if the daemon holds more than `high` files; returns how many it ended."""
        held = open_files()
        if held <= self.low and self._slowed:
            for tid, before in self._slowed:
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, tid, before)
            self._slowed = []
        if held <= self.low and self._flooded:
            self._flooded = False
            heap.trim()             # what the flood's connections held, kept by the C library's arenas till told
        if held <= self.high:
            return 0
        self._flooded = True
        if not self._slowed and os.geteuid() == 0:
            # libzmq's threads take connections as fast as a flood makes them, on a machine the flood loads too:
            # behind every other process while it lasts, they take fewer than this thread ends (root's alone,
            # which may give them their priority back)
            for tid in _threads_named("ZMQbg/"):
                with contextlib.suppress(OSError):
                    before = os.getpriority(os.PRIO_PROCESS, tid)
                    os.setpriority(os.PRIO_PROCESS, tid, 19)
                    self._slowed.append((tid, before))
        by_peer: dict[str, list[tuple[int, int]]] = defaultdict(list)    # peer -> [(socket inode, fd)]
        ending = set()
        for fd, inode, peer in self._connections():
            if inode in self._ending:
                ending.add(inode)
            else:
                by_peer[peer].append((inode, fd))
        ended = 0
        for peer, inode, fd in newest_of_the_largest(by_peer, held - len(ending) - self.low):
            if self._end(fd, inode):
                ended += 1
                ending.add(inode)
                self._unlogged[peer] += 1
        self._ending = ending
        if now - self._logged_at >= LOG_EVERY_S:
            self.report()
            self._logged_at = now
        return ended

    def report(self) -> None:
        """Logs the connections ended since the last report, by peer (at most every LOG_EVERY_S, and at the end)."""
        if self._unlogged:
            who = ", ".join(f"{n} of {peer}" for peer, n in sorted(self._unlogged.items(), key=lambda u: -u[1]))
            log.warning("ended connections to %s (%s): it held more than %d files, a client that opens "
                        "connections without closing them", self.name, who, self.high)
            self._unlogged.clear()

    def _connections(self):
        """(fd, socket inode, peer) of each connection accepted on the watched socket or ports."""
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:      # closed since the listing
                continue
            if target.startswith("socket:["):
                fd, inode = int(name), int(target[8:-1])
                found = self._accepted(fd, inode, dup=False)
                if found is not None:
                    found[0].detach()
                    yield fd, inode, found[1]

    def _end(self, fd: int, inode: int) -> bool:
        """Shuts the connection down (libzmq then sees it end and closes its file) if `fd` is still it."""
        found = self._accepted(fd, inode)
        if found is None:
            return False
        with found[0] as s:
            try:
                s.shutdown(socket.SHUT_RDWR)
                return True
            except OSError:
                return False

    def _accepted(self, fd: int, inode: int, dup: bool = True) -> Optional[tuple[socket.socket, str]]:
        """(a socket object on `fd`, and its peer: "uid N" or an address) if `fd` is still socket `inode` and a
        connection accepted on gmuxd's socket or one of the watched ports; else None. The file stays libzmq's:
        the caller closes a duplicate (what it then shuts down is the very socket checked), or detaches `fd` (a
        count only: three system calls fewer a file, while a flood goes on)."""
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, os.dup(fd) if dup else fd)    # (any family)
        except OSError:
            return None
        try:
            if os.fstat(s.fileno()).st_ino == inode and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                local = s.getsockname()
                if self.path is not None and local == self.path:
                    cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                    return s, f"uid {struct.unpack('3i', cred)[1]}"
                if isinstance(local, tuple) and local[1] in self.ports:
                    return s, s.getpeername()[0]
        except OSError:
            pass
        if dup:
            s.close()
        else:
            s.detach()
        return None


def _threads_named(prefix: str) -> list[int]:
    found = []
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith(prefix):
                    found.append(int(tid))
    return found


def newest_of_the_largest(by_peer: dict, count: int):
    """`count` connections, (peer, inode, fd), taken one at a time from whoever holds the most, newest first
    (the kernel numbers sockets in the order they were made)."""
    for conns in by_peer.values():
        conns.sort()
    heap = [(-len(conns), peer) for peer, conns in by_peer.items()]
    heapq.heapify(heap)
    while count > 0 and heap:
        size, peer = heapq.heappop(heap)
        inode, fd = by_peer[peer].pop()
        yield peer, inode, fd
        count -= 1
        if size + 1 < 0:
            heapq.heappush(heap, (size + 1, peer))
