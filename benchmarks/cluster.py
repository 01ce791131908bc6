"""Cluster mode, measured: cross-machine migration against checkpoint size and against the same bytes over a raw
ZeroMQ socket; gmux-scheduler's decision latency with 3 real daemons and with 100 simulated ones.

    .venv/bin/python benchmarks/cluster.py [--sizes 64,256,1024] [--frozen 1024] [--moves 3]
                                           [--out benchmarks/results/cluster.json]

(a) Migration. A real gmux-scheduler and two real gmuxd (virtual GPUs, loopback TCP, CurveZMQ) run one training
    job (demo_train.py, a hidden-to-hidden layer sized so that the checkpoint, weights + grads + momentum, is the target
    size); `c_migrate` moves it to the other daemon and back, three times (--moves; each figure is the median
    of the three: one move's vary by a fifth on this shared 2-core VM). Timed from the request until the target
    has restored it and passed a boundary (what the scheduler waits for before the source releases): suspend at a
    boundary, checkpoint written, streamed (chunked, crc32, CurveZMQ), new process, torch import, restore, first
    step.
    Beside it, in the same run: the checkpoint file's bytes over a plain ZeroMQ DEALER->ROUTER TCP socket
    (2 MiB messages, pipelined, memory to memory), the floor for moving those bytes between two processes, and
    over a CurveZMQ one, the floor for a secured move. Downtime apart: from the job's last boundary at the
    source to its first at the target, as the job logs them (demo_train --boundary-log), so the target's first
    mini-batch is in it; the issue's bound is 1.5x the CurveZMQ floor plus one mini-batch (`downtime_vs_target`
    <= 1 meets it). The total also holds the wait for that last boundary and the report that tells the
    scheduler. Its floor, same run: the target script's own model build (demo_train logs its start and the
    model built; in a warm interpreter, torch is imported already) + the bytes at the plain floor + one
    mini-batch: what no move of this job that builds its target while the source computes on could undercut
    (`total_floor_vs_raw`); with the faster secured floor in place of the plain one, what no such secured move
    could (`total_floor_secured_vs_raw`). Below both, what no secured move at all could undercut, even one
    whose target built its model while the bytes were on their way: the bytes at the secured floor and the
    target's first mini-batch (`secured_bytes_batch_vs_raw`).
(b) Incremental moves: a job 7/8 of whose bytes are a frozen table (demo_train --frozen-mib) moved in the same
    run, its target offering what it already holds (gmux.job.holdings: the frozen table is not sent) and not
    (GMUX_HOLDINGS=off, the whole checkpoint sent); `downtime offered/whole` compares the two.
    The two daemons' CPU time during each move (gmuxd and its cluster link: the sending, the receiving and
    everything else they do meanwhile; the job's processes, which also train, are not in it): a figure the VM's
    load hardly changes, where wall times vary by a fifth or more from run to run. `--bulk` measures each size
    with the bytes sealed beside CurveZMQ (gmux's way, gmux.wire.sealed) and through it (GMUX_BULK=curve), with a
    third floor in the same run: the bytes sealed with AES-GCM over plain ZeroMQ, memory to memory.
(c) Decisions. The time of one scheduling decision (snapshot from SQLite-backed tables, policy, actions) as
    gmux-scheduler measures it, while (a) runs against 3 daemons; and with 100 simulated daemons (CurveZMQ
    DEALERs that report 2 GPUs each and run whatever they are told for a few seconds) and 300 jobs.
Last line: `cluster: migrate_1GiB_vs_raw=<total/plain> downtime_1GiB_vs_curve_raw=<downtime/curve-raw>
decision_ms_p99=<n>` (the p99 with 100 daemons).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import random
import sys
import tempfile
import threading
import time

import zmq

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "cluster_mode"))

from gmux import protocol  # noqa: E402
from gmux.wire import keys  # noqa: E402

C = protocol.CLUSTER_MESSAGES


def raw_zmq_seconds(nbytes: int, chunk: int = 2 << 20, window: int = 8, keydir: str | None = None,
                    sealed: bool = False) -> float:
    """As many bytes over plain ZeroMQ TCP on loopback, pipelined like the real transfer (plain ZeroMQ does not
    look at the bytes, so zeros cost what the checkpoint's would); memory to memory. With `keydir`, over
    CurveZMQ (a daemon's keys, as a real move's link): the floor for a secured move, encryption included. With
    `sealed`, each chunk sealed with AES-256-GCM and opened on arrival over plain ZeroMQ (gmux.wire.sealed,
    without the pipe and the files): the floor for gmux's way of securing a move."""
    from gmux.wire import sealed as seal_mod
    key = seal_mod.new_key() if sealed else None
    data = bytes(chunk if sealed else nbytes)
    n = -(-nbytes // chunk)
    ctx = zmq.Context()
    if keydir is None:
        rx = ctx.socket(zmq.ROUTER)
    else:
        rx = keys.server_socket(ctx, zmq.ROUTER, keydir, "daemon", "rx")
    port = rx.bind_to_random_port("tcp://127.0.0.1")

    def serve():
        opener = seal_mod.Seal(key) if sealed else None
        for _ in range(n):
            ident, *frames = rx.recv_multipart(copy=False)
            if opener is not None:
                opener.open(frames[0].bytes, int.from_bytes(frames[0].bytes, "little"), frames[1].buffer)
            rx.send_multipart([ident.bytes, b"k"])
    t = threading.Thread(target=serve)
    t.start()
    if keydir is None:
        tx = ctx.socket(zmq.DEALER)
    else:   # no ZAP handler: a CurveZMQ server without one admits any client that knows its key
        tx = keys.client_socket(ctx, zmq.DEALER, keydir, "daemon", "tx", keys.load_public(keydir, "daemon", "rx"))
    tx.connect(f"tcp://127.0.0.1:{port}")
    seal = seal_mod.Seal(key) if sealed else None
    view = memoryview(data)
    t0 = time.perf_counter()
    sent, inflight = 0, 0
    while sent < n or inflight:
        while inflight < window and sent < n:
            if seal is not None:
                header = seal.next_nonce().to_bytes(8, "little")
                tx.send_multipart([header, seal.seal(header, data)], copy=False)
            else:
                tx.send(view[sent * chunk:(sent + 1) * chunk], copy=False)
            sent += 1
            inflight += 1
        tx.recv()
        inflight -= 1
    seconds = time.perf_counter() - t0
    t.join()
    tx.close(0)
    rx.close(0)
    ctx.term()
    return seconds


def cpu_seconds(pids: list) -> float:
    """CPU time (user + system) these processes have used so far, all their threads."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                total += sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:13])
        except OSError:
            pass
    return total / tick


def warm_pids(under: pathlib.Path) -> list:
    """The warm interpreters (gmux.cli.warm) of the gmuxd runtime directories under `under` that wait for a
    start: their stdin is still the pool's pipe (one that became a job reads /dev/null)."""
    from gmux_testkit import jobs_under
    pids = []
    for pid, args in jobs_under(under):
        try:
            waiting = os.readlink(f"/proc/{pid}/fd/0").startswith("pipe:")
        except OSError:
            continue
        if "gmux.cli.warm" in args and waiting:
            pids.append(pid)
    return pids


def settle_warm_pools(under: pathlib.Path, timeout: float = 60.0) -> None:
    """Until the warm interpreters under `under` are idle (torch imported, waiting for a start). A pool refills
    once a start is over; moving back and forth, the next move would otherwise stream beside the import on these
    2 cores shared by both "machines", which separate machines of more cores do not see."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = warm_pids(under)
        before = cpu_seconds(pids)
        time.sleep(0.5)
        if cpu_seconds(pids) - before < 0.05:
            return


def _downtimes(log: pathlib.Path) -> tuple:
    """([seconds from the last boundary of each of the job's processes to the first of the next], the median
    mini-batch of its first process, [seconds each moved-to process's script took to build its model]) from
    demo_train's --boundary-log."""
    lines = [line.split() for line in log.read_text().splitlines()]
    lines = [(float(t), int(pid), what) for t, pid, what in (r for r in lines if len(r) == 3)]
    rows = [(t, pid) for t, pid, what in lines if what.isdigit()]
    gaps = [b[0] - a[0] for a, b in zip(rows, rows[1:]) if a[1] != b[1]]
    first = [t for t, pid in rows if pid == rows[0][1]]
    batches = sorted(b - a for a, b in zip(first, first[1:]))
    starts = {pid: t for t, pid, what in lines if what == "start"}
    builds = [t - starts[pid] for t, pid, what in lines if what == "built" and pid in starts and pid != rows[0][1]]
    return gaps, batches[len(batches) // 2], builds


def _median(xs: list) -> float:
    return sorted(xs)[len(xs) // 2]


def hidden_for(size_bytes: int) -> int:
    # --depth 1: params ~ h^2 (one hidden-to-hidden layer); checkpoint ~ 12 bytes/param (weights, grads and
    # momentum in float32)
    return int(math.sqrt(size_bytes / 12))


def migration(tmp: pathlib.Path, size_mib: int, grads: str = "kept", frozen_mib: int = 0,
              holdings: bool = True, moves: int = 3, bulk: str = "sealed", starts: str = "warm") -> dict:
    """`moves` moves of one job, back and forth (the medians reported: one move's figures vary by a fifth on a
    2-core VM shared by two daemons, their links, the scheduler and the job); `frozen_mib` of the `size_mib` are a
    frozen table (demo_train --frozen-mib) that the target builds too, offered to the source unless `holdings` is
    False (GMUX_HOLDINGS=off: the whole is sent)."""
    from cluster_harness import PY, ROOT as R, TRAIN, Cluster, wait_for
    os.environ["GMUX_BULK"] = bulk        # read by the source's link (bulk=curve: every byte through CurveZMQ)
    c = Cluster(tmp, machines=("a", "b"), policy="gandiva", gpus="2x8GiB", sched_args=["--ckpt-every", "0"],
                daemon_args=["--warm-starts", "1" if starts == "warm" else "0"])
    try:
        c.wait_machines(2, 60)
        h = hidden_for((size_mib - frozen_mib) << 20)
        frozen = ["--frozen-mib", str(frozen_mib)] if frozen_mib else []
        # GMUX_GRADS=overwritten: the checkpoint leaves the gradients out (demo_train zeroes them every step)
        log = tmp / "boundaries.log"
        cjob = c.call("c_submit", argv=[PY, TRAIN, str(tmp / "out.json"), "1000000", "--hidden", str(h), "--depth",
                                        "1", "--batch", "8", "--lr", str(min(0.001, 1 / h)), "--attach",
                                        "--boundary-log", str(log), *frozen],
                      cwd=R, env={"OMP_NUM_THREADS": "1", "GMUX_GRADS": grads,
                                  **({} if holdings else {"GMUX_HOLDINGS": "off"})})["cjob"]
        totals, sent, cpus = [], [], []
        for k in range(moves):          # back and forth, each once the job has stepped on at its new place
            j = wait_for(lambda: (lambda j: j["state"] == "running" and j["step"] >= 3 + 3 * k and j)(c.job(cjob)),
                         300, "job running")
            dst = "b" if j["machine"] == "a" else "a"
            if starts == "warm":
                settle_warm_pools(tmp)
            daemons = [d.pid for d in c.daemons.values()]      # each gmuxd with its cluster link's threads
            cpu0, t0 = cpu_seconds(daemons), time.perf_counter()
            c.call("c_migrate", cjob=cjob, machine=dst, gpu=0)
            wait_for(lambda: c.job(cjob)["migrations"] == k + 1, 600, "migration done", every=0.05)
            totals.append(time.perf_counter() - t0)
            cpus.append(cpu_seconds(daemons) - cpu0)
            ps = c.ps()
            sent.append(next(d for d in reversed(ps["decisions"]) if d["kind"] == "migrate_sent")["numbers"])
        total = _median(totals)
        sent = sorted(sent, key=lambda n: n["seconds"])[len(sent) // 2]
        raw = min(raw_zmq_seconds(sent["bytes"]) for _ in range(2))
        kd = str(tmp / "bench-keys")
        for name in ("rx", "tx"):
            keys.create(kd, "daemon", name)
        curve = min(raw_zmq_seconds(sent["bytes"], keydir=kd) for _ in range(2))
        sealed_raw = min(raw_zmq_seconds(sent["bytes"], 1 << 20, 16, sealed=True) for _ in range(2))
        # Downtime: from the job's last boundary at the source to its first at the target, as the job logged
        # them (the target's first mini-batch included); the total is until the scheduler has heard of it.
        downtimes, batch, builds = _downtimes(log)
        downtime = _median(downtimes)
        # What no move of this job can undercut: its target's script builds the model, then the bytes at the
        # plain floor, then its first mini-batch there.
        build = _median(builds)
        floor, secured = build + raw + batch, build + min(sealed_raw, curve) + batch
        bytes_batch = min(sealed_raw, curve) + batch
        dm = ps["decision_ms"]
        return {"size_mib": size_mib, "frozen_mib": frozen_mib, "holdings": holdings, "bytes": sent["bytes"],
                "bulk": bulk, "starts": starts, "sealed_bytes": sent.get("sealed_bytes", 0), "sealed_zmq_s": sealed_raw,
                "cpu_s": _median(cpus), "cpu_s_each": cpus,
                "downtime_vs_sealed_raw": downtime / sealed_raw,
                "moves": moves, "migrate_s": total, "migrate_s_each": totals, "downtime_s": downtime,
                "downtime_s_each": downtimes,
                "batch_s": batch, "downtime_vs_target": downtime / (1.5 * curve + batch),
                "suspend_s": sent["suspend_s"], "checkpoint_s": sent["checkpoint_s"],
                "transfer_s": sent["transfer_s"], "raw_zmq_s": raw, "curve_zmq_s": curve,
                "migrate_vs_raw": total / raw, "transfer_vs_raw": sent["transfer_s"] / raw,
                "build_s": build, "build_s_each": builds, "total_floor_s": floor, "total_floor_vs_raw": floor / raw,
                "total_floor_secured_vs_raw": secured / raw, "secured_bytes_batch_vs_raw": bytes_batch / raw,
                "downtime_vs_curve_raw": downtime / curve,
                "decision_ms_p99_3daemons": dm["p99"], "decisions_3daemons": dm["n"]}
    finally:
        c.close()


class FakeDaemons:
    """N CurveZMQ daemon links in one thread: report 2 GPUs each, run what they are told for `run_s`."""

    def __init__(self, keydir: str, endpoint: str, n: int, run_s: float = 3.0):
        self.ctx = zmq.Context()
        self.socks = {}
        self.jobs: dict[str, dict] = {}
        self.run_s = run_s
        sk = keys.load_public(keydir, "scheduler")
        for i in range(n):
            name = f"sim{i}"
            s = keys.client_socket(self.ctx, zmq.DEALER, keydir, "daemon", name, sk)
            s.setsockopt(zmq.IDENTITY, name.encode())
            s.setsockopt(zmq.LINGER, 0)
            s.connect(endpoint)
            self.socks[name] = s
        self.stop = False
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self):
        poller = zmq.Poller()
        for s in self.socks.values():
            poller.register(s, zmq.POLLIN)
        last = 0.0
        while not self.stop:
            for s, _ in poller.poll(50):
                name = s.getsockopt(zmq.IDENTITY).decode()
                msg = protocol.decode(s.recv(), C)
                if msg.type == "node_action" and msg["action"] == "start":
                    self.jobs[msg["cjob"]] = {"machine": name, "gpu": msg["args"]["gpus"][0], "t0": time.time(),
                                              "local": f"j{len(self.jobs)}"}
            now = time.time()
            if now - last >= 0.5:
                last = now
                for name, s in self.socks.items():
                    recs = []
                    for cj, j in self.jobs.items():
                        if j["machine"] != name:
                            continue
                        done = now - j["t0"] > self.run_s
                        recs.append({"cjob": cj, "local": j["local"], "state": "exited" if done else "running",
                                     "step": int((now - j["t0"]) * 100) + 1, "gpu": j["gpu"], "exit_status": 0,
                                     "gpu_seconds": now - j["t0"], "rate_now": 100.0, "rate_solo": 100.0})
                    s.send(protocol.encode("node_report", 0, table=C, name=name,
                                           gpus=[{"index": 0, "mem_total": 16 << 30},
                                                 {"index": 1, "mem_total": 16 << 30}],
                                           transfer="tcp://127.0.0.1:9", jobs=recs))

    def close(self):
        self.stop = True
        self.t.join()
        for s in self.socks.values():
            s.close(0)
        self.ctx.term()


def decisions_100(tmp: pathlib.Path, jobs: int = 300, policy: str = "gmux") -> dict:
    import subprocess
    from cluster_harness import PY, ROOT as R, env, free_port, wait_for
    from gmux.wire.scheduler_client import ClusterClient
    kd = str(tmp / "keys")
    keys.create(kd, "scheduler")
    keys.create(kd, "client", "bench")
    for i in range(100):
        keys.create(kd, "daemon", f"sim{i}")
    ep = f"tcp://127.0.0.1:{free_port()}"
    log = open(tmp / "sched100.log", "ab")
    sched = subprocess.Popen([PY, "-m", "gmux.cli.scheduler", "--listen", ep, "--keys", kd,
                              "--state", str(tmp / "s100"), "--policy", policy, "--tick", "0.5", "--ckpt-every", "0"],
                             env=env(), stdout=log, stderr=subprocess.STDOUT, cwd=R)
    fake = FakeDaemons(kd, ep, 100)
    try:
        cl = ClusterClient(ep, kd, "bench", timeout=30)
        wait_for(lambda: sum(m["state"] == "up" for m in cl.call("c_ps")["machines"]) == 100, 60, "100 daemons up")
        rnd = random.Random(1)
        for i in range(jobs):
            cl.call("c_submit", argv=["python", f"model{rnd.randrange(6)}.py"], cwd="/")
            if i % 50 == 49:
                time.sleep(0.5)
        wait_for(lambda: all(j["state"] == "done" for j in cl.call("c_ps")["jobs"]), 300, "all simulated jobs done")
        ps = cl.call("c_ps")
        cl.close()
        return {"daemons": 100, "jobs": jobs, "policy": policy, **{f"decision_ms_{k}": v
                                                                     for k, v in ps["decision_ms"].items()}}
    finally:
        fake.close()
        sched.kill()
        sched.wait()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="64,256,1024")
    p.add_argument("--grads", default="kept", choices=["kept", "overwritten"],
                   help="overwritten: the job's checkpoints leave its gradients out (GMUX_GRADS)")
    p.add_argument("--frozen", default="1024",
                   help="sizes (MiB, comma-separated; empty for none) of jobs 7/8 of whose bytes are a frozen table, "
                        "each moved twice: the target offering what it holds, and not (GMUX_HOLDINGS=off)")
    p.add_argument("--moves", type=int, default=3, help="moves per job, back and forth (medians reported)")
    p.add_argument("--bulk", default="sealed,curve",
                   help="how a move's bytes travel, each measured in turn: sealed (AES-GCM beside CurveZMQ, "
                        "gmux's way), curve (through CurveZMQ, GMUX_BULK=curve); the first is the headline")
    p.add_argument("--starts", default="warm,cold",
                   help="how a move's target process starts, each measured in turn: warm (the target machine's "
                        "interpreter with torch imported, gmuxd's default), cold (gmuxd --warm-starts 0: a new "
                        "interpreter); the first is the headline; cold rows are measured with the first --bulk")
    p.add_argument("--no-decisions", action="store_true", help="the migrations only")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cluster.json"))
    a = p.parse_args()
    bulks = a.bulk.split(",")
    if not bulks or any(b not in ("sealed", "curve") for b in bulks):
        p.error(f"--bulk: a comma-separated list of sealed and curve, not {a.bulk!r}")
    starts = a.starts.split(",")
    if not starts or any(x not in ("warm", "cold") for x in starts):
        p.error(f"--starts: a comma-separated list of warm and cold, not {a.starts!r}")
    rows = []
    for size in [int(s) for s in a.sizes.split(",")]:
        ways = [(bulk, starts[0]) for bulk in bulks] + [(bulks[0], x) for x in starts[1:]]
        for bulk, start in ways:
            with tempfile.TemporaryDirectory(prefix=f"gmux-bench-{size}-") as d:
                r = migration(pathlib.Path(d), size, a.grads, moves=a.moves, bulk=bulk, starts=start)
            rows.append(r)
            print(f"migrate {size:5d} MiB ({bulk:6s}, {start}): downtime {r['downtime_s']:.2f} s (mini-batch "
                  f"{r['batch_s']:.2f} s), total {r['migrate_s']:6.2f} s (suspend {r['suspend_s']:.2f}, checkpoint "
                  f"{r['checkpoint_s']:.2f}, transfer {r['transfer_s']:.2f}), daemons' CPU {r['cpu_s']:.2f} s; "
                  f"raw zmq {r['raw_zmq_s']:.3f} s, sealed zmq {r['sealed_zmq_s']:.3f} s, "
                  f"curve zmq {r['curve_zmq_s']:.3f} s  total/raw {r['migrate_vs_raw']:.1f} (floor: the target's "
                  f"model build {r['build_s']:.2f} s + raw + batch = {r['total_floor_vs_raw']:.1f}; secured, with the "
                  f"sealed or Curve floor: {r['total_floor_secured_vs_raw']:.1f}; any secured move, its bytes and "
                  f"batch alone: {r['secured_bytes_batch_vs_raw']:.1f})  downtime/curve "
                  f"{_ratio(r['downtime_vs_curve_raw'])}  downtime/sealed {_ratio(r['downtime_vs_sealed_raw'])}  "
                  f"downtime/(1.5 curve + batch) {r['downtime_vs_target']:.2f}", flush=True)
    incremental = []
    for size in [int(s) for s in a.frozen.split(",") if s]:
        pair = {}
        for offered in (True, False):
            with tempfile.TemporaryDirectory(prefix=f"gmux-bench-frozen-{size}-") as d:
                pair[offered] = migration(pathlib.Path(d), size, a.grads, frozen_mib=size * 7 // 8,
                                          holdings=offered, moves=a.moves, bulk=bulks[0], starts=starts[0])
        held, whole = pair[True], pair[False]
        ratio = held["downtime_s"] / whole["downtime_s"]
        incremental.append({"size_mib": size, "frozen_mib": size * 7 // 8, "offered": held, "whole": whole,
                            "downtime_vs_whole": ratio, "bytes_vs_whole": held["bytes"] / whole["bytes"]})
        print(f"migrate {size:5d} MiB, {size * 7 // 8} MiB frozen: offered: sent {held['bytes'] / 2**20:.1f} MiB, "
              f"downtime {held['downtime_s']:.2f} s, total {held['migrate_s']:.2f} s, daemons' CPU "
              f"{held['cpu_s']:.2f} s; whole: sent {whole['bytes'] / 2**20:.1f} MiB, downtime "
              f"{whole['downtime_s']:.2f} s, total {whole['migrate_s']:.2f} s, daemons' CPU {whole['cpu_s']:.2f} s  "
              f"downtime offered/whole {ratio:.2f}", flush=True)
    if a.no_decisions:
        dec = {"jobs": 0, "policy": "-", "decision_ms_n": 0, "decision_ms_p50": float("nan"),
               "decision_ms_p99": float("nan")}
    else:
        with tempfile.TemporaryDirectory(prefix="gmux-bench-100-") as d:
            dec = decisions_100(pathlib.Path(d))
    print(f"decisions, 100 simulated daemons, {dec['jobs']} jobs ({dec['policy']}): n={dec['decision_ms_n']} "
          f"p50={dec['decision_ms_p50']:.2f} ms p99={dec['decision_ms_p99']:.2f} ms", flush=True)
    p3 = max((r["decision_ms_p99_3daemons"] or 0) for r in rows)
    print(f"decisions, 3 real daemons: p99={p3:.2f} ms (worst over the migration runs)")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"migrations": rows, "incremental": incremental, "decisions_100": dec}, f, indent=1)
    big = next((r for r in rows if r["size_mib"] == 1024 and r["bulk"] == bulks[0] and r["starts"] == starts[0]),
               rows[0])
    print(f"cluster: migrate_1GiB_vs_raw={big['migrate_vs_raw']:.1f} "
          f"downtime_1GiB_vs_curve_raw={_ratio(big['downtime_vs_curve_raw'])} "
          f"decision_ms_p99={dec['decision_ms_p99']:.2f}")
    return 0


def _ratio(r) -> str:
    return f"{r:.1f}" if r is not None else "?"


if __name__ == "__main__":
    sys.exit(main())
