"""A loopback TCP forwarder a test can cut: what a dropped connection between two machines looks like."""
from __future__ import annotations

import socket
import threading


class Proxy:
    """Forwards 127.0.0.1:port -> 127.0.0.1:target. `cut_after` bytes (client->server) into the first
    connection, it closes both sides of that connection once; later connections are forwarded untouched.
    `flip_at`: the byte at that offset of everything sent client->server is changed, once (a damaged or
    tampered frame). `watch`: whether those bytes ever passed client->server (`seen`)."""

    def __init__(self, target_port: int, cut_after: int | None = None, flip_at: int | None = None,
                 watch: bytes | None = None):
        self.target = target_port
        self.cut_after = cut_after
        self.flip_at = flip_at
        self.watch = watch
        self.seen = False
        self._tail = b""
        self.cuts = 0
        self.forwarded = 0
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(8)
        self.port = self.lsock.getsockname()[1]
        self._stop = False
        self.severed = False
        self._live: list = []
        self._lock = threading.Lock()        # (the accepting thread and sever() share the open connections)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._stop:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            with self._lock:
                if self.severed:        # a partition: the connection goes nowhere
                    c.close()
                    continue
                s = socket.create_connection(("127.0.0.1", self.target))
                self._live += [c, s]
            threading.Thread(target=self._pump, args=(c, s, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, False), daemon=True).start()

    def _pump(self, src, dst, upstream):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if upstream:
                    if self.flip_at is not None and self.forwarded <= self.flip_at < self.forwarded + len(data):
                        i = self.flip_at - self.forwarded
                        data = data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1:]
                    if self.watch:
                        self.seen |= self.watch in self._tail + data
                        self._tail = data[-len(self.watch):]
                    self.forwarded += len(data)
                    if self.cut_after is not None and self.cuts == 0 and self.forwarded > self.cut_after:
                        self.cuts += 1
                        break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def sever(self):
        """A network partition: every connection through the proxy is cut, and new ones are closed at once."""
        with self._lock:
            self.severed = True
            live, self._live = self._live, []
        for s in live:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def heal(self):
        self.severed = False

    def close(self):
        self._stop = True
        self.lsock.close()
