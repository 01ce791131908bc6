"""gmuxd: the per-machine multiplexer. One thread, one ROUTER socket, one loop (gmux.wire.server).

This file is the daemon's lifecycle and its tick; the rest are its parts, each behind a narrow interface:
  - JobHandlers (job_handlers.py) and AdminHandlers (admin_handlers.py): the messages, by who sends them;
  - Commands (commands.py): commands in flight to jobs, and the requests waiting for their acknowledgement;
  - Admission (admission.py): which GPU a job gets, the queue, whole GPUs for multi-GPU jobs and gangs;
  - per GPU a Slicer and a Packer, and the spill policy: pure decisions, carried out here;
  - Stopping (stopping.py): the slicer's stops of a job that misses its deadline (SIGSTOP/SIGCONT);
  - Moves (moves.py): moves between GPUs in the job's own process; ResumeRetries (resume_retry.py): failed resumes;
  - recover (recovery.py): a restarted daemon re-attaches to the jobs of the one before it.
Between messages the loop ticks: it reaps ended jobs, gives queued jobs their GPUs, lets each GPU's packer and
time-slicer decide, spills suspended state over the host-RAM budget, and sends the resulting commands. The job
table and the decisions live in SQLite, so a restarted daemon re-attaches to the jobs that kept running.
"""
from __future__ import annotations

import contextlib
import logging
import os
import pwd
import signal
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

import zmq

from gmux import protocol
from gmux.node import log_limit, spill
from gmux.node.access import Access, SystemMode
from gmux.node.admin_handlers import AdminHandlers
from gmux.node.admission import Admission
from gmux.node.commands import Commands
from gmux.node.cuda_rebind import CudaDriver, Driver
from gmux.node.inventory import Gpu, Readings, env_for
from gmux.node.job_handlers import JobHandlers
from gmux.node.jobs import Job, gang_members
from gmux.node.moves import Moves
from gmux.node.packer import Packer, Rates
from gmux.node.recovery import recover
from gmux.node.resume_retry import ResumeRetries
from gmux.node.slicer import Slicer
from gmux.node.pacing import Pacing
from gmux.node.stopping import Stopping
from gmux.node.store import Store
from gmux.node.supervisor import Supervisor
from gmux.rundir import RuntimeDir, alive, proc_starttime
from gmux.util.faults import Faults
from gmux.util.fd_limit import soft_limit
from gmux.wire.connection_guard import ConnectionGuard
from gmux.wire.server import Busy, Caller, Refused, Request, Server, configure

log = logging.getLogger("gmux.daemon")

TICK_S = 0.02           # how often policies run when no message arrives
REAP_EVERY_S = 0.2      # how often ended processes are looked for
FLUSH_EVERY_S = 2.0     # how often measurements are written to SQLite

# What a job is doing while a command to it awaits acknowledgement ("confirm": a re-attached job's state is
# only believed until it says). A move in its own process is a suspend until it has left (and a restarted
# daemon, which knows nothing of the move, takes it for one: its process will not re-register as a migrating
# job's would).
_BUSY_STATE = {"suspend": "suspending", "resume": "resuming", "migrate": "migrating", "spill": "suspended",
               "move": "suspending"}


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
    pacing: Pacing = Pacing()         # suspend deadlines and turns from each job's mini-batch time
    keep_ended: int = 1000            # ended jobs kept in the job table (the newest); older ones only in SQLite
    retain_ended: float = 30 * 86400  # seconds an ended job's row stays in SQLite
    system: Optional[SystemMode] = None  # gmuxd --system: one socket for a group, users told apart by the kernel
    log_limit: int = log_limit.DEFAULT_LIMIT   # bytes of a submitted job's log (gmux.node.log_limit)


class Daemon:
    def __init__(self, rundir: RuntimeDir, gpus: list[Gpu], options: Optional[Options] = None,
                 rebind: Optional[Driver] = None, load_driver: Callable[[], Driver] = CudaDriver.load):
        """rebind: the CUDA driver's checkpoint API (gmuxd --rebind-gpus), which moves jobs between real GPUs
        in their own process (gmux.node.moves); load_driver: how to get it without --rebind-gpus, to put back a
        process that a predecessor with it left mid-rebind."""
        self.rundir = rundir
        self.gpus = {g.index: g for g in gpus}
        self.readings = Readings(gpus)      # real GPUs' memory in use, for ps
        self.opt = options or Options()
        system = self.opt.system
        rundir.create(system.socket_group if system else None)
        self._claim_pid_file()
        if system is None:
            self.admin = rundir.admin_token(create=True)
        else:
            # No admin token: the kernel says who asks. One left here by a per-user daemon would grant nothing,
            # and is removed so that no client takes it for the way in.
            self.admin = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(rundir.admin_token_file)
        self.access = Access(self.admin, rundir.admin_token_file, system)
        self.store = Store(rundir.db)
        self.sup = Supervisor(rundir, system is not None, self.opt.log_limit)
        self.log_bounds = log_limit.Bounds(self.opt.log_limit)
        self.jobs: dict[str, Job] = {}
        self.slicers = {g.index: Slicer(g.index, g.mem_total, self.opt.quantum, self.opt.pacing) for g in gpus}
        self.packers = {g.index: Packer(self.opt.margin, self.opt.window, self.opt.retry_after, self.opt.pack,
                                        recheck=self.opt.recheck) for g in gpus}
        self.admission = Admission(self.gpus, self.jobs, self.slicers, self.store, self)
        self.decisions: deque = deque(maxlen=200)
        self.started = time.time()
        self.stopping = False
        self._last_reap = self._last_flush = 0.0
        self.faults = Faults(log)
        sock = configure(zmq.Context.instance().socket(zmq.ROUTER))
        sock.setsockopt(zmq.MAXMSGSIZE, 16 * protocol.MAX_FRAME)  # beyond this, not even an error reply
        if os.path.exists(rundir.socket):
            os.unlink(rundir.socket)   # stale: the pid file proved no daemon owns it
        sock.bind(rundir.endpoint)
        self.socket_id = rundir.socket_id()
        if system is not None:   # the group's members connect (the directory lets only them reach it)
            os.chown(rundir.socket, -1, system.socket_group)
            os.chmod(rundir.socket, 0o660)
        else:
            os.chmod(rundir.socket, 0o600)
        self.connections = ConnectionGuard("gmuxd", rundir.socket, soft_limit(), self.faults)
        handlers = {**JobHandlers(self).table(), **AdminHandlers(self).table()}
        self.server = Server(sock, handlers, name="gmuxd", unknown="{type} is sent by gmuxd, not to it",
                             credentials=system is not None)
        self.commands = Commands(self.server)
        self.stops = Stopping(self)
        self.resume_retries = ResumeRetries(self)
        self.moves = Moves(self, rebind, load_driver)
        self.metrics = None
        if self.opt.metrics_port is not None:
            from gmux.node.metrics import Metrics
            self.metrics = Metrics(self, self.opt.metrics_port)
        recover(self)

    @property
    def messages(self) -> int:
        return self.server.messages

    @property
    def internal_errors(self) -> int:
        """Bugs met and survived: a handler's (answered with an error) and the tick's (gmux.util.faults)."""
        return self.server.internal_errors + self.faults.count

    # --- lifecycle ---
    def _claim_pid_file(self) -> None:
        running = self.rundir.daemon_process()
        if running is not None and running[0] != os.getpid() and alive(*running):
            raise RuntimeError(f"gmuxd is already running in {self.rundir.root} (pid {running[0]}); "
                               f"stop it first or use another --runtime-dir")
        if self.rundir.socket_answers():    # (no gmuxd's: its clients would reach the other program)
            raise RuntimeError(f"another program serves {self.rundir.socket}: use another --runtime-dir")
        fd = os.open(self.rundir.pid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()} {proc_starttime(os.getpid())}")

    def stop(self) -> None:
        """The loop ends after this batch of messages (jobs keep running unless killed first)."""
        self.stopping = True

    def close(self) -> None:
        self.moves.settle()
        self.stops.continue_all()
        self._flush(force=True)
        if self.metrics:
            self.metrics.close()
        self.connections.stop()
        self.server.sock.close(0)
        self.rundir.release(self.socket_id)
        self.store.close()

    def serve(self, until=None) -> None:
        """Runs until shutdown (message or `stopping`), or until `until()` returns true."""
        self.connections.start()
        try:
            self.server.serve(self.tick, lambda: self.stopping or bool(until and until()), poll_s=TICK_S)
        finally:
            self.close()

    # --- what the parts ask of the daemon (gmux.node.admission.Node, and the handlers) ---
    def decide(self, gpu: Optional[int], kind: str, jobs: list, numbers: dict, text: str) -> None:
        self.decisions.append(self.store.decide(gpu, kind, jobs, numbers, text))
        log.info("%s", text)

    def user_dir(self, who: Caller) -> None:
        """A system daemon's job writes its checkpoints and exit record in its owner's users/UID: made (or
        checked) before the job exists, for a user the user database knows (the job will run as them)."""
        try:
            pwd.getpwuid(who.uid)
        except KeyError:
            raise Refused(f"uid {who.uid} is not in the user database; gmuxd --system runs jobs only for known "
                          f"users") from None
        try:
            self.rundir.make_user_dir(who.uid, who.gid)
        except OSError as e:
            raise Refused(f"cannot prepare {self.rundir.user_dir(who.uid)} for your jobs: {e}") from None

    def add_job(self, job: Job) -> None:
        """A new job (admitted) enters the job table."""
        self.jobs[job.id] = job

    def seat(self, job: Job, now: float) -> None:
        self.slicers[job.gpu].add(job.id, job.weight, job.working_set(), now, used=job.gpu_seconds,
                                  stoppable=not job.exclusive)
        if job.held:
            self.slicers[job.gpu].hold(job.id)

    def leave_gpu(self, job: Job, now: float) -> None:
        for gpu, slicer in self.slicers.items():
            if job.id in slicer.entries:
                job.gpu_seconds = slicer.used(job.id, now)
                slicer.remove(job.id, now)
                self.packers[gpu].forget(job.id)

    def moves_in_process(self, job: Job, gpu: int) -> bool:
        return self.moves.applies(job, gpu)

    def env(self, job: Job) -> dict:
        """The environment that shows the job its GPUs."""
        return env_for([self.gpus[g] for g in job.exclusive_gpus] or [self.gpus[job.gpu]])

    def host_held(self) -> int:
        """Host RAM the live jobs hold for their suspended state."""
        return sum(j.host_bytes for j in self.jobs.values() if not j.final)

    def switch(self, slicer: Slicer, now: float) -> None:
        """Carries out what the GPU's slicer decides now: the suspends and resumes of a switch, and the stops
        and continues of jobs that miss their deadlines."""
        for kind, job_id in slicer.tick(now):
            job = self.jobs.get(job_id)
            if job is None or job.final:
                continue
            if kind not in ("suspend", "resume"):
                self.stops.carry_out(slicer, kind, job, now)
                continue
            args = {"gpu": slicer.gpu, "env": self.env(job)} if kind == "resume" else slicer.suspend_args(job_id)
            self.commands.send(job, kind, args)

    def migrate(self, job: Job, gpu: int, req: Optional[Request] = None, new_process: bool = False):
        """Moves a single-GPU job to `gpu`: at once if it has not run yet; between virtual GPUs (and real ones
        with --rebind-gpus), in its own process (gmux.node.moves; new_process: not so); else by a checkpoint at
        its next boundary, its process ending and its launcher executing itself again to restore it on `gpu`
        (with `req`, the reply waits for the job to have suspended or checkpointed). The reply's `path` says
        which."""
        now = time.monotonic()
        slicer = self.slicers[job.gpu]
        busy = slicer.busy_with(job.id)
        if not job.started and not busy:
            # Nothing has run yet: moving it is bookkeeping; it starts on the new GPU in its turn.
            self.leave_gpu(job, now)
            job.gpu = gpu
            if job.registered:   # else it joins the slicer when its process registers
                self.seat(job, now)
            return {"job": job.id, "gpu": gpu, "moved": "before starting", "path": "before starting"}
        if busy == "resume" and not job.started:
            raise Busy(f"migrate: {job.id} is starting: it has not reached its first boundary (the end of its first "
                       f"mini-batch; a script run with --no-hook reaches one only once it calls gmux.job.attach() and "
                       f"trains; a Hugging Face Trainer at a step after which it neither evaluates, saves nor stops); "
                       f"try again then")
        if busy:
            raise Busy(f"migrate: {job.id} is busy with a {busy}; try again in a moment")
        if self.moves.applies(job, gpu, new_process):
            return self.moves.start(job, gpu, req)
        job.target_gpu = gpu
        job.detail = f"moving to GPU {gpu} in a new process: a checkpoint at its next boundary, then a restore"
        slicer.mark_busy(job.id, "migrate")     # holds the slicer: its memory is in use until it has left
        self.commands.send(job, "migrate", {"path": self.rundir.checkpoint_file(job.id, job.uid), "gpu": gpu})
        self.decide(job.gpu, "migrate", [job.id], {"from": job.gpu, "to": gpu, "path": "new process"},
                    f"migrating {job.id} from GPU {job.gpu} to GPU {gpu} at its next boundary: checkpoint, then "
                    f"a new process restores it there")
        data = {"gpu": gpu, "from": job.gpu, "path": "new process"}
        return self.commands.defer(job.id, "migrate", req, data=data) if req is not None else None

    def _bound_logs(self, now: float) -> None:
        """Each running submitted job's log held to --log-limit (gmux.node.log_limit)."""
        due = self.log_bounds.round_due(now)
        for job in self.jobs.values():
            if job.managed and not job.final:
                with self.faults.guard("bounding a job's log", job.id):
                    self.log_bounds.hold(job.id, self.rundir.log_file(job.id), due)

    def forget_ended(self) -> None:
        """The job table keeps the newest `keep_ended` ended jobs; older ones live on only in SQLite, so that a
        long-running daemon's table (and every `gmux ps`) does not grow with its history."""
        ended = [j for j in self.jobs.values() if j.final]
        if len(ended) > self.opt.keep_ended:
            ended.sort(key=lambda j: (j.ended or j.created, j.created))
            for j in ended[:len(ended) - self.opt.keep_ended]:
                del self.jobs[j.id]

    def finish(self, job: Job, state: str, status: Optional[int], detail: str) -> None:
        """The job has ended: it leaves its GPU and the queue, whoever waits on it hears, and a gang's other
        ranks are ended with it."""
        if job.final:
            return
        self.moves.refused.pop(job.id, None)
        if job.kill_requested and state in ("killed", "lost"):
            # (gone without an exit record after gmux's SIGKILL, as a job not its child is (gmux-launch's, a cluster
            # job's): -9, as one it reaps says, not null)
            status = -signal.SIGKILL if state == "lost" and status is None else status
            state, detail = "killed", job.kill_reason
        self.leave_gpu(job, time.monotonic())
        # A checkpoint still here was not restored from (a new process restores it, then deletes it): a move or
        # spill by exit that did not complete, holding the job's work; kept unless the job was killed or finished
        # anyway. What a writer cut short left of it or of a snapshot (a checkpoint request) goes.
        ckpt = self.rundir.checkpoint_file(job.id, job.uid)
        kept = not (job.kill_requested or state == "exited")
        self.rundir.discard(ckpt, partials_only=kept)
        self.rundir.discard(self.rundir.checkpoint_file(job.id + ".snapshot", job.uid), partials_only=True)
        if kept and os.path.exists(ckpt) and ckpt not in detail:
            detail += f"; its state at its last move is kept in {ckpt}"
        self.rundir.discard(self.rundir.spill_file(job.id, job.uid))   # its host copy, spilled: nothing reads it
        self.sup.end_leftovers(job)
        if job.managed:
            with self.faults.guard("bounding a job's log", job.id):    # (what it wrote since the last look)
                self.log_bounds.hold(job.id, self.rundir.log_file(job.id), True)
        job.state, job.exit_status, job.detail, job.host_bytes, job.disk_bytes = state, status, detail, 0, 0
        job.ended = time.time()
        self.commands.ended(job, f"{state}: {detail}")
        self.admission.dequeue(job.id)
        self.store.save(job)
        where = ("it held no GPU" if job.gpu is None and not job.exclusive_gpus else
                 f"GPUs {','.join(map(str, job.exclusive_gpus))} are free" if len(job.exclusive_gpus) > 1 else
                 f"GPU {job.gpu} is free" if job.exclusive else f"its share of GPU {job.gpu} is free")
        self.decide(job.gpu, "end", [job.id], {"state": state, "status": status, "step": job.step},
                    f"{job.id} {state}: {detail}; {where}")
        if job.gang and state != "exited" and not job.kill_requested:
            # Its peers would wait in their next collective for a rank that is gone: end the gang with it.
            peers, why = gang_members(self.jobs, job.gang["id"]), f"rank {job.gang['rank']} of its gang {state}"
            if peers:
                self.decide(job.gpu, "gang", [p.id for p in peers], {"gang": job.gang["id"], "rank": job.gang["rank"]},
                            f"{why} ({job.gang['id']}, {job.id}): killing its peers {', '.join(p.id for p in peers)}")
            for p, end in zip(peers, self.sup.kill_together(peers)):
                if end == "killed":     # (reaped later: said killed for this, not lost to a signal from outside gmux)
                    p.kill_requested, p.kill_reason = True, why
                elif end == "ended" and (own := self.sup.ended(p)) is not None:
                    self.finish(p, *own)    # (ended already, on its own account: that end is its own, told as it was)
                # ("ending", or "ended" but not yet to be reaped: a killed process whose first thread has exited
                # while its others still close what it held, as its own end once it is reaped)

    def sync_accounting(self, now: float) -> None:
        for slicer in self.slicers.values():
            for job_id in slicer.entries:
                self.jobs[job_id].gpu_seconds = slicer.used(job_id, now)

    # --- the tick: reap, decide, send ---
    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_reap >= REAP_EVERY_S:
            self._last_reap = now
            self.rundir.beat()      # (a cluster job's lease watch stops it when gmuxd stops serving)
            for job in list(self.jobs.values()):
                if not job.final and job.pid:
                    with self.faults.guard("reaping a job", job.id):
                        ended = self.sup.ended(job)
                        if ended is not None:
                            self.finish(job, *ended)
            with self.faults.guard("reaping other processes"):
                self.sup.reap_others({j.pid for j in self.jobs.values() if not j.final and j.pid})
            with self.faults.guard("expiring commands"):
                self.commands.expire(now)
            for gpu, slicer in self.slicers.items():
                with self.faults.guard(f"GPU {gpu}: jobs stopped from outside"):
                    self.stops.check_frozen(slicer, now)
            with self.faults.guard("forgetting ended jobs"):
                self.forget_ended()
        self._bound_logs(now)
        with self.faults.guard("admission"):
            self.admission.run(now)
        with self.faults.guard("failed resumes"):
            self.resume_retries.run(now)
        with self.faults.guard("moves"):
            self.moves.poll(now)
        for gpu, slicer in self.slicers.items():
            with self.faults.guard(f"GPU {gpu}"):
                self._tick_gpu(gpu, slicer, now)
        with self.faults.guard("parking held jobs"):
            self.admission.park_held(now)
        with self.faults.guard("the jobs' states"):
            self.show_states()
        with self.faults.guard("saving the job table"):
            self._flush()
        if self.metrics:
            with self.faults.guard("metrics"):
                self.metrics.update()

    def _tick_gpu(self, gpu: int, slicer: Slicer, now: float) -> None:
        # A pack is tried only on solo rates measured over at least two residencies (one can be disturbed,
        # and a disturbed solo rate reads low, which makes any pack look like a gain).
        rates = {j: Rates(self.jobs[j].rate_solo if self.jobs[j].solo_windows >= 2 else None,
                          self.jobs[j].rate_now, self.jobs[j].window_span(), self.jobs[j].solo_seen)
                 for j in slicer.entries}
        for d in self.packers[gpu].step(slicer, rates, now):
            self.decide(gpu, d.kind, d.jobs, d.numbers, d.text)
            if d.kind == "recheck":
                for j in d.jobs:
                    self.jobs[j].forget_solo()
        self.moves.expire(slicer, now)
        self.switch(slicer, now)
        self._spill(slicer)

    def _spill(self, slicer: Slicer) -> None:
        """Carries out the spill policy's decision for this GPU's jobs (see gmux.node.spill)."""
        candidates = [spill.Candidate(j.id, j.host_bytes, j.started, bool(j.gang), j.spill_refused,
                                      j.id in slicer.resident or bool(slicer.busy_with(j.id)), j.migratable)
                      for j in (self.jobs[i] for i in slicer.entries)]
        decision = spill.choose(self.host_held(), self.opt.host_budget, candidates)
        if decision is None:
            return
        job = self.jobs[decision.job]
        job.spilled = True
        slicer.mark_busy(job.id, decision.command)
        if decision.command == "migrate":
            job.target_gpu = job.gpu    # it comes back, from its checkpoint, to the GPU it left
            self.commands.send(job, "migrate", {"path": self.rundir.checkpoint_file(job.id, job.uid), "spill": True})
        else:
            self.commands.send(job, "spill", {"path": self.rundir.spill_file(job.id, job.uid)})
        self.decide(slicer.gpu, "spill", [job.id], decision.numbers, decision.text)

    def show_states(self) -> None:
        """Each job's state as users see it, from where its GPU's slicer stands."""
        for slicer in self.slicers.values():
            stopped = set(slicer.stopped())
            for job_id in slicer.entries:
                job = self.jobs[job_id]
                self.stops.note(slicer, job, time.monotonic())
                busy = slicer.busy_with(job_id)
                if job_id in stopped:
                    job.state = "stopped"    # by gmuxd out of its turn, or by someone else: its note says which
                elif busy and slicer.continued(job_id, starting=not job.started):
                    job.state = "running"    # overdue, continued for its turn: its command waits at its boundary
                elif busy:
                    job.state = _BUSY_STATE.get(busy, job.state)
                elif job_id in slicer.resident and not slicer.is_kept(job_id):
                    job.state = "running"
                elif job.held:
                    job.state = "held"
                else:
                    job.state = "suspended" if job.started else "waiting"

    def _flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_flush >= FLUSH_EVERY_S:
            self._last_flush = now
            if self.socket_id is not None and self.rundir.socket_id() != self.socket_id:
                self.socket_id = None    # (said once; and at its end it leaves the path to whoever has it now)
                log.error("%s is no longer this gmuxd's socket (its runtime directory removed?): no gmux command "
                          "reaches it, its jobs still do. Stop it (kill -TERM %d): its jobs run on, and a gmuxd "
                          "serving %s adopts them", self.rundir.socket, os.getpid(), self.rundir.root)
            self.sync_accounting(now)
            self.store.save_many(j for j in self.jobs.values() if not j.final)

