"""gmux-scheduler: one ROUTER (TCP, CurveZMQ server), one loop, the cluster in SQLite.

Daemons' cluster links connect with daemon keys and report their whole state every half second; clients
(`gmux submit/ps --cluster`) connect with client keys. A peer's role comes from its key (ZAP User-Id), never
from what it says. Every frame is decoded against protocol.CLUSTER_MESSAGES before use; a bad one gets an error
reply, is counted, and the loop goes on.

The loop: receive; every `tick` seconds (at once after an arrival or a completion) rebuild the snapshot, ask the
policy, send the daemons their actions; mark machines silent for `lost_after` seconds lost and put their jobs back
to pending, to restart elsewhere from their last periodic checkpoint. Checkpoint pushes to a daemon run on worker
threads (a 1 GiB file must not stall the loop), their outcome back through a queue. Moves have stages: moves.py.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import zmq

from gmux import protocol
from gmux.wire import keys, sealed
from gmux.cluster.policies import Event, EventKind, make_policy
from gmux.cluster.scheduler.client_handlers import ClientHandlers
from gmux.cluster.scheduler.driver import Driver
from gmux.cluster.scheduler.intents import Intents
from gmux.cluster.scheduler.moves import Moves
from gmux.cluster.scheduler.pushes import Pushes
from gmux.cluster.scheduler.speakers import REFUSAL, REFUSE, TAKE_OVER, routing_name, speaker
from gmux.cluster.scheduler.state import START_TRIES, CJob, Machine, State, claimed_state_dir
from gmux.cluster.scheduler.unheard import RESENT, Unheard
from gmux.util.faults import Faults
from gmux.util.fd_limit import soft_limit
from gmux.wire.connection_guard import ConnectionGuard
from gmux.wire.server import DEFERRED, Server, configure
from gmux.wire.receiver import Receiver

log = logging.getLogger("gmux.scheduler")
STALL_S = 1.0     # a loop iteration this long (it polls every 0.05 s) means the scheduler itself was held
C = protocol.CLUSTER_MESSAGES
START_RETRY_S = 30.0
LEASE_SHARE = 0.8       # of --lost-after: a job's lease (its copy stops before the machine is counted lost)
TAKEOVER_SHARE = 0.5    # of --lost-after: a new gmuxd's wait for the old one's silence (a restart, before a loss)
FENCE_SHARE = 0.6       # of --lost-after: a link unanswered this long suspends its jobs (gmux.node.cluster_fence)
# A periodic checkpoint's file, as a link names it: MACHINE-CJOB-kSEQ.RANK.ckpt (the machine's name may hold '-').
_PERIODIC = re.compile(r"-(c\d+)-k\d+\.\d+\.ckpt$")


@dataclass
class Options:
    listen: str = "tcp://127.0.0.1:7700"
    policy: str = "gmux"
    params: dict = field(default_factory=dict)   # the policy's parameters (make_policy's keywords)
    tick: float = 1.0
    lost_after: float = 5.0
    ckpt_every: Optional[float] = 30.0     # default periodic checkpoint interval for jobs (None: never)
    admins: tuple = ()                     # client key names that may act on every user's jobs


class Scheduler:
    def __init__(self, statedir: str, keydir: str, options: Optional[Options] = None):
        self.opt = options or Options()
        # (a refused policy, or a parameter it does not take, leaves no state directory behind)
        self.driver = Driver(make_policy(self.opt.policy, **self.opt.params))
        self.statedir = statedir
        self.keydir = keydir
        self._closers = contextlib.ExitStack()      # what close() closes, last opened first
        with claimed_state_dir(statedir, on_refusal=self._closers.close) as self._lock:
            self._open()

    def _open(self) -> None:
        """The keys and the address first, then the state (a refusal of either changes nothing there)."""
        statedir, keydir, closers = self.statedir, self.keydir, self._closers
        self.ctx = zmq.Context()
        closers.callback(self.ctx.term)
        self.guard = keys.Guard(self.ctx, keydir, ("daemon", "client"))
        closers.callback(self.guard.stop)
        self.sock = keys.server_socket(self.ctx, zmq.ROUTER, keydir, "scheduler")
        closers.callback(self.sock.close, 0)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)    # a link that reconnects takes its name back at once
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, protocol.XFER_MAX_CHUNK + protocol.MAX_FRAME)
        configure(self.sock)
        try:
            self.sock.bind(self.opt.listen)
        except zmq.ZMQError as e:
            raise OSError(f"cannot listen on {self.opt.listen}: {e}") from None
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.state = State(os.path.join(statedir, "scheduler.db"))
        closers.callback(self.state.close)
        self.jobs = self.state.load_jobs()
        self.machines = self.state.load_machines()
        now = time.time()
        for m in self.machines.values():
            m.last_seen = max(m.last_seen, now)   # a restarted scheduler gives every machine a fresh grace period
        self._listened_at = now
        self.receiver = Receiver(os.path.join(statedir, "checkpoints"))
        closers.callback(self.receiver.close)
        self._sweep_checkpoints()
        self.intents = Intents(self)
        self._refused_idents: set = set()    # second gmuxds claiming a machine's name (logged once each)
        # Periodic checkpoints arrive sealed beside Curve (gmux.wire.sealed): decrypting every machine's in one
        # process is what a cluster's scheduler would otherwise spend its core on.
        self.bulk, self.receiver.bulk_port = sealed.bulk_socket(self.ctx, self.endpoint)
        self.guard.bulk_login = self.receiver.bulk_login
        closers.callback(self.bulk.close, 0)
        self.faults = Faults(log)
        self.connections = ConnectionGuard("gmux-scheduler", None, soft_limit(), self.faults)
        self.connections.ports.update({int(self.endpoint.rsplit(":", 1)[1]), self.receiver.bulk_port})
        closers.callback(self.connections.stop)
        # What each key may send: a daemon's link reports and pushes checkpoints, a client asks.
        handlers = {"daemon": {"node_report": self._daemon_node_report, "node_event": self._daemon_node_event,
                               "xfer_begin": self._daemon_xfer_begin, "xfer_chunk": self._daemon_xfer_chunk,
                               "xfer_end": self._daemon_xfer_end},
                    "client": ClientHandlers(self).table()}
        self.server = Server(self.sock, {role: {t: _by_key(h) for t, h in table.items()}
                                         for role, table in handlers.items()},
                             name="gmux-scheduler", table=C, refusals=(protocol.ProtocolError,),
                             authenticate=self._peer, attachments=True, reply_to_none=False)
        self.timers: list = []
        self.pushes = Pushes(self)
        self.moves = Moves(self)
        self.unheard = Unheard(self._action)
        self.events: deque = deque()
        self.decision_ms: deque = deque(maxlen=2000)
        self.stopping = False
        self._last_tick = 0.0
        self.recent: deque = deque(maxlen=200)
        if any(not j.final for j in self.jobs.values()):
            self._log("recover", None, f"recovered {sum(not j.final for j in self.jobs.values())} live jobs and "
                                       f"{len(self.machines)} machines from {self.state.db and 'SQLite'}")

    # --- loop ---
    def serve(self, until=None) -> None:
        self.connections.start()
        try:
            self.server.serve(self._between_polls, lambda: self.stopping or bool(until and until()),
                              poll_s=0.05, batch=500,
                              beside={self.bulk: lambda: sealed.serve_bulk(self.bulk, self.receiver.handle_sealed)})
        finally:
            self.close()

    def _between_polls(self) -> None:
        self.pushes.drain()
        self._answer_flushed()
        now = time.time()
        self._credit_own_stall(now)
        if self.events or now - self._last_tick >= self.opt.tick:
            self._last_tick = now
            with self.faults.guard("the tick"):     # (out of files, it could not list a directory: it ended)
                self.tick(now)

    @property
    def bad_messages(self) -> int:
        return self.server.refused

    @property
    def internal_errors(self) -> int:
        return self.server.internal_errors + self.faults.count

    def close(self) -> None:
        self.state.save_many(self.jobs.values())
        self._closers.close()
        os.close(self._lock)

    def _peer(self, frame) -> Optional[tuple]:
        """(role, name) from the peer's key (its ZAP User-Id), never from what it says; None for no known key."""
        user = frame.get("User-Id")
        return self.guard.who(user) if user else None

    def _action(self, machine: str, action: str, cjob: str, **args) -> bool:
        m = self.machines.get(machine)
        ok = self.server.send((m.ident if m and m.ident else machine).encode(),
                              protocol.encode("node_action", 0, table=C, action=action, cjob=cjob, args=args))
        if not ok:
            log.warning("could not reach %s for %s %s", machine, action, cjob)
        if action in RESENT:
            self.unheard.sent(cjob, ok, time.time())
        return ok

    def _log(self, kind: str, cjob: Optional[str], text: str, numbers: Optional[dict] = None) -> None:
        self.recent.append(self.state.decide(kind, cjob, text, numbers))
        log.info("%s", text)

    # --- from daemons ---
    def _daemon_node_report(self, name, ident, msg, data):
        who = routing_name(ident, name)
        if msg["name"] != name or who is None:
            raise protocol.ProtocolError(f"report names machine {msg['name']!r} but comes with the key of {name!r}"
                                         if who else "a link's routing id must be its key's name (NAME/BOOT)")
        now = time.time()
        m = self.machines.get(name)
        if m is None:
            m = self.machines[name] = Machine(name, msg["gpus"], msg["transfer"], joined=now, ident=who)
            self._log("join", None, f"machine {name} joined with {len(msg['gpus'])} GPU(s)")
            self.events.append(Event(EventKind.TICK))
        self._speaks_for(m, who, now)
        if m.state == "lost":
            m.state = "up"
            self._log("join", None, f"machine {name} is back")
        m.gpus, m.transfer, m.last_seen = msg["gpus"], msg["transfer"], now
        self.state.save_machine(m)
        for r in msg["jobs"]:
            job = self.jobs.get(r["cjob"])
            if job is None or (job.machine != name and job.source != name):
                if job is not None and r["state"] not in protocol.FINAL_STATES \
                        and self.unheard.stale(name, r["cjob"], now):   # a copy on a machine the job left
                    self._action(name, "kill", r["cjob"])      # (back after being counted lost): stopped
                self.state.ids_past(r["cjob"])     # (a job its state lost, on a disk full at a crash: never reused)
                continue
            if job.machine != name or job.final:
                # the migration source's view (the target's reports are the truth; its step, though, is the
                # source's until the target restores: ps showed 113 while the source trained to 278), or news
                # about a job already ended
                if not job.final and job.source == name and r["state"] not in protocol.FINAL_STATES:
                    job.step = max(job.step, r["step"])
                continue
            self._observe(job, r, now)
            again = self.unheard.check(job, r, now)
            if again:
                self._log("resend", job.cjob, f"{job.cjob}: {name} shows it did not hear '{again}': sent again")
        return {"fence_s": FENCE_SHARE * self.opt.lost_after}

    def _observe(self, job: CJob, r: dict, now: float) -> None:
        if r["state"] in protocol.FINAL_STATES and f"{job.machine}/{r['local']}" == job.ended_local:
            return        # the copy it restarted from, whose record its machine shows until it starts the next
        job.local = r["local"]
        job.ranks = r.get("ranks") or []
        job.step = max(job.step, r["step"]) if job.state != "pending" else job.step
        job.boundless = bool(r.get("boundless"))
        job.unmovable = r.get("unmovable")
        job.parked = r.get("parked_gpu") is not None
        job.gpu_seconds = float(r.get("gpu_seconds") or 0.0)
        for k in ("rate_now", "rate_solo", "mem_peak"):
            if r.get(k) is not None:
                setattr(job, k, r[k])
        if r["state"] in protocol.FINAL_STATES:
            if job.state == "migrating":
                return
            if r.get("exit_status") == protocol.LEASE_LOST_STATUS and protocol.LEASE_LOST_REASON in r["detail"] \
                    and not job.kill_requested:
                # It stopped itself, its gmuxd silent for its lease (gmuxd came back before the machine was
                # counted lost): nothing failed.
                self._restart_elsewhere(job, f"it stopped on {job.machine}, {protocol.LEASE_LOST_REASON}")
                self._log("lost", job.cjob, f"{job.cjob}: {job.detail}")
                return
            status = r.get("exit_status")
            if r["state"] == "exited" and status == 0:
                state = "done"
            elif job.kill_requested:
                state = "killed"
            else:
                state = "failed"
            self._end(job, state, status, r.get("detail") or r["state"], now)
        elif job.state == "starting" and r["state"] in ("running", "suspended", "stopped") and \
                (r["step"] > 0 or r.get("boundless") and not job.ckpt_paths):    # (a restore shows its step)
            job.start_failures = 0
            job.set("running", "")      # (what it was starting with, "restoring its checkpoint", is over)
            job.first_run = job.first_run or now
            self.state.save(job)      # a state change is written at once, measurements at the tick

    def _end(self, job: CJob, state: str, status: Optional[int], detail: str, now: float) -> None:
        job.exit_status, job.finished = status, now
        self.unheard.forget(job.cjob)
        self._drop_checkpoints(job.cjob)   # an ended job is never restarted: its checkpoints are dead weight
        job.set(state, detail)
        self._log("end", job.cjob, f"{job.cjob} {state} on {job.machine} at step {job.step}: {job.detail}",
                  {"step": job.step, "status": status})
        self.events.append(Event(EventKind.COMPLETION, job_id=job.cjob))

    def _speaks_for(self, m: Machine, who: str, now: float) -> None:
        """gmux.cluster.scheduler.speakers: the gmuxd that speaks for `m`, or a refusal of this one."""
        verdict = speaker(m, who, now, TAKEOVER_SHARE * self.opt.lost_after)
        if verdict == REFUSE:
            if who not in self._refused_idents:
                self._refused_idents.add(who)
                self._log("refused", None, f"a second gmuxd claims machine {m.name} while the first reports: its "
                                           f"messages are refused until the first has been silent")
            raise protocol.ProtocolError(REFUSAL.format(name=m.name, silence=TAKEOVER_SHARE * self.opt.lost_after))
        m.ident = who       # (before the moves below: what they send this machine goes to the new gmuxd)
        if verdict == TAKE_OVER:
            self._log("join", None, f"machine {m.name}: a new gmuxd speaks for it")
            self.moves.target_restarted(m.name)
            self.moves.source_restarted(m.name)

    def _daemon_node_event(self, name, ident, msg, data):
        if name in self.machines and self.machines[name].ident not in ("", routing_name(ident, name)):
            raise protocol.ProtocolError(f"machine {name} is another gmuxd's: this one's events are not taken")
        job = self.jobs.get(msg["cjob"])
        if job is None:
            raise protocol.ProtocolError(f"node_event: no cluster job {msg['cjob']!r}")
        ev, d = msg["event"], msg.get("data") or {}
        detail = msg.get("detail") or ""
        if job.final:
            return None        # news about a job that has ended (its report got here first)
        if ev in Moves.EVENTS:
            self.moves.event(job, name, ev, d, detail)
        elif ev == "started" and job.machine == name and job.state in ("starting", "migrating"):
            if job.state == "migrating" and job.source and not d.get("step") and job.step:    # (restored nothing)
                return self._log("action_failed", job.cjob, f"{job.cjob}: {name} started it at step 0: kept on source")
            if job.state == "migrating" and job.source:
                self.moves.arrived(job, name, d)
            job.move = {}          # (a move whose source was lost after it sent: nothing is left to release)
            job.start_failures = 0
            job.set("running", "")    # (what it was starting with, "restoring its checkpoint", is over)
            job.first_run = job.first_run or time.time()
        elif ev == "start_failed" and job.machine == name and job.state in ("starting", "migrating"):
            if job.state == "migrating" and job.source:
                self.moves.target_failed(job, f"migration target {name} failed: {detail}")
            else:
                job.machine, job.gpu, job.rank_gpus = None, None, []
                job.start_failures += 1
                if job.start_failures < START_TRIES:
                    job.set("pending", f"start on {name} failed: {detail}")
                else:
                    job.set("held", f"held: its start failed {job.start_failures} times in a row, the last on {name}: "
                                    f"{detail}; `gmux resume --cluster ADDRESS {job.cjob}` tries again")
            self._log("start_failed", job.cjob, f"{job.cjob}: start on {name} failed: {detail}"
                      + ("; held" if job.state == "held" else ""))
        elif ev == "checkpointed":
            xfers = d.get("xfers")
            ok = (xfers is not None and len(xfers) == job.gpus      # names, typed by the protocol (EVENT_DATA)
                  and all(x.startswith(f"{name}-{job.cjob}-") for x in xfers))
            paths = [self.receiver.path(x) for x in xfers] if ok else []
            step = int(d.get("step") or 0)
            if paths and all(os.path.exists(p) for p in paths) and step >= (job.ckpt_step or 0):
                job.ckpt_paths, job.ckpt_step = paths, step
                self._drop_checkpoints(job.cjob, keep=paths)     # only the newest complete set is worth keeping
            elif paths:      # older than the set held (a move's source, checkpointed before the move, heard late)
                self._drop_checkpoints(job.cjob, keep=job.ckpt_paths)
        elif ev == "suspended" and job.state == "suspended":
            job.detail = f"held on {name}"
        elif ev == "resumed" and job.state == "held":     # a policy resume overtaken by its user's hold
            self._action(job.machine, "suspend", job.cjob)
        elif ev == "action_failed":
            if d.get("action") == "move" and not d.get("busy"):     # (busy: a move still under way)
                self.unheard.refused(job.cjob)
            if d.get("action") == "resume" and "parked_gpu" in d and job.state in ("running", "held"):
                # resumed onto another GPU of a machine where it had given its own to others: it stays suspended
                # there (held, if its user held it since)
                job.set("suspended" if job.state == "running" else job.state, detail)
                job.gpu, job.rank_gpus, job.parked = d["parked_gpu"], [d["parked_gpu"]], True
            self._log("action_failed", job.cjob, f"{job.cjob} on {name}: {detail}")
        self.state.save(job)
        return None

    def _sweep_checkpoints(self) -> None:
        """Received checkpoints no live job's newest set names (left by a scheduler that stopped between a
        transfer and its bookkeeping) are deleted at start."""
        keep = {p for j in self.jobs.values() if not j.final for p in j.ckpt_paths}
        for f in os.listdir(self.receiver.dir):
            path = os.path.join(self.receiver.dir, f)
            if f.endswith(".ckpt") and path not in keep:
                os.unlink(path)

    def _drop_checkpoints(self, cjob: str, keep=()) -> None:
        """Deletes the received checkpoints of `cjob` but those in `keep`."""
        for f in os.listdir(self.receiver.dir):
            m = _PERIODIC.search(f)
            path = os.path.join(self.receiver.dir, f)
            if m and m.group(1) == cjob and path not in keep:
                os.unlink(path)
        job = self.jobs.get(cjob)
        if job is not None and not keep:
            job.ckpt_paths = []

    def _daemon_xfer_begin(self, name, ident, msg, data):
        return self._xfer(name, ident, msg, data)

    _daemon_xfer_chunk = _daemon_xfer_end = _daemon_xfer_begin

    def _xfer(self, name, ident, msg, data):
        if not msg["xfer"].startswith(name + "-"):
            raise protocol.ProtocolError(f"{msg.type}: a daemon's checkpoint names start with its own name")
        # A checkpoint's fsync runs beside this loop (gmux.wire.receiver): the end is answered from _between_polls.
        ok, out = self.receiver.handle(msg, data, later=(ident, msg.id))
        if not ok:
            raise protocol.ProtocolError(out)
        return DEFERRED if out is Receiver.LATER else out

    def _answer_flushed(self) -> None:
        for (ident, msg_id), ok, out in self.receiver.finished():
            if ok:
                self.server.reply(ident, msg_id, out)
            else:
                self.server.refuse(ident, msg_id, out)

    # --- the tick ---
    def tick(self, now: float) -> None:
        self.receiver.expire()
        self._losses(now)
        self._stalled_starts(now)
        self.moves.expire(time.monotonic())
        events = list(self.events) or [Event(EventKind.TICK)]
        self.events.clear()
        due = [t for t in self.timers if t[0] <= now]
        self.timers = [t for t in self.timers if t[0] > now]
        events += [Event(EventKind.TIMER, key=k) for _, k in due]
        for ev in events:
            if ev.kind is not EventKind.COMPLETION and not any(not j.final for j in self.jobs.values()):
                continue        # (a completion still reaches the policy: it learns from the last one too)
            t0 = time.perf_counter()
            try:
                intents, timers = self.driver.decide(self.jobs, self.machines, ev, now)
            except Exception as e:
                # A policy's bug must not take the cluster's control down with it: the jobs run on, the
                # scheduler still answers, and the next event asks the policy again.
                log.exception("policy %s failed on %s", self.opt.policy, ev)
                self._log("policy_failed", ev.job_id if isinstance(ev.job_id, str) else None,
                          f"policy {self.opt.policy} failed on {ev.kind.value}: {type(e).__name__}: {e}"[:500])
                continue
            self.timers += timers
            for it in intents:
                self.intents.carry_out(it)
            self.decision_ms.append((time.perf_counter() - t0) * 1000)
        self.state.save_many(j for j in self.jobs.values() if not j.final or j.finished and now - j.finished < 5)

    def _stalled_starts(self, now: float) -> None:
        """A start the daemon never acted on (lost with a scheduler that died right after deciding, or sent while
        the link was reconnecting) is sent again; the link ignores a start of a job it already runs."""
        for job in self.jobs.values():
            if (job.state == "starting" and job.local is None and now - job.since > START_RETRY_S
                    and job.cjob not in self.pushes.pushing):
                job.since = now
                if job.ckpt_paths:
                    job.machine, job.gpu, job.rank_gpus = None, None, []  # pushed, never seen there: place again
                    job.set("pending", "restore not confirmed: placing again")
                    self.events.append(Event(EventKind.ARRIVAL, job_id=job.cjob))
                    continue
                self._action(job.machine, "start", job.cjob, **self._start_args(job))
                self._log("retry", job.cjob, f"{job.cjob}: no sign of it on {job.machine} after "
                                             f"{START_RETRY_S:g} s: start sent again")

    def _credit_own_stall(self, now: float) -> None:
        """A machine is lost once the scheduler has *listened* for lost_after seconds and heard nothing. While
        its own loop was held (a write to a disk another tenant saturates, the whole host descheduled), the
        machines' reports wait unread in its socket, and counting that time would declare every machine lost at
        once, restarting all their jobs elsewhere (a CI run lost all three this way after a 15 s stall)."""
        gap, self._listened_at = now - self._listened_at, now
        if gap < STALL_S:
            return
        for m in self.machines.values():
            if m.state == "up":
                m.last_seen += gap
        log.warning("the scheduler's loop was held for %.1f s: machines' silence during it is not counted", gap)

    def _losses(self, now: float) -> None:
        for m in self.machines.values():
            if m.state == "up" and now - m.last_seen > self.opt.lost_after:
                m.state = "lost"
                self.state.save_machine(m)
                moved = []
                for job in self.jobs.values():
                    if job.final or self.moves.machine_lost(job, m.name):
                        continue
                    if job.machine == m.name and job.kill_requested:    # (started elsewhere, it was killed there)
                        self._end(job, "killed", None, f"killed; its machine {m.name} was lost before it said so", now)
                        job.machine = job.gpu = None    # (a copy there, if it is heard again, is killed as stale)
                    elif job.machine == m.name:
                        self._restart_elsewhere(job, f"machine {m.name} lost")
                        moved.append(job.cjob)
                self._log("lost", None, f"machine {m.name} silent for {now - m.last_seen:.1f} s: lost; "
                                        f"{len(moved)} job(s) to restart elsewhere: {', '.join(moved)}",
                          {"jobs": moved})

    def _restart_elsewhere(self, job: CJob, why: str) -> None:
        """The job's processes are gone with the machine it ran on: it restarts from its newest checkpoint."""
        job.attained += job.gpu_seconds
        job.ended_local = f"{job.machine}/{job.local}"   # (local ids are each gmuxd's own)
        job.gpu_seconds, job.machine, job.gpu, job.source, job.local, job.parked = 0.0, None, None, None, None, False
        # (its step is its checkpoint's again: what the lost machine last said is lost with it)
        job.rank_gpus, job.ranks, job.step = [], [], job.ckpt_step or 0 if job.ckpt_paths else 0
        job.restarts += 1
        held = job.state == "held"       # (its user's hold outlives the machine)
        job.set("held" if held else "pending", f"{why}; restarts from "
                + (f"its checkpoint at step {job.ckpt_step}" if job.ckpt_paths else "the beginning (no checkpoint yet)")
                + (" once released" if held else ""))
        if not held:
            self.events.append(Event(EventKind.ARRIVAL, job_id=job.cjob))

    def _start_args(self, job: CJob, restore: Optional[list] = None) -> dict:
        """What a link needs to start the job's ranks: rank r on gpus[r], restoring received checkpoint
        restore[r] (None: from the beginning)."""
        return {"argv": job.argv, "cwd": job.cwd, "env": job.env, "gpus": job.rank_gpus or [job.gpu], "mem": job.mem,
                "weight": job.weight, "restore": restore, "ckpt_every": job.ckpt_every,
                # (shorter than the time to count its machine lost, which starts it elsewhere: one copy at a time)
                "lease_s": LEASE_SHARE * self.opt.lost_after}


def _by_key(handler):
    """A handler of the form (machine or client name, routing id, message, attached frame), as a server handler."""
    return lambda req: handler(req.peer[1], req.identity, req.msg, req.attachment)
