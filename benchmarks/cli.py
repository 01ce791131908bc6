"""How fast the gmux CLI answers, against the start-up of a bare Python that imports pyzmq, in the same run.

    .venv/bin/python benchmarks/cli.py [--runs 15] [--json benchmarks/results/cli.json]

Starts a private gmuxd with two virtual GPUs (its job table empty), then times, alternating
so that machine noise falls on all alike: `python -c "import zmq"` (the floor: an interpreter and the one
library every gmux command needs), `gmux --help`, and `gmux ps` against the running daemon. Each command is a
fresh process, as a user's shell starts it. Target (issue 14): `gmux ps` within 3x the floor.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)


def wall(cmd: list, env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--json", default=os.path.join(HERE, "results", "cli.json"))
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gmux-cli-") as rundir:
        env = {**os.environ, "GMUX_RUNTIME_DIR": rundir}
        daemon = subprocess.Popen([os.path.join(BIN, "gmuxd"), "--virtual-gpus", "2x8GiB", "--runtime-dir", rundir],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while subprocess.run([os.path.join(BIN, "gmux"), "ps"], env=env, capture_output=True).returncode:
                if time.monotonic() > deadline:
                    raise SystemExit("gmuxd did not start in 30 s")
                time.sleep(0.2)
            cmds = {"python -c 'import zmq'": [sys.executable, "-c", "import zmq"],
                    "gmux --help": [os.path.join(BIN, "gmux"), "--help"],
                    "gmux ps": [os.path.join(BIN, "gmux"), "ps"]}
            times: dict[str, list] = {k: [] for k in cmds}
            for _ in range(a.runs):
                for name, cmd in cmds.items():
                    times[name].append(wall(cmd, env))
        finally:
            daemon.terminate()
            daemon.wait(10)
    floor = statistics.median(times["python -c 'import zmq'"])
    table = Table(title=f"CLI start-up, median of {a.runs} fresh processes each")
    for col in ("command", "median ms", "p90 ms", "vs bare python"):
        table.add_column(col, justify="right" if col != "command" else "left")
    rows = []
    for name, ts in times.items():
        med, p90 = statistics.median(ts), sorted(ts)[int(0.9 * (len(ts) - 1))]
        rows.append({"command": name, "median_s": med, "p90_s": p90, "ratio": med / floor})
        table.add_row(name, f"{med * 1000:.0f}", f"{p90 * 1000:.0f}", f"{med / floor:.2f}")
    Console().print(table)
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"runs": a.runs, "rows": rows, "load": os.getloadavg()}, f, indent=2)
    ratio = next(r["ratio"] for r in rows if r["command"] == "gmux ps")
    help_ratio = next(r["ratio"] for r in rows if r["command"] == "gmux --help")
    print(f"cli: gmux_ps_vs_bare_python={ratio:.2f} gmux_help_vs_bare_python={help_ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
