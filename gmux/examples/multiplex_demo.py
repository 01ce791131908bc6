"""The multiplexer demo: five real training jobs on two GPUs, time-sliced and packed, watched live.

    python -m gmux.examples.multiplex_demo [--duration 40] [--quantum 2]

Starts a private gmuxd (virtual GPUs: jobs compute on the CPU), then launches unmodified training scripts
with gmux-launch: three on GPU 0 whose working sets do not fit together (time-sliced, weights 1:1:2) and a
compatible pair on GPU 1 (mostly waiting for input, so packing them gains). Shows the live table, then a
summary: each job's progress and GPU share against its weight, suspend/resume costs, and the packing
decisions with their numbers. Everything is shut down at the end.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from gmux.wire.daemon_client import Client, GmuxError
from gmux.cli.tables import gpus_table, jobs_table

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_train.py")

# name, GPU, weight, memory, script arguments
JOBS = [
    ("resnet-ish", 0, 1, "600MiB", ["--hidden", "256", "--batch", "64"]),
    ("mlp-wide", 0, 1, "600MiB", ["--hidden", "384", "--batch", "48"]),
    ("mlp-deep", 0, 2, "600MiB", ["--hidden", "128", "--depth", "2", "--batch", "64"]),
    ("reader-a", 1, 1, "300MiB", ["--sleep", "0.01"]),
    ("reader-b", 1, 1, "300MiB", ["--sleep", "0.01", "--hidden", "96"]),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gmux.examples.multiplex_demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=45.0, help="seconds to run the jobs (default 45)")
    p.add_argument("--quantum", type=float, default=2.0, help="time-slice quantum in seconds (default 2)")
    a = p.parse_args(argv)
    con = Console(width=None if sys.stdout.isatty() else 150)
    work = tempfile.mkdtemp(prefix="gmux-demo-")
    rt = os.path.join(work, "rt")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    daemon_log = open(os.path.join(work, "gmuxd.log"), "wb")
    con.print(f"[bold]gmux demo[/]: starting gmuxd with two virtual GPUs of 1 GiB (runtime dir {rt})")
    daemon = subprocess.Popen([sys.executable, "-m", "gmux.cli.gmuxd", "--runtime-dir", rt, "--virtual-gpus",
                               "2x1GiB", "--quantum", str(a.quantum), "--pack-window", "3", "--pack-margin", "0.3"],
                              env=env, stdout=daemon_log, stderr=subprocess.STDOUT)
    procs = []
    try:
        client = _connect(rt)
        for i, (name, gpu, weight, mem, args) in enumerate(JOBS):
            cmd = [sys.executable, "-m", "gmux.cli.launch", "--runtime-dir", rt, "--gpu", str(gpu), "--weight",
                   str(weight), "--mem", mem, "--name", name, "--", "python", TRAIN,
                   os.path.join(work, f"{name}.json"), "100000000", *args]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                          stderr=open(os.path.join(work, f"{name}.log"), "wb")))
            con.print(f"  gmux-launch --gpu {gpu} --weight {weight} --mem {mem} -- python demo_train.py "
                      f"{' '.join(args)}   [dim]({name})[/]")
        start = time.monotonic()
        with Live(console=con, refresh_per_second=4) as live:
            while time.monotonic() - start < a.duration:
                ps = client.call("ps")
                live.update(Group(jobs_table(ps, f"gmux — {time.monotonic() - start:4.0f}/{a.duration:.0f} s"),
                                  gpus_table(ps)))
                time.sleep(0.5)
        final = client.call("ps")
        decisions = client.call("decisions", limit=200)["decisions"]
        _summary(con, final, decisions)
        client.call("shutdown", kill_jobs=True)
        daemon.wait(15)
        con.print("[bold]gmux demo[/]: all jobs stopped, gmuxd shut down cleanly.")
        return 0
    except GmuxError as e:
        con.print(f"[red]gmux demo: {e}[/] (gmuxd log: {daemon_log.name})")
        return 1
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
                pr.wait()
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(work, ignore_errors=True)


def _connect(rt: str, timeout: float = 20.0) -> Client:
    deadline = time.monotonic() + timeout
    while True:
        try:
            c = Client(rt, timeout=2)
            c.call("ping")
            return c
        except GmuxError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _summary(con: Console, ps: dict, decisions: list) -> None:
    jobs = {j["id"]: j for j in ps["jobs"]}
    t = Table(title="summary: progress and fairness", title_justify="left")
    for col in ("JOB", "NAME", "GPU", "WEIGHT", "STEPS", "GPU-s", "SHARE (of GPU's jobs)", "EXPECTED",
                "SUSPENDS", "SUSPEND+RESUME s", "PER SWITCH ms"):
        t.add_column(col)
    for gpu in sorted({j["gpu"] for j in jobs.values()}):
        mine = [j for j in jobs.values() if j["gpu"] == gpu]
        # Shares over the whole run: the slicer charges each job's start-up to its own turn and evens it out.
        used = {j["id"]: j["gpu_seconds"] for j in mine}
        total = sum(used.values()) or 1.0
        wsum = sum(j["weight"] for j in mine)
        packed = any(len(p) > 1 for g in ps["gpus"] if g["index"] == gpu for p in g["packs"])
        for j in mine:
            expected = "1 (packed)" if packed else f"{j['weight'] / wsum:.2f}"
            share = f"{used[j['id']] / total:.2f}" if not packed else f"{used[j['id']] / max(used.values()):.2f}"
            per = 1e3 * j["suspend_seconds"] / max(1, 2 * j["suspends"])
            t.add_row(j["id"], j.get("name") or "", str(gpu), f"{j['weight']:g}", str(j["step"]),
                      f"{j['gpu_seconds']:.1f}", share, expected, str(j["suspends"]), f"{j['suspend_seconds']:.2f}",
                      f"{per:.1f}")
    con.print(t)
    con.print("[dim]SHARE: the job's GPU time over its GPU's total (time-sliced GPU); on a packed GPU every job "
              "holds the GPU all the time. PER SWITCH: mean time from a suspend or resume command to the job's "
              "acknowledgement, including the wait for its next mini-batch boundary and, once per job, the "
              "runtime's discovery of an unmodified script's state at its first suspend.[/]")
    packing = [d for d in decisions if d["kind"] in ("trial", "keep", "unpack")]
    con.print("[bold]packing decisions[/]" if packing else "[bold]packing decisions[/]: none yet")
    for d in packing:
        con.print(f"  {d['kind']:6} {d['text']}")
    ends = [d for d in decisions if d["kind"] == "end"]
    for d in ends:
        con.print(f"  end    {d['text']}")


if __name__ == "__main__":
    sys.exit(main())
