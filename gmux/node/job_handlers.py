"""gmuxd's handlers for what jobs say about themselves: register, report, heartbeat, result, bye.

A job proves who it is with the token it got at registration, and can act only on itself. Under a system
daemon it must also be its owner's process (the kernel's uid for the peer), and a process registers only itself
(the kernel's pid for the peer), since gmuxd, as root, will signal the pid it registers. Its reports feed
the measurements (rates, memory at the boundary and at peak) that the slicer and the packer decide on; its
results acknowledge commands (the slicer's switches, migrations, spills, checkpoints) and wake the requests
waiting for them. Each handler takes a gmux.wire.server.Request and returns the reply's data.
"""
from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import time
from typing import TYPE_CHECKING, Optional

from gmux import protocol
from gmux.node.access import user_name
from gmux.node.adoption import adopt
from gmux.node.jobs import Job, gang_members
from gmux.rundir import proc_starttime
from gmux.util.sizes import format_size
from gmux.wire.server import Refused, Request, UnknownJob

if TYPE_CHECKING:
    from gmux.node.daemon import Daemon

log = logging.getLogger("gmux.daemon")

SOLO_MIN_SPAN_S = 1.5   # a solo rate needs at least this much measured residency


class JobHandlers:
    def __init__(self, node: "Daemon"):
        self.node = node

    def table(self) -> dict:
        return {"register": self.register, "report": self.report, "heartbeat": self.heartbeat,
                "result": self.result, "bye": self.bye}

    def _job(self, req: Request) -> Job:
        """The job the message is from, proven by its token."""
        msg = req.msg
        job = self.node.jobs.get(msg["job"])
        if job is None:
            raise UnknownJob(f"{msg.type}: unknown job {msg['job']!r} (a job can only act on itself; gmuxd's table "
                             f"may have been lost, and the job may register again to be adopted)")
        if not hmac.compare_digest(job.token, msg["token"]) or not self._owners(req, job):
            raise Refused(f"{msg.type}: unknown job {msg['job']!r} or wrong token (a job can only act on itself)")
        self.node.commands.heard_from(job, req.identity)
        return job

    def _owners(self, req: Request, job: Job) -> bool:
        """Whether a message with the job's token comes from its owner (always, in a per-user daemon): a token
        that leaked to another user is worth nothing to them."""
        return self.node.access.system is None or (req.caller is not None and req.caller.uid == job.uid)

    def register(self, req: Request):
        node, msg, now = self.node, req.msg, time.monotonic()
        who, system = req.caller, node.access.system is not None
        if msg["pid"] <= 1 or msg["pid"] == os.getpid():
            raise Refused(f"register: pid {msg['pid']} cannot be a job")
        if system and msg["pid"] != who.pid:
            raise Refused(f"register: pid {msg['pid']} is not the registering process (pid {who.pid}); a process "
                          f"registers itself as a job (gmux-launch does)")
        came_from = None
        if msg.get("job") and msg.get("adopt") and msg["job"] not in node.jobs:
            node.access.served(msg, who)
            job = adopt(node, req)
            log.info("adopted %s on GPU %s (pid %d)", job.id, job.gpu, job.pid)
            return self._registered(job)
        if msg.get("job") and msg.get("adopt") in ("running", "suspended"):
            # adopted already, at an earlier "unknown" reply that crossed the adoption (a job that says it is
            # waiting, a new process back from a move or one gmuxd started, registers as usual below)
            job = node.jobs[msg["job"]]
            if not (msg.get("token") and hmac.compare_digest(job.token, msg["token"]) and self._owners(req, job)
                    and job.pid == msg["pid"] and not job.final):
                raise Refused(f"register: job {job.id} is another process's")
            return self._registered(job)
        if msg.get("job"):
            job = node.jobs.get(msg["job"])
            if (job is None or not msg.get("token") or not hmac.compare_digest(job.token, msg["token"])
                    or not self._owners(req, job)):
                raise Refused(f"register: unknown job {msg['job']!r} or wrong token")
            if job.final:
                raise Refused(f"register: job {job.id} has ended ({job.state}: {job.detail})")
            # A migrated (or spilled) job's process, back from re-executing itself. Its migrate result may
            # still be on the way (another connection): the migration is complete either way, and is counted
            # here (its result, arriving later, finds no command in flight and is ignored).
            job.migrations += node.commands.forget(job.id).count("migrate")
            # (a submitted job's process registers first, also when a restarted gmuxd re-attached it before it did)
            came_from = job.gpu if job.registered and job.started else None
            node.leave_gpu(job, now)
            node.commands.wake(job.id, "migrate", True, 0.0)
            job.outbox.clear()
            job.gpu = job.target_gpu if job.target_gpu is not None else job.gpu
            job.target_gpu = None
        else:
            node.access.served(msg, who)        # (a new job: one of a user the daemon still serves)
            gang = msg.get("gang")
            for field, chosen in (("name", msg.get("name")), ("gang: id", gang and gang["id"])):
                problem = chosen and protocol.job_name_problem(chosen)
                if problem:
                    raise Refused(f"register: {field}: {problem}")
            others = [m for m in gang_members(node.jobs, gang["id"]) if m.uid != who.uid] if system and gang else []
            if others:    # ranks of one gang are suspended and killed together: never across users
                raise Refused(f"register: gang {gang['id']} is {user_name(others[0].uid)}'s; choose another "
                              f"--gang name")
            if system:
                began = proc_starttime(who.pid)
                twin = next((j for j in node.jobs.values() if not j.final and j.pid == who.pid
                             and j.starttime == began), None)
                if twin is not None:    # (each of a hundred claims took a GPU's turn)
                    raise Refused(f"register: process {who.pid} is job {twin.id} already; a process is one job")
                node.user_dir(who)
            job = Job(node.store.next_job_id(), secrets.token_hex(16), msg.get("name") or "",
                      list(msg["argv"]), msg.get("cwd", ""), weight=float(msg.get("weight", 1.0)), mem=msg.get("mem"))
            job.uid, job.gid = (who.uid, who.gid) if who is not None else (os.getuid(), os.getgid())
            job.gpus_wanted, job.gang, job.pinned = msg.get("gpus", 1), msg.get("gang"), msg.get("gpu")
            try:
                node.admission.admit(job, "register")
            except Refused:
                node.store.unused(job.id)
                raise
            node.add_job(job)
        # (a system daemon takes the start time from the kernel, as it took the pid)
        job.pid, job.starttime = msg["pid"], proc_starttime(msg["pid"]) if system else msg.get("starttime")
        job.migratable = bool(msg.get("migratable", False))
        job.hook = not job.migratable      # gmux-launch registers movable exactly when it runs with --no-hook
        job.agrees = bool(msg.get("agrees", False))
        job.identity = req.identity
        job.registered = True
        job.state, job.started, job.detail = "waiting", False, ""
        if came_from is not None:
            how = (f"migrated from GPU {came_from} to GPU {job.gpu}" if came_from != job.gpu else
                   f"back from disk for GPU {job.gpu}")
            # (gmux-launch re-executes itself: a fresh interpreter, often under the same pid)
            job.detail = f"{how} in a new process (a fresh interpreter, pid {job.pid}), from its checkpoint" + \
                ("; it runs at its turn" if came_from == job.gpu else "")
            node.decide(job.gpu, "arrived", [job.id], {"from": came_from, "to": job.gpu, "path": "new process",
                                                       "pid": job.pid}, f"{job.id} {job.detail}")
        job._step_offset = None   # a new process counts boundaries from 0
        job.boundaries, job.stopped_by_gmux = 0, False
        job.host_bytes = 0        # a new process holds no suspended state
        job.start_window()
        if job.gpu is None:
            node.admission.enqueue(job)
            if job.gang and any(m.held for m in gang_members(node.jobs, job.gang["id"])):
                job.held, job.state = True, "held"     # its gang was suspended before it registered: so is it
        else:
            node.seat(job, now)
        node.store.save(job)
        log.info("admitted %s on GPU %s (weight %g, mem %s)", job.id, job.gpu, job.weight,
                 format_size(job.working_set()))
        # mem: the declared memory the job was admitted with, which its runtime enforces as its limit (a
        # submitted job's process learns it, and its name, here: gmux submit --mem is not on its command line)
        return self._registered(job)

    def _registered(self, job: Job) -> dict:
        return {"job": job.id, "token": job.token, "gpu": job.gpu, "mem": job.mem, "name": job.name,
                "weight": job.weight, "env": self.node.env(job) if job.gpu is not None else {}}

    def report(self, req: Request):
        job, msg = self._job(req), req.msg
        r = msg["report"]
        job.last_report = r
        if r.get("control") == "framework" and isinstance(r.get("movable"), bool):
            # A framework job (gmux/job/frameworks) knows whether it can continue exactly in a new process only
            # once its Trainer has started; until then it registered as transparent (not movable).
            job.migratable = r["movable"]
        elif r.get("control") == "explicit" and isinstance(r.get("movable"), bool):
            # One that attached itself may stop being movable (an optimizer it trains with that attach() was not
            # given: gmux.job.strays), and be again; one started under the hook never is.
            job.migratable = r["movable"] and not job.hook
        if isinstance(r.get("step"), int):
            job.step = r["step"]
            job.count(msg.get("boundaries"), r["step"])
        slicer = self.node.slicers.get(job.gpu)
        if not job.started and job.boundaries > 0 and (slicer is None or slicer.busy_with(job.id) != "resume"):
            # It has run, whatever the table says: a gmuxd restarted before the start's acknowledgement came (or
            # was written) re-attached it as never started. (While its first resume awaits that acknowledgement,
            # the acknowledgement says it, and the wait is its start-up, not a resume's cost.)
            job.started = True
        if isinstance(r.get("mem_boundary"), int):
            job.mem_boundary = r["mem_boundary"]
        if isinstance(r.get("mem_peak"), int):
            # A report's peak is since the report before: a phase that needs more (an evaluation with larger
            # batches) comes again, so what the slicer and packer admit by must not shrink between its runs.
            job.mem_peak = max(job.mem_peak or 0, r["mem_peak"])
        self._observe_state(job, msg.get("state"), msg.get("boundaries"))
        if slicer is not None and job.id in slicer.resident and not slicer.busy_with(job.id):
            if slicer.entries.get(job.id) and slicer.entries[job.id].mem != job.working_set():
                for pack in slicer.set_mem(job.id, job.working_set()):
                    self.node.decide(job.gpu, "unpack", sorted(pack), {"mem": job.working_set()},
                                     f"GPU {job.gpu}: {'+'.join(sorted(pack))} no longer fit in memory: unpacked")
        return None

    def heartbeat(self, req: Request):
        job, msg = self._job(req), req.msg
        job.count(msg.get("boundaries"))
        self._observe_state(job, msg["state"], msg.get("boundaries"))
        slicer = self.node.slicers.get(job.gpu)
        if (msg.get("boundaries") is not None and msg.get("t") is not None and slicer is not None
                and slicer.computing(job.id) and not slicer.busy_with(job.id)):
            job.sample(float(msg["t"]), msg["boundaries"])
            # A solo rate is a rate measured while nothing else held the GPU.
            if slicer.resident == {job.id} and job.window_span() >= min(SOLO_MIN_SPAN_S, 0.6 * slicer.quantum):
                job.solo_measured(job.window_rate())
        return None

    def _observe_state(self, job: Job, state: Optional[str], boundaries: Optional[int] = None) -> None:
        slicer = self.node.slicers.get(job.gpu)
        if slicer is None:
            return
        # Its mini-batch time, which sets its suspend deadline and the length of its turn (gmux.node.pacing)
        slicer.passed(job.id, boundaries, time.monotonic())
        if state:
            slicer.observed(job.id, state, time.monotonic())

    def result(self, req: Request):
        node, msg = self.node, req.msg
        job = self._job(req)
        starting = job.boundaries == 0      # (a suspend taken now is taken at its first boundary)
        job.count(msg.get("boundaries"))
        self._observe_state(job, None, msg.get("boundaries"))
        answered = node.commands.answered(msg["cmd"], job.id)
        if answered is None:
            return None     # an answer to a command of a previous daemon, or a repeat: nothing waits for it
        kind, sent = answered
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
        node.commands.wake(job.id, kind, ok, latency, result.get("error"), waited, result.get("step"),
                           result.get("warning"), first_boundary=starting)
        slicer = node.slicers.get(job.gpu)
        # the suspend of a move in the job's own process (gmux.node.moves), not one of the slicer's switches
        moving = kind == "suspend" and slicer is not None and slicer.busy_with(job.id) == "move"
        if not ok:
            log.warning("%s: %s failed: %s", job.id, kind, result.get("error"))
            job.detail = f"{kind} failed: {result.get('error')}"
        if kind in ("suspend", "resume") and slicer is not None:
            slicer.acked(job.id, kind, now, ok, in_place=bool(result.get("in_place")))
            if kind == "resume" and not ok and job.started:
                node.resume_retries.failed(job, result.get("error"), now)    # (held, and tried again later)
            elif kind == "resume" and ok:
                node.resume_retries.succeeded(job)
            if ok:
                if kind == "suspend" or job.started:   # (a first resume waits for the job's start-up)
                    job.suspend_seconds += latency
                if kind == "suspend":
                    job.suspends += 1
                    job.host_bytes = int(result.get("bytes") or 0)
                else:
                    if not job.started and job.migrations:
                        # A new process acknowledges its start only once it has restored its checkpoint
                        # (gmux.job.launch): the file's work is done. (One that cannot be removed, on a read-only
                        # filesystem, must not fail the job's start.)
                        with contextlib.suppress(OSError):
                            os.unlink(node.rundir.checkpoint_file(job.id, job.uid))
                    first = not job.started
                    job.started, job.host_bytes, job.disk_bytes = True, 0, 0
                    job.start_window()
                    if first:
                        # Written now, not with the next flush: a gmuxd killed before it left the next one
                        # taking the job for one that never ran (a move of it was then mere bookkeeping).
                        node.store.save(job)
            if moving:
                node.moves.suspended(job, ok, result.get("error"), latency)
        elif kind == "spill":
            if slicer is not None:
                slicer.clear_busy(job.id)
            if ok:
                job.host_bytes, job.disk_bytes = 0, int(result.get("bytes") or 0) or job.disk_bytes
            else:
                job.spill_refused = True    # e.g. the allocator tier: asking again would fail again
        elif kind == "migrate":
            if slicer is not None:
                slicer.clear_busy(job.id)
            if ok:
                node.leave_gpu(job, now)
                job.state, job.migrations, job.host_bytes, job.disk_bytes = "migrating", job.migrations + 1, 0, 0
                if job.target_gpu is not None and job.target_gpu != job.gpu:
                    job.detail = f"moving to GPU {job.target_gpu} in a new process: checkpointed, being restored"
                node.store.save(job)
            else:
                # A spill by checkpoint and exit that failed (a full disk): the job stays suspended here, in host
                # memory; asked again, it would write the same bytes to fail again. A move the job refused (a
                # state no checkpoint holds: a CSR tensor) leaves it running here, free to be moved later.
                job.spill_refused = job.spill_refused or job.target_gpu == job.gpu
                job.target_gpu = None
        node.show_states()     # the requester's next question may come before the next tick (a held job: "held")
        return None

    def bye(self, req: Request):
        job, msg = self._job(req), req.msg
        state = "exited" if msg["status"] == 0 else "failed"
        detail = msg.get("reason") or ("finished" if state == "exited" else f"exit status {msg['status']}")
        self.node.finish(job, state, msg["status"], detail)
        return None
