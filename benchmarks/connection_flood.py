"""gmuxd under a connection flood, against the same gmuxd quiet, in one run.

    .venv/bin/python benchmarks/connection_flood.py [--flooders 8] [--seconds 15] [--hard-limit 20000]
                                                    [--json benchmarks/results/connection_flood.json]

Starts a private gmuxd (two virtual GPUs) with a soft limit of 1024 open files and the hard limit given (it
raises its own to it), and a client that keeps one connection open, as a job's does. It times `ping` over that
connection quiet, then while FLOODERS processes open connections to gmuxd's socket as fast as they can, holding
up to 15,000 each (dropping their oldest 5,000 past that, and counting those gmuxd ended). Reports the client's
ping latency in both phases and their ratio, the connections made and ended, gmuxd's most open files and its
memory at its most and 2 s after the flood; and whether gmuxd was still there at the end. Before
gmux.wire.connection_guard, libzmq aborted gmuxd at its 1,024th connection. The last line:
    connection_flood: survived=<0|1> ping_p99_ratio=<flood/quiet> connections=<made> ended=<by gmuxd>
                      rss_after_mib=<gmuxd's memory 2 s after the flood>
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

from gmux.wire.daemon_client import Client, GmuxError

HERE = os.path.dirname(os.path.abspath(__file__))

FLOOD = """
import json, resource, socket, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, made, refused, ended, start = [], 0, 0, 0, time.monotonic()
while time.monotonic() - start < seconds:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        held.append(s)
        made += 1
    except OSError:
        s.close()
        refused += 1
    if len(held) > min(15000, hard - 100):
        for old in held[:5000]:
            old.setblocking(False)
            try:
                while old.recv(4096):
                    pass
                ended += 1            # read to its end: gmuxd ended it
            except BlockingIOError:
                pass
            except OSError:
                ended += 1
            old.close()
        held = held[5000:]
print(json.dumps({"made": made, "refused": refused, "ended_seen": ended}))
"""


def pings(client: Client, until: float, every: float) -> tuple[list, int]:
    times, failed = [], 0
    while time.monotonic() < until:
        t0 = time.perf_counter()
        try:
            client.call("ping", timeout=10)
            times.append(time.perf_counter() - t0)
        except GmuxError:
            failed += 1
        time.sleep(every)
    return times, failed


def files_and_rss(pid: int) -> tuple[int, int]:
    try:
        files = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))
        return files, rss
    except (OSError, StopIteration):
        return 0, 0


def summary(times: list) -> dict:
    ms = sorted(t * 1000 for t in times)
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "median_ms": statistics.median(ms), "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
            "max_ms": ms[-1]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flooders", type=int, default=8)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--hard-limit", type=int, default=20000, help="gmuxd's hard limit on open files")
    p.add_argument("--json", default=os.path.join(HERE, "results", "connection_flood.json"))
    a = p.parse_args()
    hard_here = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if a.hard_limit > hard_here:
        p.error(f"--hard-limit {a.hard_limit} is above this shell's own hard limit ({hard_here})")
    with tempfile.TemporaryDirectory(prefix="gmux-flood-") as tmp:
        rt = os.path.join(tmp, "rt")
        log = open(os.path.join(tmp, "gmuxd.log"), "wb")
        daemon = subprocess.Popen([sys.executable, "-m", "gmux.cli.gmuxd", "--runtime-dir", rt, "--virtual-gpus",
                                   "2x16GiB"], stdout=log, stderr=subprocess.STDOUT,
                                  preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, a.hard_limit)))
        try:
            client = None
            for _ in range(200):
                try:
                    client = Client(rt, timeout=1)
                    client.call("ping", timeout=1)
                    break
                except GmuxError:
                    client = None
                    time.sleep(0.1)
            if client is None:
                raise SystemExit("gmuxd did not come up: " + open(os.path.join(tmp, "gmuxd.log")).read()[-500:])
            quiet, quiet_failed = pings(client, time.monotonic() + 3.0, 0.05)
            flooders = [subprocess.Popen([sys.executable, "-c", FLOOD, os.path.join(rt, "gmuxd.sock"),
                                          str(a.seconds)], stdout=subprocess.PIPE, text=True)
                        for _ in range(a.flooders)]
            most_files, most_rss, flood_times, flood_failed = 0, 0, [], 0
            end = time.monotonic() + a.seconds
            while time.monotonic() < end:
                t, f = pings(client, min(end, time.monotonic() + 0.5), 0.05)
                flood_times += t
                flood_failed += f
                files, rss = files_and_rss(daemon.pid)
                most_files, most_rss = max(most_files, files), max(most_rss, rss)
            seen = [json.loads(fl.communicate(timeout=60)[0]) for fl in flooders]
            survived = daemon.poll() is None
            after, after_failed = pings(client, time.monotonic() + 2.0, 0.05) if survived else ([], 0)
            rss_after = files_and_rss(daemon.pid)[1] if survived else 0
            client.close()
        finally:
            if daemon.poll() is None:
                daemon.terminate()
                daemon.wait(20)
        text = open(os.path.join(tmp, "gmuxd.log")).read()
    made = sum(s["made"] for s in seen)
    ended = sum(int(part.split()[0]) for line in text.splitlines() if "ended connections" in line
                for part in line.split("(", 1)[1].split(")", 1)[0].split(", "))
    phases = {"quiet": summary(quiet) | {"failed": quiet_failed},
              "flood": summary(flood_times) | {"failed": flood_failed},
              "after": summary(after) | {"failed": after_failed}}
    table = Table(title=f"gmuxd, one client's ping over its open connection; {a.flooders} flooders for "
                        f"{a.seconds:g} s (hard limit {a.hard_limit:,})")
    for col in ("phase", "pings", "failed", "median ms", "p99 ms", "max ms"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for name, s in phases.items():
        table.add_row(name, str(s.get("n", 0)), str(s["failed"]), *(f"{s[k]:.2f}" if k in s else "-"
                                                                   for k in ("median_ms", "p99_ms", "max_ms")))
    Console().print(table)
    ratio = phases["flood"].get("p99_ms", float("nan")) / phases["quiet"].get("p99_ms", float("nan"))
    print(f"connections made {made:,}, refused {sum(s['refused'] for s in seen):,}; ended by gmuxd {ended:,} "
          f"(its log); gmuxd's most open files {most_files:,}, its most memory {most_rss / (1 << 20):.0f} MiB, "
          f"{rss_after / (1 << 20):.0f} MiB 2 s after the flood")
    out = {"flooders": a.flooders, "seconds": a.seconds, "hard_limit": a.hard_limit, "survived": survived,
           "phases": phases, "ping_p99_ratio": ratio, "connections": made, "ended": ended,
           "most_files": most_files, "most_rss": most_rss, "rss_after": rss_after, "flooders_seen": seen}
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"connection_flood: survived={int(survived)} ping_p99_ratio={ratio:.2f} connections={made} ended={ended} "
          f"rss_after_mib={rss_after / (1 << 20):.0f}")
    return 0 if survived else 1


if __name__ == "__main__":
    sys.exit(main())
