"""A checkpoint's move into a receiver whose bulk port strangers flood, against the same move quiet, in one run.

    .venv/bin/python benchmarks/bulk_flood.py [--connections 3000] [--every 0.05] [--mib 51] [--moves 3]
                                              [--json benchmarks/results/bulk_flood.json]

A receiver hosted as a daemon's cluster link hosts one (its own process: a Curve ROUTER, the plain bulk socket
beside it, gmux.wire.keys.Guard on their context) takes a file of MIB MiB sent sealed (gmux.wire.transfer), MOVES
times per phase: quiet; while a flooder process holds CONNECTIONS connections to the bulk port from 127.0.0.2,
a host that never passed a Curve handshake, each sending a junk frame every EVERY seconds (half of them with no
login, half logged in as one of the moves' transfers with a guessed password); and the same flood from 127.0.0.1,
the sender's own address. Each is refused at its handshake (gmux.wire.sealed: a peer logs in with a transfer's
login). Before the Guard answered the bulk port's handshakes, both floods slowed moves 20-90x; before the login,
the second did (61x).
Reports each phase's median move time and its ratio to quiet, and the frames the receiver dropped. The last line:
    bulk_flood: elsewhere_ratio=<flooded/quiet> same_address_ratio=<flooded/quiet> refused=<handshakes>
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import zmq
from rich.console import Console
from rich.table import Table

from gmux import protocol
from gmux.util.fd_limit import raise_soft_limit
from gmux.wire import keys, sealed
from gmux.wire.receiver import Receiver
from gmux.wire.transfer import send_file

HERE = os.path.dirname(os.path.abspath(__file__))


def serve(keydir: str, directory: str) -> None:
    """The receiving host: prints its ports, then serves until stdin closes; at the end prints its counters."""
    ctx = zmq.Context()
    guard = keys.Guard(ctx, keydir, ("daemon",))
    sock = keys.server_socket(ctx, zmq.ROUTER, keydir, "daemon", "b")
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    plain, bulk_port = sealed.bulk_socket(ctx, f"tcp://127.0.0.1:{port}")
    recv = Receiver(directory, durable=False, bulk_port=bulk_port)
    guard.bulk_login = recv.bulk_login
    print(json.dumps({"port": port, "bulk": bulk_port}), flush=True)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(plain, zmq.POLLIN)
    while not done.is_set():
        ready = dict(poller.poll(50))
        if plain in ready:
            sealed.serve_bulk(plain, recv.handle_sealed)
        if sock in ready:
            ident, *frames = sock.recv_multipart()
            msg = protocol.decode(frames[0], protocol.CLUSTER_MESSAGES)
            ok, out = recv.handle(msg, frames[1] if len(frames) > 1 else None)
            sock.send_multipart([ident, protocol.reply(msg.id, True, data=out) if ok else
                                 protocol.error_reply(msg.id, out)])
    print(json.dumps({"dropped": recv.dropped_sealed, "refused_bulk": guard.refused_bulk}), flush=True)
    for s in (sock, plain):
        s.close(0)
    guard.stop()
    ctx.term()


def flood(source: str, port: int, connections: int, every: float) -> None:
    """CONNECTIONS connections from `source` to the bulk port, each sending a junk frame every `every` s, until
    stdin closes: half with no login, half logged in (PLAIN) as one of the moves' transfers (their names are
    c1-m0, c1-m1, ...), with a guessed password."""
    raise_soft_limit()
    ctx = zmq.Context(io_threads=2)
    ctx.set(zmq.MAX_SOCKETS, connections + 64)
    socks = []
    for n in range(connections):
        s = ctx.socket(zmq.DEALER)
        if n % 2:
            s.plain_username, s.plain_password = f"c1-m{n // 2 % 16}".encode(), os.urandom(32).hex().encode()
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 4)
        s.connect(f"tcp://{source}:0;127.0.0.1:{port}")
        socks.append(s)
    junk = [os.urandom(64), os.urandom(4096)]
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print("flooding", flush=True)
    while not done.is_set():
        start = time.monotonic()
        for s in socks:
            try:
                s.send_multipart(junk, zmq.NOBLOCK)
            except zmq.Again:
                pass
        time.sleep(max(0.0, every - (time.monotonic() - start)))
    for s in socks:
        s.close(0)
    ctx.term()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--connections", type=int, default=3000)
    p.add_argument("--every", type=float, default=0.05)
    p.add_argument("--mib", type=int, default=51)
    p.add_argument("--moves", type=int, default=3)
    p.add_argument("--json", default=os.path.join(HERE, "results", "bulk_flood.json"))
    p.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--flood", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        serve(*a.serve)
        return 0
    if a.flood:
        flood(a.flood[0], int(a.flood[1]), a.connections, a.every)
        return 0
    if not sealed.available():
        print("bulk_flood: the cryptography package is not installed: transfers stay on Curve", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="gmux-bulk-flood-")
    keydir = os.path.join(tmp, "keys")
    for name in ("a", "b"):
        keys.create(keydir, "daemon", name)
    src = os.path.join(tmp, "src.ckpt")
    with open(src, "wb") as f:
        f.write(os.urandom(a.mib << 20))
    me = [sys.executable, os.path.abspath(__file__), "--connections", str(a.connections), "--every", str(a.every)]
    host = subprocess.Popen(me + ["--serve", keydir, os.path.join(tmp, "in")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    ports = json.loads(host.stdout.readline())
    endpoint, server_key = f"tcp://127.0.0.1:{ports['port']}", keys.load_public(keydir, "daemon", "b")
    names = (f"c1-m{n}" for n in itertools.count())     # each move a transfer of its own

    def phase(source):
        flooder = None
        if source:
            flooder = subprocess.Popen(me + ["--flood", source, str(ports["bulk"])], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)
            if flooder.stdout.readline().strip() != "flooding":
                raise SystemExit(f"bulk_flood: the flooder from {source} did not start")
            time.sleep(2.0)         # its connections made (and, from elsewhere, refused)
        times = []
        try:
            for _ in range(a.moves):
                r = send_file(src, endpoint, server_key, keydir, "daemon", "a", next(names), timeout=10.0)
                times.append(r["seconds"])
                os.unlink(r["path"])
        finally:
            if flooder is not None:
                flooder.stdin.close()
                flooder.wait(60)
        return times

    phases = {"quiet": phase(None), "elsewhere": phase("127.0.0.2"), "same address": phase("127.0.0.1")}
    host.stdin.close()
    counters = json.loads(host.stdout.readline())
    host.wait(30)
    quiet = statistics.median(phases["quiet"])
    rows = {name: {"median_s": statistics.median(t), "seconds": t, "ratio": statistics.median(t) / quiet}
            for name, t in phases.items()}
    table = Table(title=f"a {a.mib} MiB move, sealed; {a.connections} junk connections, a frame each every "
                        f"{a.every:g} s")
    for col in ("flood from", "median s", "moves (s)", "vs quiet"):
        table.add_column(col, justify="right" if col != "flood from" else "left")
    for name, r in rows.items():
        table.add_row(name, f"{r['median_s']:.2f}", " ".join(f"{s:.2f}" for s in r["seconds"]),
                      f"{r['ratio']:.2f}x")
    Console().print(table)
    print(f"receiver: {counters['dropped']} junk frames dropped, {counters['refused_bulk']} bulk handshakes refused")
    out = {"connections": a.connections, "every_s": a.every, "mib": a.mib, "phases": rows, **counters}
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"bulk_flood: elsewhere_ratio={rows['elsewhere']['ratio']:.2f} "
          f"same_address_ratio={rows['same address']['ratio']:.2f} refused={counters['refused_bulk']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
