"""A connection flood for the tests of gmux.wire.connection_guard: holds up to MOST connections to a unix socket
(PATH) or a TCP port on 127.0.0.1 (from SOURCE) for SECONDS, opening 200 at a time and again as the server ends
them; prints how many it held at the end and how many the server ended.

    python flood.py unix PATH MOST SECONDS
    python flood.py tcp PORT SOURCE MOST SECONDS
"""
import json
import resource
import socket
import sys
import time


def connect(argv: list):
    if argv[0] == "unix":
        s = socket.socket(socket.AF_UNIX)
        s.connect(argv[1])
    else:
        s = socket.socket()
        s.bind((argv[2], 0))
        s.connect(("127.0.0.1", int(argv[1])))
    return s


def main(argv: list) -> None:
    most, seconds = int(argv[-2]), float(argv[-1])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    held, ended, start = [], 0, time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(200):
            if len(held) < most:
                try:
                    held.append(connect(argv))
                except OSError:
                    pass
        time.sleep(0.05)
        still = []
        for s in held:
            try:
                if s.recv(4096, socket.MSG_DONTWAIT) == b"":
                    raise ConnectionResetError
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                ended += 1
                continue
            still.append(s)
        held = still
    print(json.dumps({"held": len(held), "ended": ended}))


if __name__ == "__main__":
    main(sys.argv[1:])
