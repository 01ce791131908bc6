"""What multiplexing costs: slicing efficiency, boundary-hook cost, command latency, daemon throughput, and how
much of a busy GPU's wall time is accounted to its jobs.

    python benchmarks/multiplex.py [--quick] [--only abcde] [--cycles N] [--json benchmarks/results/multiplex.json]

(a) slicing efficiency: aggregate mini-batches/s of three jobs time-sliced on one virtual GPU, over the rate
    of one job alone on the same GPU, at quanta of 2 s and 10 s. Real gmuxd, real gmux-launch processes.
    "Alone" is measured side by side in the same run (each job's rate while it holds the GPU by itself, as
    gmuxd measures it), because this machine is shared and its speed drifts between runs; the ratio over
    separate solo runs (before and after, averaged) is reported too.
(b) boundary hook cost with nothing pending: the installed optimizer post-hook called as torch calls it
    (Job.boundary() through the gmuxd agent: a timestamp and a non-blocking zmq poll), best of 5.
(c) command latency from a `gmux suspend` request to the job's acknowledgement (the reply gmuxd sends once
    the job has suspended), for a job with 10 ms mini-batches; p50/p99 over many suspend/resume cycles, split
    into the wait for the job's next boundary (stamped by the job) and gmux's own part. Baseline, same run:
    the same job and the same four hops through a bare ZeroMQ relay with no gmux code (bare_relay.py).
(d) messages per second one gmuxd sustains: job heartbeats (validated, authenticated, answered) from a
    pipelining client.
(e) GPU time accounted on a busy GPU: one job with 0.5 s mini-batches (longer than the 0.5 s quantum's share
    of a step) time-sliced with two short-step jobs; the jobs' GPU-seconds over the GPU's wall time, against
    1.0 (a job holds the GPU from its resume's sending to its suspend's acknowledgement, never while stopped).
Last line: multiplex: slicing_efficiency_q10=<ratio> hook_us=<n> cmd_p99_ms=<n> msgs_per_s=<n>
    accounted_fraction=<ratio> (the parts run)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SCRIPT = os.path.join(ROOT, "gmux", "examples", "demo_train.py")
PY = sys.executable

from gmux.wire.daemon_client import Client, GmuxError  # noqa: E402


def env() -> dict:
    e = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return e


class Gmuxd:
    def __init__(self, *args: str):
        self.dir = tempfile.mkdtemp(prefix="gmux-bench-")
        self.rt = os.path.join(self.dir, "rt")
        self.proc = subprocess.Popen([PY, "-m", "gmux.cli.gmuxd", "--runtime-dir", self.rt, *args], env=env(),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.jobs: list[subprocess.Popen] = []
        deadline = time.monotonic() + 20
        while True:
            try:
                self.client = Client(self.rt, timeout=1)
                self.client.call("ping")
                break
            except GmuxError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def launch(self, *args: str, opts=()) -> str:
        p = subprocess.Popen([PY, "-m", "gmux.cli.launch", "--runtime-dir", self.rt, *opts, "--", "python", SCRIPT,
                              os.path.join(self.dir, f"out{len(self.jobs)}.json"), *args], env=env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.jobs.append(p)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for j in self.client.call("ps")["jobs"]:
                if j["pid"] == p.pid:
                    return j["id"]
            time.sleep(0.05)
        raise RuntimeError("job did not register")

    def ps(self) -> dict:
        return {j["id"]: j for j in self.client.call("ps")["jobs"]}

    def close(self) -> None:
        for p in self.jobs:
            p.kill()
            p.wait()
        self.proc.kill()
        self.proc.wait()
        self.client.close()
        shutil.rmtree(self.dir, ignore_errors=True)


JOB_ARGS = ("100000000", "--hidden", "256", "--batch", "64")


def rate_over(g: Gmuxd, ids: list, seconds: float) -> float:
    """Aggregate mini-batches/s of `ids` over `seconds`, counted from the jobs' own step reports,
    starting once every job has trained (process start-up is not the multiplexer's cost)."""
    deadline = time.monotonic() + 120
    while not all(g.ps()[j]["step"] > 0 for j in ids):
        if time.monotonic() > deadline:
            raise RuntimeError("jobs did not start")
        time.sleep(0.2)
    t0, s0 = time.monotonic(), sum(g.ps()[j]["step"] for j in ids)
    time.sleep(seconds)
    t1, s1 = time.monotonic(), sum(g.ps()[j]["step"] for j in ids)
    return (s1 - s0) / (t1 - t0)


def solo_rate(seconds: float) -> float:
    g = Gmuxd("--virtual-gpus", "1x1GiB", "--no-pack")
    try:
        j = g.launch(*JOB_ARGS, opts=["--mem", "600MiB"])
        return rate_over(g, [j], seconds)
    finally:
        g.close()


def sliced_rate(quantum: float, seconds: float) -> tuple[float, int, float]:
    g = Gmuxd("--virtual-gpus", "1x1GiB", "--no-pack", "--quantum", str(quantum))
    try:
        ids = [g.launch(*JOB_ARGS, opts=["--mem", "600MiB"]) for _ in range(3)]
        # Let every job have its first turn (start-up) before measuring.
        deadline = time.monotonic() + 120
        while not all(g.ps()[j]["suspends"] >= 1 for j in ids) and time.monotonic() < deadline:
            time.sleep(0.2)
        # Side by side in the same run: the rate a job reaches while it holds the GPU alone (gmuxd's
        # per-residency measurement), sampled throughout the window; robust to the machine's drift.
        alone: list = []
        stop = time.monotonic() + seconds + 30
        import threading
        done = threading.Event()

        def sample():
            c = Client(g.rt, timeout=5)
            while not done.is_set() and time.monotonic() < stop:
                for j in c.call("ps")["jobs"]:
                    if j["state"] == "running" and j["rate_now"]:
                        alone.append(j["rate_now"])
                time.sleep(0.25)
            c.close()
        t = threading.Thread(target=sample)
        t.start()
        try:
            r = rate_over(g, ids, seconds)
        finally:
            done.set()
            t.join()
        return r, g.client.call("ps")["gpus"][0]["switches"], statistics.median(alone) if alone else float("nan")
    finally:
        g.close()


def hook_cost(n: int = 200_000) -> dict:
    import torch
    from gmux.job import install_hook
    from gmux.job.agent import Agent
    g = Gmuxd("--virtual-gpus", "1x1GiB")
    try:
        agent = Agent("ipc://" + os.path.join(g.rt, "gmuxd.sock"))
        agent.register(pid=os.getpid(), argv=["bench"])
        agent.state = "running"
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=0.1)
        p.grad = torch.zeros(1)

        def per_step(k):
            t = time.perf_counter()
            for _ in range(k):
                opt.step()
            return (time.perf_counter() - t) / k * 1e6
        without = min(per_step(n // 10) for _ in range(5))
        job = install_hook(controller=agent)
        with_hook = min(per_step(n // 10) for _ in range(5))
        # The installed hook itself, called as torch calls it after each step.
        from torch.optim.optimizer import _global_optimizer_post_hooks
        hook = list(_global_optimizer_post_hooks.values())[-1]
        hooks = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                hook(opt, (), {})
            hooks.append((time.perf_counter() - t) / n * 1e6)
        best = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                job.boundary()
            best.append((time.perf_counter() - t) / n * 1e6)
        return {"hook_us": min(hooks), "hook_us_median": statistics.median(hooks),
                "boundary_us": min(best), "boundary_us_median": statistics.median(best),
                "step_us_without_hook": without, "step_us_with_hook": with_hook,
                "hook_step_overhead_us": with_hook - without}
    finally:
        g.close()


def command_latency(cycles: int) -> dict:
    g = Gmuxd("--virtual-gpus", "1x1GiB")
    try:
        j = g.launch("100000000", "--sleep", "0.01", opts=["--mem", "100MiB"])   # ~10 ms mini-batches
        deadline = time.monotonic() + 60
        # A report taken after 20 mini-batches: the first ones include the script's start-up.
        while g.ps()[j]["report"].get("step", 0) < 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        batch = g.ps()[j]["report"].get("batch_s") or 0.011
        rng = random.Random(0)
        lat = []
        # Where the time goes, from gmuxd's reply: the wait for the job's next boundary (the rest of the
        # mini-batch in progress, from the job's own stamp), and what is gmux's own: the rest of the job's part
        # (the command's way to the job, the suspend, the result's way back), gmuxd's handling of the request
        # and the result, and the request's and the reply's way between client and gmuxd.
        parts: dict[str, list] = {"boundary_wait": [], "own": [], "job": [], "gmuxd": [], "client_gmuxd": []}
        first = None
        for i in range(cycles + 2):
            t = time.perf_counter()
            r = g.client.call("suspend", job=j, timeout=30)
            ms = (time.perf_counter() - t) * 1e3
            if i == 0:
                first = ms      # discovers the job's state and allocates host buffers once: reported apart
            elif i >= 2:
                lat.append(ms)
                wait = r["boundary_wait_s"] * 1e3
                parts["boundary_wait"].append(wait)
                parts["own"].append(ms - wait)
                parts["job"].append(r["job_latency_s"] * 1e3 - wait)
                parts["gmuxd"].append((r["latency_s"] - r["job_latency_s"]) * 1e3)
                parts["client_gmuxd"].append(ms - r["latency_s"] * 1e3)
            g.client.call("resume", job=j)
            while g.ps()[j]["state"] != "running":
                time.sleep(0.002)
            # The job's boundaries keep one phase relative to this loop after a resume, so a fixed pause would
            # land every request at the same point of a mini-batch: add a uniformly random part of one.
            time.sleep(0.03 + rng.uniform(0, batch))
        batch_s = g.ps()[j]["report"].get("batch_s") or 0.0
        return {**_percentiles(lat), "cycles": cycles, "batch_ms": batch_s * 1e3, "first_suspend_ms": first,
                "parts": {k: _percentiles(v) for k, v in parts.items()}}
    finally:
        g.close()


def bare_latency(cycles: int, batch_s: float) -> dict:
    """The honest baseline for (c): the same job and the same four hops through a relay, with no gmux code
    (benchmarks/bare_relay.py): what any boundary-stopping multiplexer pays on this machine."""
    import zmq
    d = tempfile.mkdtemp(prefix="gmux-bare-")
    endpoint = f"ipc://{d}/relay.sock"
    tool = os.path.join(ROOT, "benchmarks", "bare_relay.py")
    procs = [subprocess.Popen([PY, tool, "relay", endpoint], env=env(), stdout=subprocess.DEVNULL),
             subprocess.Popen([PY, tool, "job", endpoint, SCRIPT, os.path.join(d, "out.json"), "100000000",
                               "--sleep", "0.01"], env=env(), stdout=subprocess.DEVNULL)]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        def call() -> bytes:
            sock.send(b"suspend")
            if not sock.poll(30_000):
                raise RuntimeError("bare relay: no answer in 30 s")
            return sock.recv()
        deadline = time.monotonic() + 60
        while call() == b"no job yet":
            if time.monotonic() > deadline:
                raise RuntimeError("bare relay: the job did not start")
            time.sleep(0.1)
        time.sleep(1.0)     # past the script's first mini-batches, as (c) waits for 20 of them
        rng = random.Random(1)
        lat = []
        for i in range(cycles + 2):
            t = time.perf_counter()
            call()
            if i >= 2:
                lat.append((time.perf_counter() - t) * 1e3)
            time.sleep(0.03 + rng.uniform(0, batch_s))
        return _percentiles(lat)
    finally:
        sock.close(0)
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


def _percentiles(ms: list) -> dict:
    ms = sorted(ms)
    return {"p50_ms": statistics.median(ms), "p90_ms": ms[int(0.9 * len(ms))],
            "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))], "max_ms": ms[-1]}


def throughput(seconds: float = 3.0, window: int = 2000) -> dict:
    import zmq
    from gmux import protocol
    g = Gmuxd("--virtual-gpus", "1x1GiB")
    try:
        from gmux.job.agent import Agent
        agent = Agent("ipc://" + os.path.join(g.rt, "gmuxd.sock"))
        reg = agent.register(pid=os.getpid(), argv=["bench"])
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect("ipc://" + os.path.join(g.rt, "gmuxd.sock"))
        frame = protocol.encode("heartbeat", 1, job=reg["job"], token=reg["token"], state="waiting")
        sent = got = errors = 0
        t0 = time.perf_counter()
        end = t0 + seconds
        while True:
            now = time.perf_counter()
            if now < end:
                while sent - got < window:
                    sock.send(frame, zmq.NOBLOCK)
                    sent += 1
            elif got >= sent:
                break
            if sock.poll(1000):
                while True:
                    try:
                        r = sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    got += 1
                    if b"\xa2ok\xc2" in r:
                        errors += 1
            elif now > end + 10:
                break
        elapsed = time.perf_counter() - t0
        sock.close(0)
        return {"msgs_per_s": got / elapsed, "messages": got, "errors": errors, "seconds": elapsed}
    finally:
        g.close()


def mixed_accounting(quantum: float, seconds: float) -> dict:
    """One job whose mini-batch (0.5 s, paced) is longer than the quantum among two short-step jobs: the
    fraction of the GPU's wall time accounted to the jobs as GPU-seconds (1.0: every second of a busy GPU is
    some job's), and the long job's suspends per step (its turn stretches to a couple of its mini-batches)."""
    g = Gmuxd("--virtual-gpus", "1x1GiB", "--no-pack", "--quantum", str(quantum))
    try:
        ids = [g.launch(*JOB_ARGS, opts=["--mem", "300MiB"]) for _ in range(2)]
        long = g.launch(*JOB_ARGS, "--sleep", "0.5", opts=["--mem", "300MiB"])
        deadline = time.monotonic() + 120
        while g.ps()[long]["step"] < 3 or not all(g.ps()[j]["step"] > 0 for j in ids):
            if time.monotonic() > deadline:
                raise RuntimeError("jobs did not start")
            time.sleep(0.2)
        before, t0 = g.ps(), time.monotonic()
        time.sleep(seconds)
        after, t1 = g.ps(), time.monotonic()
        d = {j: {k: after[j][k] - before[j][k] for k in ("gpu_seconds", "step", "suspends", "stops")}
             for j in ids + [long]}
        return {"fraction": sum(x["gpu_seconds"] for x in d.values()) / (t1 - t0), "wall_s": t1 - t0,
                "quantum": quantum, "long_steps": d[long]["step"], "long_suspends": d[long]["suspends"],
                "stops": sum(x["stops"] for x in d.values()), "jobs": d}
    finally:
        g.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="shorter windows (less precise)")
    p.add_argument("--only", default="abcde", metavar="PARTS",
                   help="run only these parts, e.g. --only c for command latency (default: abcde, all)")
    p.add_argument("--cycles", type=int, help="suspend/resume cycles for (c) (default 200; 60 with --quick)")
    p.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "multiplex.json"))
    a = p.parse_args()
    parts = set(a.only)
    if not parts or parts - set("abcde"):
        p.error(f"--only takes letters among a, b, c, d, e; got {a.only!r}")
    solo_s, q2_s, q10_s, cycles = (8, 14, 30, 60) if a.quick else (15, 30, 60, 200)
    cycles = a.cycles or cycles
    res: dict = {"machine": {"cpus": os.cpu_count(), "loadavg": os.getloadavg()}, "quick": a.quick}
    rows, last = [], []
    if "a" in parts:
        print("(a) time-slicing efficiency ...", flush=True)
        solo1 = solo_rate(solo_s)
        q2, sw2, alone2 = sliced_rate(2.0, q2_s)
        q10, sw10, alone10 = sliced_rate(10.0, q10_s)
        solo2 = solo_rate(solo_s)
        solo = (solo1 + solo2) / 2
        s = res["slicing"] = {
            "solo_rate": solo, "solo_before": solo1, "solo_after": solo2,
            "q2": {"rate": q2, "efficiency": q2 / alone2, "vs_separate_solo_runs": q2 / solo,
                   "alone_rate_in_run": alone2, "switches": sw2, "window_s": q2_s},
            "q10": {"rate": q10, "efficiency": q10 / alone10, "vs_separate_solo_runs": q10 / solo,
                    "alone_rate_in_run": alone10, "switches": sw10, "window_s": q10_s}}
        rows.append(("solo runs (mini-batches/s), before/after", f"{s['solo_before']:.1f} / {s['solo_after']:.1f}", ""))
        for q in ("q2", "q10"):
            rows.append((f"3 jobs sliced, quantum {q[1:]} s: aggregate rate", f"{s[q]['rate']:.1f}",
                         f"alone in the same run {s[q]['alone_rate_in_run']:.1f} -> efficiency "
                         f"{s[q]['efficiency']:.3f}; vs separate solo runs {s[q]['vs_separate_solo_runs']:.3f} "
                         f"({s[q]['switches']} switches)" + ("; target >= 0.95" if q == "q10" else "")))
        last.append(f"slicing_efficiency_q10={s['q10']['efficiency']:.3f}")
    if "b" in parts:
        print("(b) boundary hook cost ...", flush=True)
        h = res["hook"] = hook_cost()
        rows += [
            ("hook with nothing pending (us)", f"{h['hook_us']:.2f}",
             f"target < 20; of which Job.boundary {h['boundary_us']:.2f}"),
            ("optimizer step with/without hook (us)",
             f"{h['step_us_with_hook']:.1f} / {h['step_us_without_hook']:.1f}",
             "noisy: the difference is within run-to-run spread"),
        ]
        last.append(f"hook_us={h['hook_us']:.2f}")
    if "c" in parts:
        print("(c) command latency ...", flush=True)
        c = res["command"] = command_latency(cycles)
        bare = c["bare"] = bare_latency(cycles, c["batch_ms"] / 1e3)
        c["p99_vs_bare"] = c["p99_ms"] / bare["p99_ms"]
        rows.append(("suspend request -> job ack p50 / p99 (ms)", f"{c['p50_ms']:.2f} / {c['p99_ms']:.2f}",
                     f"mini-batch {c['batch_ms']:.1f} ms; target p99 < {c['batch_ms'] + 5:.1f}; "
                     f"first suspend {c['first_suspend_ms']:.0f} ms"))
        notes = {"boundary_wait": f"the rest of the mini-batch in progress (up to one; batches vary: "
                                  f"max {c['parts']['boundary_wait']['max_ms']:.1f})",
                 "own": "all but the wait; the target's 5 ms",
                 "job": "the command's way there, the suspend, the result's way back"}
        for k, name in (("boundary_wait", "  of which the wait for the job's boundary"),
                        ("own", "  of which gmux's own (the rest)"), ("job", "    in the job and on the way"),
                        ("gmuxd", "    gmuxd's handling"), ("client_gmuxd", "    client <-> gmuxd")):
            q = c["parts"][k]
            rows.append((f"{name} p50 / p99 (ms)", f"{q['p50_ms']:.2f} / {q['p99_ms']:.2f}", notes.get(k, "")))
        rows.append(("baseline: bare ZeroMQ relay, same job, p50 / p99 (ms)",
                     f"{bare['p50_ms']:.2f} / {bare['p99_ms']:.2f}",
                     f"no gmux code (benchmarks/bare_relay.py); gmux p99 / bare p99 = {c['p99_vs_bare']:.2f}"))
        last.append(f"cmd_p99_ms={c['p99_ms']:.2f}")
    if "d" in parts:
        print("(d) daemon throughput ...", flush=True)
        t = res["throughput"] = throughput()
        rows.append(("gmuxd messages/s (heartbeats, answered)", f"{t['msgs_per_s']:.0f}", "target >= 20000"))
        last.append(f"msgs_per_s={t['msgs_per_s']:.0f}")
    if "e" in parts:
        print("(e) GPU time accounted, one long-step job among short ones ...", flush=True)
        m = res["mixed"] = mixed_accounting(0.5, 10 if a.quick else 20)
        rows.append(("mixed: GPU-seconds of the jobs / GPU wall time", f"{m['fraction']:.3f}",
                     f"against 1.0; quantum {m['quantum']} s, 0.5 s mini-batches among short ones: "
                     f"{m['long_suspends']} suspends in {m['long_steps']} long steps, {m['stops']} stops"))
        last.append(f"accounted_fraction={m['fraction']:.3f}")
    res["machine"]["loadavg_after"] = os.getloadavg()
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    w = max(len(r[0]) for r in rows)
    print(f"\n{'measure':<{w}}  {'value':>16}  note")
    for name, v, note in rows:
        print(f"{name:<{w}}  {v:>16}  {note}")
    print(f"\nload average (1 min) before/after: {res['machine']['loadavg'][0]:.1f} / "
          f"{res['machine']['loadavg_after'][0]:.1f} on {os.cpu_count()} cores")
    print(f"JSON: {a.json}")
    print("multiplex: " + " ".join(last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
