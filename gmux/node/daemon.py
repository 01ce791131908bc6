"""gmuxd: the per-machine multiplexer. One thread, one ROUTER socket, one loop.

Every frame received is decoded and validated (gmux.protocol) before use; a bad one gets an error reply and
the loop goes on. Jobs authenticate with their token and can act only on themselves; the CLI with the admin
token in the private runtime directory. Between messages the loop ticks: it reaps ended jobs, gives queued
jobs their GPUs (gmux.node.admission: multi-GPU jobs and gangs, defragmentation), lets each GPU's packer and
time-slicer decide, and sends the resulting commands. Job table and decisions live in
SQLite, so a restarted daemon re-attaches to the jobs that kept running.
"""
from __future__ import annotations

import contextlib
import hmac
import itertools
import logging
import os
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import zmq

from gmux import protocol
from gmux.node.admission import Admission, Refused
from gmux.node.inventory import Gpu
from gmux.util.sizes import format_size
from gmux.node.jobs import Job
from gmux.node.packer import Packer, Rates
from gmux.rundir import RuntimeDir, alive, proc_starttime
from gmux.node.slicer import Slicer
from gmux.node.store import Store
from gmux.node.supervisor import Supervisor
from gmux.util.rendezvous import free_port, rendezvous_env

log = logging.getLogger("gmux.daemon")

TICK_S = 0.02           # how often policies run when no message arrives
REAP_EVERY_S = 0.2      # how often ended processes are looked for
FLUSH_EVERY_S = 2.0     # how often measurements are written to SQLite
SOLO_MIN_SPAN_S = 1.5   # a solo rate needs at least this much measured residency


@dataclass
class Waiter:
    """A request whose reply waits for jobs to acknowledge (a gang's suspend waits for every rank)."""
    identity: bytes
    msg_id: int
    kind: str
    t0: float
    job: str                  # the job the request named
    jobs: tuple               # every job acknowledging
    left: set = field(default_factory=set)
    done: bool = False


@dataclass
class Options:
    quantum: float = 60.0
    host_budget: int = 8 << 30        # host RAM for suspended state; beyond it, state spills to disk
    pack: bool = True
    margin: float = 0.1
    window: float = 5.0
    retry_after: float = 300.0
    recheck: float = 1800.0           # a kept pack is measured again this often (seconds together)
    metrics_port: Optional[int] = None


class Daemon(Admission):
    def __init__(self, rundir: RuntimeDir, gpus: list[Gpu], options: Optional[Options] = None):
        self.rundir = rundir
        self.gpus = {g.index: g for g in gpus}
        self.opt = options or Options()
        rundir.create()
        self._claim_pid_file()
        self.admin = rundir.admin_token(create=True)
        self.store = Store(rundir.db)
        self.sup = Supervisor(rundir)
        self.jobs: dict[str, Job] = {}
        self.slicers = {g.index: Slicer(g.index, g.mem_total, self.opt.quantum) for g in gpus}
        self.packers = {g.index: Packer(self.opt.margin, self.opt.window, self.opt.retry_after, self.opt.pack,
                                        recheck=self.opt.recheck) for g in gpus}
        self.queue: list[str] = []            # admitted jobs without a GPU yet, in arrival order
        self.reserved: dict[int, str] = {}    # GPU -> the waiting multi-GPU job or gang it is being freed for
        self.defrag: Optional[dict] = None    # the defragmentation under way: unit, GPUs, moves, started at
        self._plan_at: dict[str, float] = {}  # unit -> when a defragmentation may next be planned for it
        self._wait_why: dict[str, str] = {}   # unit -> why it waits (logged when it changes)
        # Command ids are unique across restarts (a late answer to the previous daemon's command is ignored).
        self._cmd_ids = itertools.count(int(time.time() * 1000) % (1 << 40) * 1000)
        self.inflight: dict[int, tuple[str, str, float]] = {}   # cmd -> (job, kind, sent at)
        self.waiters: dict[str, list[Waiter]] = {}              # job -> requests waiting on its acknowledgement
        self.decisions: deque = deque(maxlen=200)
        self.started = time.time()
        self.messages = 0
        self.received_at = time.monotonic()
        self.internal_errors = 0
        self.stopping = False
        self._last_reap = self._last_flush = 0.0
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)   # an unroutable send raises instead of vanishing
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, 16 * protocol.MAX_FRAME)  # beyond this, not even an error reply
        if os.path.exists(rundir.socket):
            os.unlink(rundir.socket)   # stale: the pid file proved no daemon owns it
        self.sock.bind(rundir.endpoint)
        os.chmod(rundir.socket, 0o600)
        self.metrics = None
        if self.opt.metrics_port is not None:
            from gmux.node.metrics import Metrics
            self.metrics = Metrics(self, self.opt.metrics_port)
        self._recover()

    # --- lifecycle ---
    def _claim_pid_file(self) -> None:
        try:
            with open(self.rundir.pid_file) as f:
                pid, st = (int(x) for x in f.read().split())
            if pid != os.getpid() and alive(pid, st):
                raise RuntimeError(f"gmuxd is already running in {self.rundir.root} (pid {pid}); "
                                   f"stop it first or use another --runtime-dir")
        except (FileNotFoundError, ValueError):
            pass
        with open(self.rundir.pid_file, "w") as f:
            f.write(f"{os.getpid()} {proc_starttime(os.getpid())}")

    def _recover(self) -> None:
        """Re-attaches to the jobs of a previous daemon: alive ones go back on their GPU, ended ones are closed."""
        now = time.monotonic()
        for job in self.store.load(only_live=True):
            self.jobs[job.id] = job
            ended = self.sup.ended(job) if job.pid else ("lost", None, "never started")
            if ended is not None:
                self._finish(job, *ended)
                continue
            job.registered = True   # alive: registered, or about to (re-registering is the same)
            if job.state == "migrating":
                continue   # its process re-registers after re-executing
            if job.parked_gpus and job.held:
                job.gpu = None
                continue   # suspended, its GPUs given back: it waits for `gmux resume`
            if job.gpu is None or (job.exclusive and not job.exclusive_gpus):
                job.gpu = None
                self.queue.append(job.id)
                continue
            gpu = job.gpu if job.gpu in self.slicers else 0
            job.gpu = gpu
            resident = job.state in ("running", "suspending", "resuming")
            self.slicers[gpu].add(job.id, job.weight, job.working_set(), now, resident=resident,
                                  used=job.gpu_seconds, confirm=True)
            if job.held:
                self.slicers[gpu].hold(job.id)
            self._decide(gpu, "reattach", [job.id], {"state": job.state, "pid": job.pid},
                         f"re-attached {job.id} (pid {job.pid}, {job.state}) after a daemon restart")

    def close(self) -> None:
        self._flush(force=True)
        if self.metrics:
            self.metrics.close()
        self.sock.close(0)
        for path in (self.rundir.socket, self.rundir.pid_file):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.store.close()

    def serve(self, until=None) -> None:
        """Runs until shutdown (message or `stopping`), or until `until()` returns true."""
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        try:
            while not self.stopping and not (until and until()):
                if poller.poll(TICK_S * 1000):
                    for _ in range(1000):
                        try:
                            identity, *frames = self.sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._receive(identity, frames)
                self.tick()
        finally:
            self.close()

    # --- messages ---
    def _receive(self, identity: bytes, frames: list) -> None:
        self.messages += 1
        self.received_at = time.monotonic()   # a deferred reply's latency counts from here
        if len(frames) != 1:
            self._send(identity, protocol.error_reply(0, f"expected one frame per message, got {len(frames)}"))
            return
        try:
            msg = protocol.decode(frames[0])
        except protocol.ProtocolError as e:
            self._send(identity, protocol.error_reply(0, str(e)))
            return
        handler = getattr(self, "_on_" + msg.type, None)
        if handler is None:    # reply/command: types gmuxd sends, never receives
            self._send(identity, protocol.error_reply(msg.id, f"{msg.type} is sent by gmuxd, not to it"))
            return
        try:
            data = handler(msg, identity)
        except Refused as e:
            self._send(identity, protocol.error_reply(msg.id, str(e)))
            return
        except Exception as e:  # a bug of ours must cost one request, never the daemon (counted: tests assert 0)
            self.internal_errors += 1
            log.exception("internal error handling %s", msg.type)
            self._send(identity, protocol.error_reply(msg.id, f"gmuxd internal error on {msg.type}: {e!r}"))
            return
        if data is not DEFERRED:
            self._send(identity, protocol.reply(msg.id, True, data=data))

    def _send(self, identity: bytes, frame: bytes) -> bool:
        try:
            self.sock.send_multipart([identity, frame], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:   # peer gone (EHOSTUNREACH) or not reading (EAGAIN): never wedge the loop
            return False

    def _job(self, msg: protocol.Message, identity: bytes) -> Job:
        job = self.jobs.get(msg["job"])
        if job is None or not hmac.compare_digest(job.token, msg["token"]):
            raise Refused(f"{msg.type}: unknown job {msg['job']!r} or wrong token (a job can only act on itself)")
        if job.identity != identity:
            job.identity = identity
            for frame in job.outbox:
                self._send(identity, frame)
            job.outbox.clear()
        return job

    def _admin(self, msg: protocol.Message) -> None:
        if not hmac.compare_digest(self.admin, msg["admin"]):
            raise Refused(f"{msg.type}: wrong admin token (read it from {self.rundir.admin_token_file})")

    def _on_ping(self, msg, identity):
        return {"version": protocol.VERSION, "pid": os.getpid(), "uptime": time.time() - self.started,
                "gpus": len(self.gpus)}

    def _on_register(self, msg, identity):
        now = time.monotonic()
        if msg["pid"] <= 1 or msg["pid"] == os.getpid():
            raise Refused(f"register: pid {msg['pid']} cannot be a job")
        if msg.get("job"):
            job = self.jobs.get(msg["job"])
            if job is None or not msg.get("token") or not hmac.compare_digest(job.token, msg["token"]):
                raise Refused(f"register: unknown job {msg['job']!r} or wrong token")
            if job.final:
                raise Refused(f"register: job {job.id} has ended ({job.state}: {job.detail})")
            # A migrated (or spilled) job's process, back from re-executing itself. Its migrate result may
            # still be on the way (another connection): the migration is complete either way, and is counted
            # here (its result, arriving later, finds no command in flight and is ignored).
            for cmd in [c for c, e in self.inflight.items() if e[0] == job.id]:
                if self.inflight.pop(cmd)[1] == "migrate":
                    job.migrations += 1
            self._leave_gpu(job, now)
            self._wake(job.id, "migrate", True, 0.0)
            job.outbox.clear()
            job.gpu = job.target_gpu if job.target_gpu is not None else job.gpu
            job.target_gpu = None
        else:
            job = Job(self.store.next_job_id(), secrets.token_hex(16), msg.get("name") or "",
                      list(msg["argv"]), msg.get("cwd", ""), weight=float(msg.get("weight", 1.0)), mem=msg.get("mem"))
            job.gpus_wanted, job.gang, job.pinned = msg.get("gpus", 1), msg.get("gang"), msg.get("gpu")
            self._admit(job, "register")
            self.jobs[job.id] = job
        job.pid, job.starttime = msg["pid"], msg.get("starttime")
        job.migratable = bool(msg.get("migratable", False))
        job.identity = identity
        job.registered = True
        job.state, job.started, job.detail = "waiting", False, ""
        job._step_offset = None   # a new process counts boundaries from 0
        job.host_bytes = 0        # a new process holds no suspended state
        job.start_window()
        if job.gpu is None:
            self._enqueue(job)
        else:
            self.slicers[job.gpu].add(job.id, job.weight, job.working_set(), now, used=job.gpu_seconds)
            if job.held:
                self.slicers[job.gpu].hold(job.id)
        self.store.save(job)
        log.info("admitted %s on GPU %s (weight %g, mem %s)", job.id, job.gpu, job.weight,
                 format_size(job.working_set()))
        return {"job": job.id, "token": job.token, "gpu": job.gpu,
                "env": self._env(job) if job.gpu is not None else {}}

    def _on_report(self, msg, identity):
        job = self._job(msg, identity)
        r = msg["report"]
        job.last_report = r
        if isinstance(r.get("step"), int):
            job.step = r["step"]
            job.count(msg.get("boundaries"), r["step"])
        for key in ("mem_boundary", "mem_peak"):
            if isinstance(r.get(key), int):
                setattr(job, key, r[key])
        self._observe_state(job, msg.get("state"))
        slicer = self.slicers.get(job.gpu)
        if slicer is not None and job.id in slicer.resident and job.id not in slicer.pending:
            if slicer.entries.get(job.id) and slicer.entries[job.id].mem != job.working_set():
                for pack in slicer.set_mem(job.id, job.working_set()):
                    self._decide(job.gpu, "unpack", sorted(pack), {"mem": job.working_set()},
                                 f"GPU {job.gpu}: {'+'.join(sorted(pack))} no longer fit in memory: unpacked")
        return None

    def _on_heartbeat(self, msg, identity):
        job = self._job(msg, identity)
        job.count(msg.get("boundaries"))
        self._observe_state(job, msg["state"])
        slicer = self.slicers.get(job.gpu)
        if (msg.get("boundaries") is not None and msg.get("t") is not None and slicer is not None
                and job.id in slicer.resident and job.id not in slicer.pending):
            job.sample(float(msg["t"]), msg["boundaries"])
            # A solo rate is a rate measured while nothing else held the GPU.
            if slicer.resident == {job.id} and job.window_span() >= min(SOLO_MIN_SPAN_S, 0.6 * slicer.quantum):
                job.solo_measured(job.window_rate())
        return None

    def _observe_state(self, job: Job, state: Optional[str]) -> None:
        if state and job.gpu in self.slicers:
            self.slicers[job.gpu].observed(job.id, state, time.monotonic())

    def _on_result(self, msg, identity):
        job = self._job(msg, identity)
        job.count(msg.get("boundaries"))
        entry = self.inflight.pop(msg["cmd"], None)
        if entry is None or entry[0] != job.id:
            return None     # an answer to a command of a previous daemon, or a repeat: nothing waits for it
        _, kind, sent = entry
        now = time.monotonic()
        result = msg["result"]
        ok = bool(result.get("ok"))
        if kind == "suspend" and not ok and msg.get("state") == "suspended":
            ok = True   # it was suspended already (our belief was stale, e.g. after a restart): same outcome
        latency = now - sent
        taken = msg.get("taken_at")
        # (stamped as the job's boundary began: a command arriving during that boundary's poll waited 0)
        waited = max(0.0, taken - sent) if taken is not None and taken <= now else None
        # The requester hears first; the bookkeeping below cannot change the outcome, and this loop is
        # single-threaded, so nothing can observe the order.
        self._wake(job.id, kind, ok, latency, result.get("error"), waited)
        slicer = self.slicers.get(job.gpu)
        if not ok:
            log.warning("%s: %s failed: %s", job.id, kind, result.get("error"))
            job.detail = f"{kind} failed: {result.get('error')}"
        if kind in ("suspend", "resume") and slicer is not None:
            slicer.acked(job.id, kind, now, ok)
            if ok:
                job.suspend_seconds += latency
                if kind == "suspend":
                    job.suspends += 1
                    job.host_bytes = int(result.get("bytes") or 0)
                else:
                    job.started, job.host_bytes = True, 0
                    job.start_window()
        elif kind == "spill":
            if slicer is not None:
                slicer.pending.pop(job.id, None)
            if ok:
                job.host_bytes = 0
            else:
                job.spill_refused = True    # e.g. the allocator tier: asking again would fail again
        elif kind == "migrate":
            if slicer is not None:
                slicer.pending.pop(job.id, None)
            if ok:
                self._leave_gpu(job, now)
                job.state, job.migrations, job.host_bytes = "migrating", job.migrations + 1, 0
                self.store.save(job)
        return None

    def _on_bye(self, msg, identity):
        job = self._job(msg, identity)
        state = "exited" if msg["status"] == 0 else "failed"
        detail = msg.get("reason") or ("finished" if state == "exited" else f"exit status {msg['status']}")
        self._finish(job, state, msg["status"], detail)
        return None

    # --- administration ---
    def _on_ps(self, msg, identity):
        self._admin(msg)
        now = time.monotonic()
        self._sync_accounting(now)
        jobs = [j.public() for j in self.jobs.values() if msg.get("all", True) or not j.final]
        for j in jobs:   # the slicer's weighted GPU time (stride scheduling keeps these within a quantum)
            entry = self.slicers[j["gpu"]].entries.get(j["id"]) if j["gpu"] in self.slicers else None
            j["vtime"] = entry.vtime(now) if entry else None
        gpus = []
        owner = {g: j.id for j in self.jobs.values() if not j.final for g in j.exclusive_gpus}
        for g in self.gpus.values():
            s = self.slicers[g.index]
            gpus.append({"index": g.index, "name": g.name, "virtual": g.virtual, "mem_total": g.mem_total,
                         "mem_used": g.mem_used,
                         "jobs": sorted(set(s.entries) | ({owner[g.index]} if g.index in owner else set())), "resident": sorted(s.resident),
                         "packs": [sorted(p) for p in s.packs], "switches": s.switches,
                         "owner": owner.get(g.index), "reserved": self.reserved.get(g.index),
                         "resident_mem": sum(self.jobs[j].working_set() or 0 for j in s.resident)})
        return {"jobs": jobs, "gpus": gpus, "decisions": list(self.decisions)[-20:],
                "daemon": {"pid": os.getpid(), "uptime": time.time() - self.started, "messages": self.messages,
                           "quantum": self.opt.quantum, "host_budget": self.opt.host_budget,
                           "host_held": sum(j.host_bytes for j in self.jobs.values() if not j.final)}}

    def _target(self, msg) -> Job:
        self._admin(msg)
        job = self.jobs.get(msg["job"])
        if job is None:
            raise Refused(f"{msg.type}: no job {msg['job']!r}; `gmux ps` lists the jobs")
        if job.final:
            raise Refused(f"{msg.type}: job {job.id} has ended ({job.state}: {job.detail})")
        return job

    def _on_suspend(self, msg, identity):
        job = self._target(msg)
        unit = self._unit_of(job)   # a gang's ranks suspend together (at one boundary: gmux.job.gang)
        hooked = [m.id for m in unit if job.gang and m.registered and not m.migratable]
        if hooked:
            # Each rank would stop at its own optimizer step while its peers wait in the next collective.
            raise Refused(f"suspend: gang {job.gang['id']} has ranks in transparent mode ({', '.join(hooked)}), "
                          f"which cannot agree on a boundary to stop at; run the ranks with --no-hook and "
                          f"gmux.job.gang.GangController to make the gang suspendable")
        busy = []
        for m in unit:
            m.held = True
            if m.gpu is None:     # still queued (or parked): nothing runs, and it takes no GPU until resumed
                m.state = "held"
                if m.parked_gpus and m.id in self.queue:
                    self.queue.remove(m.id)
                continue
            slicer = self.slicers[m.gpu]
            slicer.hold(m.id)
            if m.id in slicer.resident or slicer.pending.get(m.id) == "resume":
                busy.append(m.id)
        # The command leaves now, not after the rest of this batch of messages and the tick's other work: the
        # job sees it at its next boundary, and each boundary missed costs the requester a whole mini-batch.
        for gpu in {m.gpu for m in unit if m.gpu is not None}:
            self._switch(self.slicers[gpu], time.monotonic())
        if busy:
            return self._defer(busy, "suspend", identity, msg.id, job.id)
        return {"job": job.id, "state": "held", "latency_s": 0.0, "jobs": [m.id for m in unit]}

    def _on_resume(self, msg, identity):
        job = self._target(msg)
        unit = self._unit_of(job)
        for m in unit:
            m.held = False
            if m.gpu is not None:
                self.slicers[m.gpu].release(m.id)
            elif m.parked_gpus:
                self._unpark(m)
            elif m.id in self.queue:
                m.state = "waiting"
        for gpu in {m.gpu for m in unit if m.gpu is not None}:
            self._switch(self.slicers[gpu], time.monotonic())
        where = (f"runs in its turn on GPU {job.gpu}" if job.gpu is not None else
                 f"waits for GPUs {','.join(map(str, job.parked_gpus))}, which it gave back while suspended"
                 if job.parked_gpus else "waits for a GPU")
        return {"job": job.id, "state": f"runnable: {where}", "jobs": [m.id for m in unit]}

    def _on_kill(self, msg, identity):
        job = self._target(msg)
        unit = self._unit_of(job)
        for m in unit:
            m.kill_requested = True
            if not self.sup.kill(m):
                self._finish(m, "killed", None, "killed by gmux kill")
        return {"job": job.id, "signal": "SIGKILL", "jobs": [m.id for m in unit]}

    def _on_migrate(self, msg, identity):
        job = self._target(msg)
        gpu = msg["gpu"]
        if gpu not in self.gpus:
            raise Refused(f"migrate: no GPU {gpu}; this machine has {', '.join(map(str, sorted(self.gpus)))}")
        if job.gang:
            raise Refused(f"migrate: {job.id} is rank {job.gang['rank']} of gang {job.gang['id']}: moving a rank "
                          f"means rebuilding the ranks' process group on the new GPU, which gmuxd does not do; "
                          f"kill the gang and start it again to place it anew")
        if job.exclusive:
            raise Refused(f"migrate: {job.id} holds GPUs {','.join(map(str, job.exclusive_gpus))} to itself "
                          f"(it asked for {job.gpus_wanted}); gmux migrate moves single-GPU jobs")
        if job.gpu is None:
            raise Refused(f"migrate: {job.id} waits for a GPU and has none to move from")
        if gpu == job.gpu:
            raise Refused(f"migrate: {job.id} is already on GPU {gpu}")
        if self.reserved.get(gpu) or any(gpu in j.exclusive_gpus for j in self.jobs.values() if not j.final):
            raise Refused(f"migrate: GPU {gpu} is held (or being freed) for a multi-GPU job or gang")
        if not job.migratable and job.started:
            raise Refused(f"migrate: {job.id} runs an unmodified script (transparent mode), whose data position "
                          f"cannot be restored in a new process; run it with gmux-launch --no-hook and "
                          f"gmux.job.attach() (which restores a moved job's state) to make it movable")
        need = job.working_set() or 0
        if need > self.gpus[gpu].mem_total:
            raise Refused(f"migrate: {job.id} needs {format_size(need)}, GPU {gpu} has "
                          f"{format_size(self.gpus[gpu].mem_total)}")
        return self._migrate(job, gpu, identity, msg.id)

    def _migrate(self, job: Job, gpu: int, identity=None, msg_id=0):
        now = time.monotonic()
        slicer = self.slicers[job.gpu]
        if not job.started and job.id not in slicer.pending:
            # Nothing has run yet: moving it is bookkeeping; it starts on the new GPU in its turn.
            self._leave_gpu(job, now)
            job.gpu = gpu
            if job.registered:   # else it joins the slicer when its process registers
                self.slicers[gpu].add(job.id, job.weight, job.working_set(), now, used=job.gpu_seconds)
                if job.held:
                    self.slicers[gpu].hold(job.id)
            return {"job": job.id, "gpu": gpu, "moved": "before starting"}
        if job.id in slicer.pending:
            raise Refused(f"migrate: {job.id} is busy with a {slicer.pending[job.id]}; try again in a moment")
        job.target_gpu = gpu
        slicer.pending[job.id] = "migrate"     # holds the slicer: its memory is in use until it has left
        self.send_command(job, "migrate", {"path": self.rundir.checkpoint_file(job.id), "gpu": gpu})
        self._decide(job.gpu, "migrate", [job.id], {"from": job.gpu, "to": gpu},
                     f"migrating {job.id} from GPU {job.gpu} to GPU {gpu} at its next boundary")
        return self._defer(job.id, "migrate", identity, msg_id) if identity is not None else None

    def _on_checkpoint(self, msg, identity):
        """The job writes its state to checkpoints/JOB.snapshot.ckpt at its next boundary (or at once from its
        host copy if suspended) and goes on; the reply waits for that (cluster mode reads the file)."""
        job = self._target(msg)
        if not job.migratable or not job.started:
            raise Refused(f"checkpoint: {job.id} " + ("has not started" if job.migratable else
                          "runs in transparent mode (run it with gmux-launch --no-hook and attach())"))
        slicer = self.slicers.get(job.gpu)
        if slicer is not None and job.id in slicer.pending:
            raise Refused(f"checkpoint: {job.id} is busy with a {slicer.pending[job.id]}; try again in a moment")
        self.send_command(job, "checkpoint", {"path": self.rundir.checkpoint_file(job.id + ".snapshot")})
        return self._defer(job.id, "checkpoint", identity, msg.id)

    def _on_logs(self, msg, identity):
        job = self._target_any(msg)
        if not job.managed:
            raise Refused(f"logs: {job.id} was started with gmux-launch; its output goes to the terminal that "
                          f"started it (gmux submit captures logs)")
        try:
            with open(self.rundir.log_file(job.id), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        tail = msg.get("tail") or 0
        text = data.decode(errors="replace")
        if tail:
            text = "".join(text.splitlines(keepends=True)[-tail:])
        return {"job": job.id, "text": text[-protocol.MAX_FRAME // 2:]}

    def _target_any(self, msg) -> Job:
        self._admin(msg)
        if msg["job"] not in self.jobs:
            raise Refused(f"{msg.type}: no job {msg['job']!r}; `gmux ps` lists the jobs")
        return self.jobs[msg["job"]]

    def _on_submit(self, msg, identity):
        self._admin(msg)
        ranks = msg.get("ranks")
        if ranks is not None and (msg.get("gpus", 1) != 1 or msg.get("gpu") is not None):
            raise Refused("submit: --ranks N starts N single-GPU ranks placed by gmuxd; it takes neither --gpus "
                          "(one process using N GPUs) nor --gpu")
        env = dict(msg.get("env") or {})
        if ranks is not None:
            gang = msg.get("name") or f"gang{self.store.next_job_id()}"
            if self._gang(gang):
                raise Refused(f"submit: a gang named {gang} is running; choose another --name")
            port = free_port()
            jobs = [self._new_submitted(msg, {**env, **rendezvous_env(ranks, port, r)}, f"{gang}-{r}",
                                        gang={"id": gang, "rank": r, "size": ranks}) for r in range(ranks)]
        else:
            jobs = [self._new_submitted(msg, env, msg.get("name") or "")]
        for job in jobs:
            try:
                job.pid = self.sup.spawn(job)
            except OSError as e:
                for other in jobs:
                    self.sup.kill(other)
                    self._finish(other, "failed", None, f"could not start: {e}")
                raise Refused(f"submit: could not start {msg['argv'][0]!r}: {e}")
            job.starttime = proc_starttime(job.pid)
            if job.gpu is not None:
                job.detail = "starting"
            self.store.save(job)
        first = jobs[0]
        data = {"job": first.id, "gpu": first.gpu, "pid": first.pid, "log": self.rundir.log_file(first.id)}
        if ranks is not None:
            data.update(gang=first.gang["id"], jobs=[j.id for j in jobs], pids=[j.pid for j in jobs])
        return data

    def _new_submitted(self, msg, env: dict, name: str, gang: Optional[dict] = None) -> Job:
        job = Job(self.store.next_job_id(), secrets.token_hex(16), name, list(msg["argv"]), msg["cwd"],
                  weight=float(msg.get("weight", 1.0)), mem=msg.get("mem"), managed=True, env=env)
        job.gpus_wanted, job.gang, job.pinned = msg.get("gpus", 1), gang, msg.get("gpu")
        job.hook = msg.get("hook", True)
        self._admit(job, "submit")
        self.jobs[job.id] = job
        if job.gpu is None:
            self._enqueue(job)
        return job

    def _on_decisions(self, msg, identity):
        self._admin(msg)
        return {"decisions": self.store.decisions(msg.get("limit") or 100)}

    def _on_shutdown(self, msg, identity):
        self._admin(msg)
        if msg.get("kill_jobs"):
            for job in self.jobs.values():
                if not job.final:
                    self.sup.kill(job)
                    self._finish(job, "killed", None, "killed at daemon shutdown")
        self.stopping = True
        return {"stopping": True}

    # --- commands to jobs and their outcome ---
    def send_command(self, job: Job, kind: str, args: dict) -> int:
        cmd = next(self._cmd_ids)
        self.inflight[cmd] = (job.id, kind, time.monotonic())
        frame = protocol.encode("command", 0, cmd=cmd, kind=kind, args=args)
        if job.identity is None or not self._send(job.identity, frame):
            job.outbox.append(frame)   # sent when the job's agent is next heard from (e.g. after a restart)
        return cmd

    def _defer(self, jobs, kind: str, identity: bytes, msg_id: int, named: Optional[str] = None):
        """The reply is sent once every job in `jobs` (one id, or a gang's) has acknowledged `kind`."""
        jobs = (jobs,) if isinstance(jobs, str) else tuple(jobs)
        w = Waiter(identity, msg_id, kind, self.received_at, named or jobs[0], jobs, set(jobs))
        for j in jobs:
            self.waiters.setdefault(j, []).append(w)
        return DEFERRED

    def _wake(self, job_id: str, kind: str, ok: bool, latency: float, error=None,
              boundary_wait: Optional[float] = None) -> None:
        waiting = self.waiters.get(job_id, [])
        for w in [w for w in waiting if w.kind == kind]:
            waiting.remove(w)
            if w.done:
                continue
            if not ok:
                w.done = True
                self._send(w.identity, protocol.error_reply(w.msg_id, f"{kind} of {job_id} failed: {error}"))
                continue
            w.left.discard(job_id)
            if not w.left:
                w.done = True
                data = {"job": w.job, "kind": kind, "latency_s": time.monotonic() - w.t0, "job_latency_s": latency}
                if boundary_wait is not None:   # of job_latency_s, the wait for the job's next boundary
                    data["boundary_wait_s"] = boundary_wait
                if len(w.jobs) > 1:
                    data["jobs"] = list(w.jobs)
                self._send(w.identity, protocol.reply(w.msg_id, True, data=data))

    def _leave_gpu(self, job: Job, now: float) -> None:
        for gpu, slicer in self.slicers.items():
            if job.id in slicer.entries:
                job.gpu_seconds = slicer.used(job.id, now)
                slicer.remove(job.id, now)
                self.packers[gpu].forget(job.id)

    def _finish(self, job: Job, state: str, status: Optional[int], detail: str) -> None:
        if job.final:
            return
        if job.kill_requested and state in ("killed", "lost"):
            state, detail = "killed", "killed by gmux kill"
        self._leave_gpu(job, time.monotonic())
        job.state, job.exit_status, job.detail, job.host_bytes = state, status, detail, 0
        job.outbox.clear()
        for cmd in [c for c, e in self.inflight.items() if e[0] == job.id]:
            del self.inflight[cmd]
        for w in self.waiters.pop(job.id, []):
            if not w.done:
                w.done = True
                self._send(w.identity, protocol.error_reply(w.msg_id, f"{w.kind}: job {job.id} ended ({state}: "
                                                                      f"{detail})"))
        if job.id in self.queue:
            self.queue.remove(job.id)
        if job.spilled:    # a job that ended while spilled leaves its host copy behind; nothing will read it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.rundir.spill_file(job.id))
        self.store.save(job)
        where = ("it held no GPU" if job.gpu is None and not job.exclusive_gpus else
                 f"GPUs {','.join(map(str, job.exclusive_gpus))} are free" if len(job.exclusive_gpus) > 1 else
                 f"GPU {job.gpu} is free" if job.exclusive else f"its share of GPU {job.gpu} is free")
        self._decide(job.gpu, "end", [job.id], {"state": state, "status": status, "step": job.step},
                     f"{job.id} {state}: {detail}; {where}")
        if job.gang and state != "exited" and not job.kill_requested:
            # Its peers would wait in their next collective for a rank that is gone: end the gang with it.
            peers = self._gang(job.gang["id"])
            if peers:
                self._decide(job.gpu, "gang", [p.id for p in peers], {"gang": job.gang["id"], "rank": job.gang["rank"]},
                             f"rank {job.gang['rank']} of gang {job.gang['id']} ({job.id}) {state}: killing its "
                             f"peers {', '.join(p.id for p in peers)}")
            for p in peers:
                if not self.sup.kill(p):
                    self._finish(p, "killed", None, f"rank {job.gang['rank']} of its gang {state}")

    def _decide(self, gpu, kind, jobs, numbers, text) -> None:
        self.decisions.append(self.store.decide(gpu, kind, jobs, numbers, text))
        log.info("%s", text)

    # --- the tick: reap, decide, send ---
    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_reap >= REAP_EVERY_S:
            self._last_reap = now
            for job in list(self.jobs.values()):
                if not job.final and job.pid:
                    ended = self.sup.ended(job)
                    if ended is not None:
                        self._finish(job, *ended)
            self._expire_waiters(now)
        self._admit_queue(now)
        for gpu, slicer in self.slicers.items():
            # A pack is tried only on solo rates measured over at least two residencies (one can be disturbed,
            # and a disturbed solo rate reads low, which makes any pack look like a gain).
            rates = {j: Rates(self.jobs[j].rate_solo if self.jobs[j].solo_windows >= 2 else None,
                              self.jobs[j].rate_now, self.jobs[j].window_span()) for j in slicer.entries}
            for d in self.packers[gpu].step(slicer, rates, now):
                self._decide(gpu, d.kind, d.jobs, d.numbers, d.text)
                if d.kind == "recheck":
                    for j in d.jobs:
                        self.jobs[j].forget_solo()
            self._switch(slicer, now)
            self._spill(slicer)
        self._park_held(now)
        self._states()
        self._flush()
        if self.metrics:
            self.metrics.update()

    def _switch(self, slicer: Slicer, now: float) -> None:
        for kind, job_id in slicer.tick(now):
            job = self.jobs[job_id]
            args = {"gpu": slicer.gpu, "env": self._env(job)} if kind == "resume" else {}
            self.send_command(job, kind, args)

    def _spill(self, slicer: Slicer) -> None:
        """Suspended state over the host-RAM budget goes to disk, the largest first. A job that can restart
        from a checkpoint (explicit mode) checkpoints and its process ends, giving back all it holds; any other
        job writes its host copy to a file in its own process and frees it (the `spill` command)."""
        held = sum(j.host_bytes for j in self.jobs.values() if not j.final)
        if held <= self.opt.host_budget:
            return
        for job_id in sorted(slicer.entries, key=lambda j: -self.jobs[j].host_bytes):
            job = self.jobs[job_id]
            # A gang rank is never spilled alone: its process would leave the gang's process group.
            if (not job.host_bytes or not job.started or job.gang or job.spill_refused
                    or job_id in slicer.resident or job_id in slicer.pending):
                continue
            job.spilled = True
            if job.migratable:
                job.target_gpu = job.gpu
                slicer.pending[job_id] = "migrate"
                self.send_command(job, "migrate", {"path": self.rundir.checkpoint_file(job.id), "spill": True})
                how = "checkpoint, end its process"
            else:
                slicer.pending[job_id] = "spill"
                self.send_command(job, "spill", {"path": self.rundir.spill_file(job.id)})
                how = "host copy to a file, in its process"
            self._decide(slicer.gpu, "spill", [job_id], {"host_held": held, "budget": self.opt.host_budget,
                                                         "bytes": job.host_bytes},
                         f"host RAM for suspended jobs {format_size(held)} > budget "
                         f"{format_size(self.opt.host_budget)}: spilling {job_id} to disk ({how})")
            return

    def _expire_waiters(self, now: float) -> None:
        for job_id, waiting in self.waiters.items():
            for w in [w for w in waiting if now - w.t0 > 120]:
                waiting.remove(w)
                if not w.done:
                    w.done = True
                    self._send(w.identity, protocol.error_reply(w.msg_id, f"{w.kind} of {job_id}: no acknowledgement "
                                                                          f"in 120 s (is the job stuck inside a "
                                                                          f"mini-batch?)"))

    def _states(self) -> None:
        for slicer in self.slicers.values():
            for job_id in slicer.entries:
                job = self.jobs[job_id]
                pending = slicer.pending.get(job_id)
                if pending:
                    job.state = {"suspend": "suspending", "resume": "resuming", "migrate": "migrating",
                                 "spill": "suspended", "confirm": job.state}[pending]
                elif job_id in slicer.resident:
                    job.state = "running"
                elif job.held:
                    job.state = "held"
                else:
                    job.state = "suspended" if job.started else "waiting"

    def _sync_accounting(self, now: float) -> None:
        for slicer in self.slicers.values():
            for job_id in slicer.entries:
                self.jobs[job_id].gpu_seconds = slicer.used(job_id, now)

    def _flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_flush >= FLUSH_EVERY_S:
            self._last_flush = now
            self._sync_accounting(now)
            self.store.save_many(j for j in self.jobs.values() if not j.final)


DEFERRED = object()   # a handler's answer that is sent later (when the job acknowledges)
