"""The gmuxd side of cluster mode: reports this machine to gmux-scheduler and carries out its actions.

Runs beside the daemon (a thread of `gmuxd --scheduler ADDR`, or `python -m gmux.node.cluster_link`), and
talks to its gmuxd only through the admin socket, like the CLI: the daemon's single-threaded loop is never
entered from another thread. Toward the cluster it holds:
  - a DEALER to the scheduler (CurveZMQ client with this machine's daemon key; routing id = its name), on which
    it sends a full report every REPORT_S and events, and receives node_actions;
  - a ROUTER (CurveZMQ server, same key) where checkpoints arrive from other daemons and from the scheduler.
Cluster jobs run under `gmux-launch --no-hook --name CJOB` (explicit mode: the script attaches and restores
itself, so it can continue in another process on another machine). Slow work (waiting for a job's boundary,
streaming a checkpoint) runs on worker threads; only this loop touches its sockets.
"""
from __future__ import annotations

import argparse
import logging
import os
import queue
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import zmq

from gmux import protocol
from gmux.cluster import keys
from gmux.cluster.transfer import Receiver, send_file
from gmux.node.client import Client, GmuxError
from gmux.node.paths import RuntimeDir

log = logging.getLogger("gmux.cluster_link")
C = protocol.CLUSTER_MESSAGES
REPORT_S = 0.5
CJOB = re.compile(r"^c\d+$")


def _check_start(args: dict) -> Optional[str]:
    """What is wrong with a start's arguments, or None (the scheduler is trusted, but checked: it can have bugs)."""
    for key, check in (("argv", protocol._argv), ("cwd", protocol._str), ("env", protocol._env)):
        p = check(args.get(key))
        if p:
            return f"{key}: {p}"
    if not isinstance(args.get("gpu"), int) or isinstance(args.get("gpu"), bool):
        return "gpu: expected an integer"
    for key in ("restore",):
        if args.get(key) is not None and protocol._name(args[key]):
            return f"{key}: {protocol._name(args[key])}"
    for key in ("ckpt_every", "weight"):
        if args.get(key) is not None and protocol._pos_float(args[key]):
            return f"{key}: {protocol._pos_float(args[key])}"
    if args.get("mem") is not None and protocol._nonneg_int(args["mem"]):
        return "mem: expected a non-negative integer"
    return None


class ClusterLink:
    def __init__(self, runtime_dir: str, name: str, scheduler: str, keydir: str, listen: str = "tcp://127.0.0.1:0"):
        self.rundir = RuntimeDir(runtime_dir)
        self.name = name
        self.keydir = keydir
        self.scheduler_endpoint = scheduler
        self.ctx = zmq.Context()        # its own context: the ZAP handler must not see gmuxd's ipc socket
        self.guard = keys.Guard(self.ctx, keydir, ("scheduler", "daemon"))
        self.inbox = keys.server_socket(self.ctx, zmq.ROUTER, keydir, "daemon", name)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.inbox.setsockopt(zmq.MAXMSGSIZE, protocol.XFER_MAX_CHUNK + protocol.MAX_FRAME)
        self.inbox.bind(listen)
        self.transfer_endpoint = self.inbox.getsockopt_string(zmq.LAST_ENDPOINT)
        self.receiver = Receiver(os.path.join(self.rundir.root, "cluster-in"))
        self.up = keys.client_socket(self.ctx, zmq.DEALER, keydir, "daemon", name, keys.load_public(keydir, "scheduler"))
        self.up.setsockopt(zmq.IDENTITY, name.encode())
        self.up.setsockopt(zmq.LINGER, 0)
        self.up.setsockopt(zmq.SNDHWM, 100)
        self.up.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        self.up.connect(scheduler)
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="cluster-link")
        self.outbox: "queue.SimpleQueue" = queue.SimpleQueue()   # (event, cjob, detail, data) from workers
        self.children: dict[int, subprocess.Popen] = {}
        self.busy: set[str] = set()            # cjobs with a worker on them (no periodic checkpoint meanwhile)
        self.starting: dict[str, float] = {}   # cjob -> when started here, until it is seen past a boundary
        self.ckpt_every: dict[str, float] = {}
        self.spawned: dict[str, int] = {}      # cjob -> pid of the process started for it last
        self.last_ckpt: dict[str, float] = {}
        self.ckpt_seq = 0
        self.stopping = False
        self.bad_actions = 0
        self._last_report = 0.0
        self._jobs: dict[str, dict] = {}       # cjob -> its latest local record

    # --- plumbing ---
    def admin(self, mtype: str, timeout: float = 130.0, **fields):
        c = Client(self.rundir.root, timeout=timeout)   # one per call and thread: zmq sockets are not shared
        try:
            return c.call(mtype, timeout=timeout, **fields)
        finally:
            c.close()

    def _event(self, event: str, cjob: str, detail: str = "", **data) -> None:
        self.outbox.put((event, cjob, detail, data))

    def serve(self, until=None) -> None:
        poller = zmq.Poller()
        poller.register(self.up, zmq.POLLIN)
        poller.register(self.inbox, zmq.POLLIN)
        try:
            while not self.stopping and not (until and until()):
                for sock, _ in poller.poll(100):
                    for _ in range(200):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        (self._from_scheduler if sock is self.up else self._inbox)(frames)
                while True:
                    try:
                        event, cjob, detail, data = self.outbox.get_nowait()
                    except queue.Empty:
                        break
                    self._send_up("node_event", name=self.name, cjob=cjob, event=event, detail=detail[:2000],
                                  data=data)
                now = time.monotonic()
                if now - self._last_report >= REPORT_S:
                    self._last_report = now
                    self._report(now)
        finally:
            self.close()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.up.close(0)
        self.inbox.close(0)
        self.guard.stop()
        self.receiver.close()
        self.ctx.term()

    def _send_up(self, mtype: str, **fields) -> None:
        try:
            self.up.send(protocol.encode(mtype, 0, table=C, **fields), zmq.NOBLOCK)
        except zmq.Again:
            pass     # scheduler away: the next report carries the whole state again

    # --- checkpoints arriving ---
    def _inbox(self, frames: list) -> None:
        ident, body = frames[0], frames[1:]
        mid = 0
        try:
            if not 1 <= len(body) <= 2:
                raise protocol.ProtocolError("expected one message frame (two for a checkpoint chunk)")
            msg = protocol.decode(body[0], C)
            mid = msg.id
            if not msg.type.startswith("xfer_"):
                raise protocol.ProtocolError(f"{msg.type} is not accepted on a transfer endpoint")
            ok, out = self.receiver.handle(msg, body[1] if len(body) == 2 else None)
        except protocol.ProtocolError as e:
            ok, out = False, str(e)[:1000]
        reply = protocol.reply(mid, True, data=out) if ok else protocol.error_reply(mid, out)
        try:
            self.inbox.send_multipart([ident, reply], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    # --- the report ---
    def _report(self, now: float) -> None:
        for pid, p in list(self.children.items()):
            if p.poll() is not None:
                del self.children[pid]   # reaped: gmuxd reads how it ended from the exit record
        try:
            ps = self.admin("ps", timeout=5.0, all=True)
        except GmuxError as e:
            log.warning("gmuxd not answering: %s", e)
            return
        # One record per cluster job: the process this link started last for it (an older incarnation, e.g.
        # the released copy of a job that has since come back, must not speak for it); after a restart of
        # the link, the newest local job of that name.
        latest: dict[str, dict] = {}
        for j in ps["jobs"]:
            cjob = j.get("name") or ""
            if not CJOB.match(cjob):
                continue
            pid = self.spawned.get(cjob)
            if pid is not None:
                if j.get("pid") == pid:
                    latest[cjob] = j
            elif cjob not in latest or _num(j["id"]) > _num(latest[cjob]["id"]):
                latest[cjob] = j
        records = []
        for cjob, j in latest.items():
            rec = {"cjob": cjob, "local": j["id"], "state": j["state"], "step": int(j.get("step") or 0),
                   "gpu": j.get("gpu"), "rate_now": _f(j.get("rate_now")), "rate_solo": _f(j.get("rate_solo")),
                   "mem_peak": j.get("mem_peak") if isinstance(j.get("mem_peak"), int) else None,
                   "gpu_seconds": float(j.get("gpu_seconds") or 0.0),
                   "exit_status": j.get("exit_status"), "detail": str(j.get("detail") or "")[:500],
                   "held": bool(j.get("held", False))}
            records.append(rec)
            self._jobs[cjob] = rec
            if cjob in self.starting and rec["state"] in ("running", "suspended") and rec["step"] > 0:
                del self.starting[cjob]
                self._event("started", cjob, step=rec["step"], local=rec["local"])
            elif cjob in self.starting and rec["state"] in protocol.FINAL_STATES:
                del self.starting[cjob]     # a job that finished before it was seen running needs no event
                if not (rec["state"] == "exited" and rec["exit_status"] == 0):
                    self._event("start_failed", cjob, f"{rec['state']}: {rec['detail']}")
            self._maybe_checkpoint(cjob, rec, now)
        gpus = [{"index": g["index"], "mem_total": int(g["mem_total"])} for g in ps["gpus"]]
        self._send_up("node_report", name=self.name, gpus=gpus, transfer=self.transfer_endpoint, jobs=records)

    def _maybe_checkpoint(self, cjob: str, rec: dict, now: float) -> None:
        every = self.ckpt_every.get(cjob)
        if (not every or cjob in self.busy or rec["state"] not in ("running", "suspended") or rec["step"] == 0
                or now - self.last_ckpt.get(cjob, 0.0) < every):
            return
        self.last_ckpt[cjob] = now
        self.ckpt_seq += 1
        xfer = f"{self.name}-{cjob}-k{self.ckpt_seq}"
        self._work(cjob, self._checkpoint_to_scheduler, cjob, rec["local"], xfer)

    def _work(self, cjob: str, fn, *args) -> None:
        self.busy.add(cjob)

        def run():
            try:
                fn(*args)
            except Exception as e:
                log.exception("%s failed", fn.__name__)
                self._event("action_failed", cjob, f"{fn.__name__}: {e}")
            finally:
                self.busy.discard(cjob)
        self.pool.submit(run)

    # --- actions from the scheduler ---
    def _from_scheduler(self, frames: list) -> None:
        try:
            if len(frames) != 1:
                raise protocol.ProtocolError("expected one frame")
            msg = protocol.decode(frames[0], C)
            if msg.type == "reply":
                if not msg.get("ok"):
                    log.warning("scheduler refused: %s", msg.get("error"))
                return
            if msg.type != "node_action":
                raise protocol.ProtocolError(f"{msg.type} is not sent by a scheduler")
        except protocol.ProtocolError as e:
            self.bad_actions += 1
            log.warning("bad message from the scheduler: %s", e)
            return
        action, cjob, args = msg["action"], msg["cjob"], msg["args"]
        local = (self._jobs.get(cjob) or {}).get("local")
        if action == "start":
            problem = _check_start(args)
            if problem:
                self._event("start_failed", cjob, f"bad start arguments: {problem}")
            elif not self._live(cjob):
                self._start(cjob, args)
            return
        if local is None:
            self._event("action_failed", cjob, f"{action}: {cjob} does not run on {self.name}")
            return
        if action == "suspend":
            self._work(cjob, self._simple, cjob, "suspend", "suspended", local)
        elif action == "resume":
            self._work(cjob, self._resume, cjob, local, args.get("gpu"))
        elif action == "kill":
            target = args.get("local") if isinstance(args.get("local"), str) else local
            self._work(cjob, self._simple, cjob, "kill", None, target)
        elif action == "release":
            self._work(cjob, self._simple, cjob, "kill", "released", local)
        elif action == "move":
            if isinstance(args.get("gpu"), int):
                self._work(cjob, self._move, cjob, local, args["gpu"])
        elif action == "migrate_out":
            ok = all(isinstance(args.get(k), str) for k in ("target", "endpoint", "xfer"))
            if not ok or protocol._tcp_endpoint(args["endpoint"]) or protocol._name(args["xfer"]) \
                    or protocol._name(args["target"]):
                self._event("migrate_failed", cjob, "bad migrate_out arguments")
                return
            self.busy.add(cjob)   # no periodic checkpoint may start now
            self._work(cjob, self._migrate_out, cjob, local, args["target"], args["endpoint"], args["xfer"])

    def _live(self, cjob: str) -> bool:
        rec = self._jobs.get(cjob)
        return cjob in self.starting or (rec is not None and rec["state"] not in protocol.FINAL_STATES
                                         and rec["state"] != "migrating")

    def _start(self, cjob: str, a: dict) -> None:
        cmd = [sys.executable, "-m", "gmux.cli.launch", "--runtime-dir", self.rundir.root, "--no-hook",
               "--name", cjob, "--gpu", str(a["gpu"]), "--weight", repr(float(a.get("weight") or 1.0))]
        if a.get("mem") is not None:
            cmd += ["--mem", str(a["mem"])]
        if a.get("restore"):
            path = self.receiver.path(a["restore"])
            if not os.path.exists(path):
                self._event("start_failed", cjob, f"no received checkpoint {a['restore']!r} on {self.name}")
                return
            cmd += ["--restore", path]
        env = {**os.environ, **a.get("env", {})}
        env.pop("GMUX_JOB_TOKEN", None)
        os.makedirs(self.rundir.logs(), exist_ok=True)
        try:
            with open(os.path.join(self.rundir.logs(), f"{cjob}.cluster.log"), "ab") as out:
                p = subprocess.Popen(cmd + ["--", *a["argv"]], cwd=a["cwd"] or None, env=env, stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            self._event("start_failed", cjob, f"could not start: {e}")
            return
        self.children[p.pid] = p
        self.spawned[cjob] = p.pid      # gmux-launch registers its own pid: this names the new incarnation
        self._jobs.pop(cjob, None)
        self.starting[cjob] = time.monotonic()
        if a.get("ckpt_every"):
            self.ckpt_every[cjob] = float(a["ckpt_every"])
            self.last_ckpt[cjob] = time.monotonic()
        log.info("started %s (pid %d)%s", cjob, p.pid, " restoring" if a.get("restore") else "")

    def _simple(self, cjob: str, mtype: str, event: Optional[str], local: str) -> None:
        try:
            self.admin(mtype, job=local)
        except GmuxError as e:
            self._event("action_failed", cjob, f"{mtype}: {e}")
            return
        if event:
            self._event(event, cjob)

    def _resume(self, cjob: str, local: str, gpu) -> None:
        rec = self._jobs.get(cjob) or {}
        try:
            if isinstance(gpu, int) and rec.get("gpu") is not None and gpu != rec.get("gpu"):
                self.admin("migrate", job=local, gpu=gpu)
            self.admin("resume", job=local)
        except GmuxError as e:
            self._event("action_failed", cjob, f"resume: {e}")
            return
        self._event("resumed", cjob)

    def _move(self, cjob: str, local: str, gpu: int) -> None:
        try:
            self.admin("migrate", job=local, gpu=gpu)
        except GmuxError as e:
            self._event("action_failed", cjob, f"move: {e}")
            return
        self._event("moved", cjob, gpu=gpu)

    def _checkpoint(self, local: str) -> tuple[str, dict]:
        """Has gmuxd get the job's state written at a boundary; (file, figures incl. the step it was taken at)."""
        data = dict(self.admin("checkpoint", job=local) or {})
        try:
            ps = self.admin("ps", timeout=5.0, all=True)
            data["step"] = next(int(j.get("step") or 0) for j in ps["jobs"] if j["id"] == local)
        except (GmuxError, StopIteration):
            pass
        return self.rundir.checkpoint_file(local + ".snapshot"), data

    def _checkpoint_to_scheduler(self, cjob: str, local: str, xfer: str) -> None:
        path, data = self._checkpoint(local)
        r = send_file(path, self.scheduler_endpoint, keys.load_public(self.keydir, "scheduler"), self.keydir,
                      "daemon", self.name, xfer, context=self.ctx)
        self._event("checkpointed", cjob, xfer=xfer, step=int(data.get("step") or 0), bytes=r["bytes"],
                    seconds=r["seconds"])

    def _migrate_out(self, cjob: str, local: str, target: str, endpoint: str, xfer: str) -> None:
        t0 = time.perf_counter()
        try:
            self.admin("suspend", job=local)              # at its next boundary; held there
            t_susp = time.perf_counter() - t0
            path, data = self._checkpoint(local)           # from the suspended state's host copy
            t_ckpt = time.perf_counter() - t0 - t_susp
            r = send_file(path, endpoint, keys.load_public(self.keydir, "daemon", target), self.keydir, "daemon",
                          self.name, xfer, context=self.ctx)
        except Exception as e:
            try:
                self.admin("resume", job=local)            # the move failed: the job runs on here
            except GmuxError:
                pass
            self._event("migrate_failed", cjob, f"{type(e).__name__}: {e}")
            return
        self._event("migrate_sent", cjob, xfer=xfer, bytes=r["bytes"], seconds=time.perf_counter() - t0,
                    suspend_s=t_susp, checkpoint_s=t_ckpt, transfer_s=r["seconds"], step=int(data.get("step") or 0))


def _num(job_id: str) -> int:
    digits = "".join(c for c in job_id if c.isdigit())
    return int(digits) if digits else 0


def _f(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def start_thread(link: ClusterLink) -> threading.Thread:
    t = threading.Thread(target=link.serve, name="cluster-link", daemon=True)
    t.start()
    return t


def main(argv=None) -> int:
    """python -m gmux.node.cluster_link: the link as its own process beside an already running gmuxd."""
    p = argparse.ArgumentParser(prog="gmux-cluster-link")
    p.add_argument("--runtime-dir", required=True)
    p.add_argument("--name", required=True, help="this machine's name: its key is daemon.NAME in --keys")
    p.add_argument("--scheduler", required=True, help="tcp://HOST:PORT of gmux-scheduler")
    p.add_argument("--keys", required=True, help="the cluster's key directory")
    p.add_argument("--listen", default="tcp://127.0.0.1:0", help="where checkpoints arrive from other machines")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s cluster-link %(levelname)s %(message)s")
    ClusterLink(a.runtime_dir, a.name, a.scheduler, a.keys, a.listen).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
