"""gmuxd's handlers for its administrators (the CLI, the cluster link): ping, ps, suspend, resume, kill,
migrate, checkpoint, logs, submit, decisions, shutdown.

Who asks is decided by gmux.node.access: in a per-user daemon, the admin token every request but ping carries
(only the user running gmuxd can read it); in a system daemon, the uid the kernel gives for the peer, which may act
on its own jobs (an admin's on all). A refusal says why and what to do instead. Requests that wait for jobs to act
(suspend of a running job, migrate, checkpoint) are answered once the jobs acknowledge (Commands.defer). Each
handler takes a gmux.wire.server.Request and returns the reply's data.
"""
from __future__ import annotations

import os
import secrets
import signal
import time
from typing import TYPE_CHECKING, Optional

from gmux import protocol
from gmux.node.access import user_name
from gmux.node.deleted_log import read_deleted
from gmux.node.inventory import gpu_list
from gmux.node.jobs import Job, gang_members, unit_of
from gmux.node.resume_retry import release
from gmux.node.supervisor import CannotStart
from gmux.node.waiting import waiting_detail
from gmux.rundir import proc_starttime
from gmux.util.job_command import interpreter_options
from gmux.util.rendezvous import free_port, rendezvous_env
from gmux.util.text import file_end, text_of
from gmux.wire.server import Busy, Caller, Refused, Request

if TYPE_CHECKING:
    from gmux.node.daemon import Daemon


PS_LIMIT = 100     # jobs a `ps` lists unless asked for another number: the live ones first, then the newest ended
KILL_REAP_WAIT_S = 1.0   # how long a kill waits for its SIGKILLed processes to be reaped before it answers


def _unrestorable(job: Job, unit: list) -> Optional[str]:
    """Why a checkpoint taken now would not continue the job, every rank of a gang (`unit`), exactly in a new
    process: the first rank's reason, naming it (None: it would)."""
    for m in unit:
        if m.migratable and m.started:
            continue
        who = f"gang {job.gang['id']}'s rank {m.gang['rank']} ({m.id})" if job.gang else m.id
        return f"{who} " + ("has not started" if m.migratable else
                            f"would not be restored exactly from one now: {m.unmovable()}" if m.unmovable() else
                            "runs in transparent mode (run it with gmux-launch --no-hook and attach())")
    return None


def _unnamed_gang(jobs: dict, first: str, ranks: int) -> str:
    """gang-jN, after its first rank jN, unless a live job has that name or one of its ranks' (a job the user
    named gang-j5 earlier: `gmux suspend gang-j5` then found both and acted on neither): gang-jN.2, .3, ..."""
    taken = {n for j in jobs.values() if not j.final for n in (j.name, (j.gang or {}).get("id"))}
    k = 1
    while True:
        gang = f"gang-{first}" + (f".{k}" if k > 1 else "")
        if gang not in taken and not any(f"{gang}-{r}" in taken for r in range(ranks)):
            return gang
        k += 1


def _refuse_names_taken(jobs: dict, uid: int, names: list) -> None:
    """A name picks a job out (gmux suspend NAME), and a gang's id picks out its ranks: a new job of the same
    user's under a name a live job or gang of theirs has would make that name pick neither (a job named gang-j5
    beside gang gang-j5), and a submit sent again after a timeout would run the script twice."""
    for j in sorted((j for j in jobs.values() if not j.final and j.uid == uid), key=lambda j: j.created):
        gang = (j.gang or {}).get("id")
        if j.name in names:
            raise Refused(f"submit: your job {j.id} named {j.name!r} has not ended ({j.state}); choose another --name")
        if gang in names:
            raise Refused(f"submit: your gang {gang!r} has not ended (its rank {j.gang['rank']} is {j.id}, "
                          f"{j.state}); choose another --name")


class AdminHandlers:
    def __init__(self, node: "Daemon"):
        self.node = node

    def table(self) -> dict:
        return {"ping": self.ping, "ps": self.ps, "suspend": self.suspend, "resume": self.resume,
                "kill": self.kill, "migrate": self.migrate, "checkpoint": self.checkpoint, "logs": self.logs,
                "submit": self.submit, "decisions": self.decisions, "shutdown": self.shutdown}

    # --- who may ask, about which job ---
    def _who(self, req: Request) -> Caller:
        return self.node.access.caller(req)

    def _target(self, req: Request) -> Job:
        """The live job the request names (with every rank of its gang, the caller's to act on)."""
        job = self._target_any(req)
        if job.final:
            raise Refused(f"{req.msg.type}: job {job.id} has ended ({job.state}: {job.detail})")
        return job

    def _target_any(self, req: Request) -> Job:
        """The job the request names, live or ended, if the caller may act on it (checked before anything)."""
        msg = req.msg
        who = self._who(req)
        job = self.node.jobs.get(msg["job"]) or self._named(msg, who)
        if job is None:
            ended = self._ended_named(msg["job"], who) if msg.type != "logs" else None
            if ended is not None:    # (as the job's id would say: not "no job")
                raise Refused(f"{msg.type}: job {ended.id} named {msg['job']!r} has ended ({ended.state}: "
                              f"{ended.detail}); no live job has that name")
            raise Refused(f"{msg.type}: no job {msg['job']!r} (an id, or the name of a live job" +
                          ("; for logs, of a submitted one that ended" if msg.type == "logs" else "") +
                          "); `gmux ps` lists the jobs")
        self.node.access.check(msg, who, [job] + ([] if job.final else unit_of(self.node.jobs, job)))
        return job

    def _ended_named(self, key: str, who: Caller) -> Optional[Job]:
        """The newest ended job of the caller's (any, to an admin) with that name, or of the gang of that name."""
        admin = self.node.access.is_admin(who)
        ended = [j for j in self.node.jobs.values() if j.final and key in (j.name, (j.gang or {}).get("id"))
                 and (admin or j.uid == who.uid)]
        return max(ended, key=lambda j: j.created) if ended else None

    def _named(self, msg, who: Caller) -> Optional[Job]:
        """The one live job of the caller's (any, to an admin) that has the name given for a job id, or a rank of
        the gang of that name; refused if several jobs have it. Ended jobs are named by id only (a name comes back
        with each run of a script), but for their logs: the newest run of that name's (a gang's: its rank 0)."""
        admin = self.node.access.is_admin(who)
        key = msg["job"]
        named = sorted((j for j in self.node.jobs.values() if not j.final and key in (j.name, (j.gang or {}).get("id"))
                        and (admin or j.uid == who.uid)), key=lambda j: j.id)
        if len(named) > 1 and named[0].gang and len({j.gang["id"] if j.gang else None for j in named}) == 1:
            return min(named, key=lambda j: j.gang["rank"])    # the ranks of one gang: acting on one acts on all
        if len(named) > 1:
            raise Refused(f"{msg.type}: {len(named)} live jobs are named {key!r} "
                          f"({', '.join(j.id for j in named)}): give one of their ids")
        if named or msg.type != "logs":
            return named[0] if named else None
        ended = [j for j in self.node.jobs.values() if j.final and key in (j.name, (j.gang or {}).get("id"))
                 and (admin or j.uid == who.uid)]   # (logs of a run that ended: its newest submitted one's; with
        ended = [j for j in ended if j.managed] or ended    # none, a gmux-launch one's, refused as such, not "no job")
        newest = max(ended, key=lambda j: j.created) if ended else None
        if newest is not None and newest.gang:      # (of a gang's, its newest run's first rank)
            return max((j for j in ended if j.gang and j.gang["id"] == newest.gang["id"] and j.gang["rank"] == 0),
                       key=lambda j: j.created, default=newest)
        return newest

    # --- the handlers ---
    def ping(self, req: Request):
        return {"version": protocol.VERSION, "pid": os.getpid(), "uptime": time.time() - self.node.started,
                "gpus": len(self.node.gpus), "internal_errors": self.node.internal_errors}

    def ps(self, req: Request):
        """Every job to an admin (and in a per-user daemon); to another user of a system daemon, their own
        jobs, and of the others' only the ids the GPU table shows sharing their GPUs."""
        node, msg = self.node, req.msg
        who = self._who(req)
        mine = (lambda j: True) if node.access.is_admin(who) else (lambda j: j.uid == who.uid)
        now = time.monotonic()
        node.sync_accounting(now)
        live = [j for j in node.jobs.values() if not j.final and mine(j)]
        ended = sorted((j for j in node.jobs.values() if j.final and msg.get("all", True) and mine(j)),
                       key=lambda j: -(j.ended or j.created))
        limit = msg.get("limit") or PS_LIMIT
        shown = (live + ended)[:limit]
        jobs = [j.public() for j in sorted(shown, key=lambda j: (j.created, j.id))]
        for j in jobs:   # the slicer's weighted GPU time (stride scheduling keeps these within a quantum)
            j["user"] = user_name(j["uid"])
            entry = node.slicers[j["gpu"]].entries.get(j["id"]) if j["gpu"] in node.slicers else None
            j["vtime"] = entry.vtime(now) if entry else None
            # (`migrate` without --new-process: to any other GPU here, in its own process, restoring nothing)
            job = node.jobs[j["id"]]
            j["moves_in_process"] = (not job.final and not job.exclusive and not job.gang and len(node.gpus) > 1
                                     and node.admission.in_process(job))
        node.readings.refresh(now)
        gpus = []
        owner = {g: j.id for j in node.jobs.values() if not j.final for g in j.exclusive_gpus}
        for g in node.gpus.values():
            s = node.slicers[g.index]
            gpus.append({"index": g.index, "name": g.name, "virtual": g.virtual, "mem_total": g.mem_total,
                         "mem_used": g.mem_used,
                         "jobs": sorted(set(s.entries) | ({owner[g.index]} if g.index in owner else set())),
                         "resident": sorted(s.resident),
                         "packs": [sorted(p) for p in s.packs], "switches": s.switches,
                         # jobs keeping their memory here without computing (gmux.node.stopping), and how often
                         # jobs were stopped for missing a deadline
                         "stopped": s.stopped(), "stops": s.stops,
                         "owner": owner.get(g.index), "reserved": node.admission.reserved_for(g.index),
                         "resident_mem": sum(node.jobs[j].working_set() or 0 for j in s.resident)})
        by_index = {g["index"]: g for g in gpus}
        for j in jobs:
            if j["state"] == "waiting" and not j["detail"]:
                j["detail"] = waiting_detail(j, by_index.get(j["gpu"]))
        return {"jobs": jobs, "gpus": gpus, "decisions": self._visible(who, node.decisions, 20),
                "jobs_total": len(live) + len(ended), "jobs_shown": len(jobs),
                "daemon": {"pid": os.getpid(), "uptime": time.time() - node.started, "messages": node.messages,
                           "quantum": node.opt.quantum, "host_budget": node.opt.host_budget,
                           "host_held": node.host_held(), "store": node.store.failing,
                           "system": node.access.system is not None}}

    def _visible(self, who: Caller, decisions, limit: int) -> list:
        """The newest `limit` decisions the caller may read: an admin all; a user those about a job of theirs
        (a decision quotes what its jobs reported, e.g. an exit reason) and those about no job."""
        if self.node.access.is_admin(who):
            return list(decisions)[-limit:] if limit else list(decisions)
        jobs = self.node.jobs
        seen = [d for d in decisions if not d.get("jobs") or any(
            jobs[j].uid == who.uid for j in d["jobs"] if j in jobs)]
        return seen[-limit:] if limit else seen

    def suspend(self, req: Request):
        node, job = self.node, self._target(req)
        unit = unit_of(node.jobs, job)   # a gang's ranks suspend together (at one boundary: gmux.job.gang)
        # (`hook`, not `migratable`: a rank that attached itself and is unmovable for now, say an LR scheduler
        # attach() was not given, still agrees through its GangController; taken for transparent, its gang was
        # refused every suspend, a preemption's and a move's)
        hooked = [m.id for m in unit if job.gang and m.registered and m.hook and not m.migratable and not m.agrees]
        if hooked:
            # Each rank would stop at its own optimizer step while its peers wait in the next collective.
            raise Refused(f"suspend: gang {job.gang['id']} has ranks in transparent mode ({', '.join(hooked)}), "
                          f"which cannot agree on a boundary to stop at; run the ranks with --no-hook and "
                          f"gmux.job.gang.GangController to make the gang suspendable")
        why = _unrestorable(job, unit) if req.msg.get("for_move") else None
        if why:
            # (held first, the job stopped computing for a move that its checkpoint's refusal then undid)
            raise Refused(f"suspend: {job.id} is not moved: {why}; it runs on as it was")
        busy, frozen = [], []
        node.resume_retries.taken_over(unit, resumed=False)
        for m in unit:
            m.held = True
            if m.gpu is None:     # still queued (or parked): nothing runs, and it takes no GPU until resumed
                m.state = "held"
                if m.parked_gpus:
                    node.admission.dequeue(m.id)
                continue
            slicer = node.slicers[m.gpu]
            if m.id not in slicer.entries:    # its process has not registered yet: seated held, it never starts
                m.state = "held"
                continue
            slicer.hold(m.id, to_boundary=bool(req.msg.get("to_boundary")), in_place=bool(req.msg.get("in_place")),
                        stop_by=req.msg.get("deadline_s"))
            if slicer.entries[m.id].frozen:
                frozen.append(m.id)   # stopped from outside: nothing to wait for; once continued, it suspends
            elif (m.id in slicer.resident and not slicer.is_kept(m.id)) or slicer.busy_with(m.id) == "resume":
                busy.append(m.id)
        node.store.save_many(unit)    # (said held, it stays held through a gmuxd that dies a moment later)
        # Waiting before the switch below: it may already settle the request (a job that has not acknowledged
        # its start is stopped at once).
        reply = (node.commands.defer(busy, "suspend", req, job.id) if busy else
                 {"job": job.id, "state": "held", "latency_s": 0.0, "jobs": [m.id for m in unit],
                  **({"detail": f"{', '.join(frozen)} stopped from outside gmux (SIGSTOP, Ctrl-Z): held, it suspends "
                                f"at its next boundary once continued (SIGCONT)"} if frozen else {})})
        # The command leaves now, not after the rest of this batch of messages and the tick's other work: the
        # job sees it at its next boundary, and each boundary missed costs the requester a whole mini-batch.
        for gpu in {m.gpu for m in unit if m.gpu is not None}:
            node.switch(node.slicers[gpu], time.monotonic())
        for m in unit:
            if m.id in busy:
                node.stops.answer_late(node.slicers[m.gpu], m, time.monotonic())
        return reply

    def resume(self, req: Request):
        node, job = self.node, self._target(req)
        unit = unit_of(node.jobs, job)
        node.resume_retries.taken_over(unit, resumed=True)
        release(node, unit, time.monotonic())
        node.store.save_many(unit)    # (said runnable, it is not held again by a gmuxd that dies a moment later)
        parked = sorted({g for m in unit for g in m.parked_gpus})     # (every rank's, not the named one's)
        # (every GPU of a gang's or a multi-GPU job's: a gang on GPUs 0 and 1 was said to run "on GPU 0")
        on = sorted({g for m in unit for g in (m.exclusive_gpus or [m.gpu]) if g is not None})
        where = (f"runs in its turn on GPU{'s' if len(on) > 1 else ''} {', '.join(map(str, on))}"
                 if job.gpu is not None and on else
                 f"takes back GPU{'s' if len(parked) > 1 else ''} {','.join(map(str, parked))} (given back while "
                 f"suspended) once {'they are' if len(parked) > 1 else 'it is'} free"
                 if parked else "waits for a GPU")
        return {"job": job.id, "state": f"runnable: {where}", "jobs": [m.id for m in unit]}

    def kill(self, req: Request):
        node, job = self.node, self._target(req)
        unit = unit_of(node.jobs, job)
        for m in unit:
            m.kill_requested, m.kill_reason = True, req.msg.get("reason") or "killed by gmux kill"
        for m, end in zip(unit, node.sup.kill_together(unit)):
            if end == "ended":      # (one "ending" is reaped as it ends: killed, or its own failure)
                node.finish(m, "killed", None, m.kill_reason)
        # Answered once they have ended, not at the next reap: a name they held is then free (gmux kill k; gmux
        # submit --name k was refused "your gang 'k' has not ended"). Only gmuxd's own children: another's process
        # stays a zombie until its parent reaps it. One the kernel is slow to tear down (a large address space) is
        # reaped by the tick as before: the daemon serves no one while it waits here.
        deadline = time.monotonic() + KILL_REAP_WAIT_S
        while (left := [m for m in unit if not m.final and m.pid in node.sup.children]) and \
                time.monotonic() < deadline:
            for m in left:
                if (own := node.sup.ended(m)) is not None:
                    node.finish(m, *own)
            if any(not m.final for m in left):
                time.sleep(0.002)
        return {"job": job.id, "signal": "SIGKILL", "jobs": [m.id for m in unit]}

    def migrate(self, req: Request):
        node, job = self.node, self._target(req)
        gpu = req.msg["gpu"]
        if gpu not in node.gpus:
            raise Refused(f"migrate: no GPU {gpu}; this machine has {gpu_list(node.gpus)}")
        if job.gang:
            raise Refused(f"migrate: {job.id} is rank {job.gang['rank']} of gang {job.gang['id']}: moving a rank "
                          f"means rebuilding the ranks' process group on the new GPU, which gmuxd does not do; "
                          f"kill the gang and start it again to place it anew")
        if job.exclusive:
            held = (f"holds GPUs {','.join(map(str, job.exclusive_gpus))} to itself" if job.exclusive_gpus else
                    "holds none now")
            raise Refused(f"migrate: {job.id} runs on {job.gpus_wanted} GPUs (it {held}); gmux migrate moves "
                          f"single-GPU jobs")
        if job.gpu is None:
            raise Refused(f"migrate: {job.id} waits for a GPU and has none to move from")
        if job.target_gpu is not None:
            # (its old process has checkpointed and left the GPU: a second move sent it a command it never took,
            # and held a GPU that no longer knew the job, which then ran no job again)
            where = (f"on its way to GPU {job.target_gpu} in a new process" if job.target_gpu != job.gpu else
                     "being restored from disk by a new process")
            raise Busy(f"migrate: {job.id} is {where}; move it once it has arrived (gmux ps shows it running)")
        if gpu == job.gpu:
            raise Refused(f"migrate: {job.id} is already on GPU {gpu}")
        why = node.admission.move_refusal(job, gpu)
        if why is not None:
            raise Refused(f"migrate: {why}")
        new_process = bool(req.msg.get("new_process"))
        if job.started and not node.moves.applies(job, gpu, new_process):
            # A new process must restore the job: only a job that attached itself can be.
            unmovable = job.unmovable()
            if not job.migratable and unmovable:
                what = ("trains with a framework whose resume would not be exact here" if
                        (job.last_report or {}).get("control") == "framework" else "would not continue exactly")
                raise Refused(f"migrate: {job.id} {what} in a new process: {unmovable}; it is not moved, and stays "
                              f"on GPU {job.gpu}, where gmux suspends and resumes it like any other job")
            if not job.migratable:
                # (a script that attaches itself under the hook still runs as it was started: unmovable)
                attached = (job.last_report or {}).get("control") == "explicit"
                raise Refused(f"migrate: {job.id} " + (
                              "calls gmux.job.attach(), but was started with the transparent hook, which does not "
                              "restore a moved job's state; start it with --no-hook (gmux submit --no-hook, "
                              "gmux-launch --no-hook) to make it movable" if attached else
                              "runs an unmodified script (transparent mode), whose data position cannot be "
                              "restored in a new process; make it call gmux.job.attach() (which restores a moved "
                              "job's state) and start it with --no-hook (gmux submit --no-hook, gmux-launch "
                              "--no-hook) to make it movable") +
                              (" (a move in its own process restores nothing: leave out --new-process)"
                               if node.moves.applies(job, gpu) else
                               f" (nor can it move in its own process: {node.moves.refusal(job, gpu)})"))
        return node.migrate(job, gpu, req, new_process)

    def checkpoint(self, req: Request):
        """The job writes its state to checkpoints/JOB.snapshot.ckpt at its next boundary (or at once from its
        host copy if suspended) and goes on; the reply waits for that (cluster mode reads the file)."""
        node, job = self.node, self._target(req)
        # Every rank of a gang is judged before any is asked: a gang's ranks carry a checkpoint out only once all
        # hold one (gmux.job.gang), and the peers of a rank refused here kept theirs for good, so that no later
        # suspend of the gang (a kind they did not hold first) was ever agreed on.
        why = _unrestorable(job, unit_of(node.jobs, job))
        if why:
            raise Refused(f"checkpoint: {why}")
        slicer = node.slicers.get(job.gpu)
        busy = slicer.busy_with(job.id) if slicer is not None else None
        if busy:
            raise Busy(f"checkpoint: {job.id} is busy with a {busy}; try again in a moment")
        holds = req.msg.get("holds")
        node.commands.send(job, "checkpoint", {"path": node.rundir.checkpoint_file(job.id + ".snapshot", job.uid),
                                               **({"holds": holds} if holds else {})})
        return node.commands.defer(job.id, "checkpoint", req)

    def logs(self, req: Request):
        job = self._target_any(req)
        if not job.managed:
            raise Refused(f"logs: {job.id} was started with gmux-launch; its output goes to the terminal that "
                          f"started it (gmux submit captures logs)")
        # Cut by bytes (a reply must fit a message, whatever characters the job printed), from the file's end.
        path = self.node.rundir.log_file(job.id)
        cut = (protocol.LOGS_REPLY_BYTES, req.msg.get("tail") or 0)
        note, (data, before) = "", file_end(path, *cut)
        if not data and not os.path.exists(path):
            held = None if job.final or not job.pid else read_deleted(job.pid, path, *cut)
            note = (f"[gmuxd: {path} was deleted while {job.id} ran; shown from the file it still writes to, which "
                    f"goes when it ends]\n" if held is not None else f"[gmuxd: {path} was deleted]\n")
            data, before = held or (b"", 0)
        # left_out: the log's bytes before what one reply holds, counted here (the client may not read the file)
        if req.msg.get("raw"):     # (the note apart: the bytes are the log's alone, and the client says it)
            return {"job": job.id, "bytes": data, "left_out": before, **({"note": note} if note else {})}
        return {"job": job.id, "text": note + text_of(data), "left_out": before}

    def submit(self, req: Request):
        node, msg = self.node, req.msg
        who = self._who(req)
        try:
            interpreter_options(msg["argv"])     # (python -c, -i, -W with no value: the CLI refuses them; any client)
        except ValueError as e:
            raise Refused(f"submit: {e}") from None
        if msg["cwd"] and not os.path.isabs(msg["cwd"]):
            raise Refused(f"submit: the working directory {msg['cwd']!r} is not an absolute path")
        ranks = msg.get("ranks")
        if ranks is not None and (msg.get("gpus", 1) != 1 or msg.get("gpu") is not None):
            raise Refused("submit: --ranks N starts N single-GPU ranks placed by gmuxd; it takes neither --gpus "
                          "(one process using N GPUs) nor --gpu")
        env = dict(msg.get("env") or {})
        if node.access.system is not None:
            node.user_dir(who)    # before any job exists: a refusal here leaves nothing behind
        ids_from, jobs = node.store.mark(), []
        try:
            if ranks is not None:
                # Unnamed: after its first rank, whose id that rank is about to take. An id of its own would
                # leave a gap in the jobs' numbering (gang gangj12's ranks were j13, j14; no j12 was ever listed)
                gang = msg.get("name") or _unnamed_gang(node.jobs, ids_from, ranks)
                if gang_members(node.jobs, gang):
                    raise Refused(f"submit: a gang named {gang} is running; choose another --name")
                _refuse_names_taken(node.jobs, who.uid, [gang] + [f"{gang}-{r}" for r in range(ranks)])
                port = free_port()
                jobs = [self._new_submitted(msg, who, {**env, **rendezvous_env(ranks, port, r)}, f"{gang}-{r}",
                                            gang={"id": gang, "rank": r, "size": ranks}) for r in range(ranks)]
            else:
                name = msg.get("name") or ""
                _refuse_names_taken(node.jobs, who.uid, [name] if name else [])
                jobs = [self._new_submitted(msg, who, env, name)]
            for job in jobs:
                job.pid = node.sup.spawn(job)
                job.starttime = proc_starttime(job.pid)
        except Exception as e:
            # A refused submit leaves everything as it was: no job of it listed or running, no log of it, its ids
            # given back; unless a log could not be removed (a read-only filesystem): no other job may append to it.
            kept = False
            for job in jobs:
                if not job.pid:
                    continue      # (a process that could not start wrote nothing)
                node.sup.kill(job)
                try:
                    os.unlink(node.rundir.log_file(job.id))
                except FileNotFoundError:
                    pass
                except OSError:
                    kept = True
            if not kept:
                node.store.unused(ids_from)
            if isinstance(e, CannotStart):
                raise Refused(f"submit: {e}") from None
            raise
        for job in jobs:     # (each enters the job table only once every process of the submit has started)
            node.add_job(job)
            if job.gpu is None:
                node.admission.enqueue(job)
            else:
                job.detail = "starting"
            node.store.save(job)
        first = jobs[0]
        data = {"job": first.id, "gpu": first.gpu, "pid": first.pid, "log": node.rundir.log_file(first.id)}
        if ranks is not None:
            data.update(gang=first.gang["id"], jobs=[j.id for j in jobs], pids=[j.pid for j in jobs])
        return data

    def _new_submitted(self, msg: protocol.Message, who: Caller, env: dict, name: str,
                       gang: Optional[dict] = None) -> Job:
        node = self.node
        job = Job(node.store.next_job_id(), secrets.token_hex(16), name, list(msg["argv"]), msg["cwd"],
                  weight=float(msg.get("weight", 1.0)), mem=msg.get("mem"), managed=True, env=env)
        job.uid, job.gid = who.uid, who.gid    # its owner: the one who may act on it, and whom it runs as
        job.gpus_wanted, job.gang, job.pinned = msg.get("gpus", 1), gang, msg.get("gpu")
        job.hook = msg.get("hook", True)
        node.admission.admit(job, "submit")
        return job

    def decisions(self, req: Request):
        who = self._who(req)
        limit = req.msg.get("limit") or 100
        # a user's own among the newest (others' are left out, not counted against the limit, up to 10x)
        wanted = limit if self.node.access.is_admin(who) else min(10 * limit, 10000)
        return {"decisions": self._visible(who, self.node.store.decisions(wanted), limit)}

    def shutdown(self, req: Request):
        node = self.node
        self.node.access.admin_only(req.msg, self._who(req))
        if req.msg.get("kill_jobs"):
            ending = [job for job in node.jobs.values() if not job.final]
            for job in ending:      # (all asked first: a gang's ranks ended as their peer was, "rank 0 ... killed")
                job.kill_requested, job.kill_reason = True, "killed at daemon shutdown"
            for job in ending:
                # (its status as gmux kill's, which reaps the process it signalled: -9; None where none was left)
                signalled = node.sup.kill(job)
                node.finish(job, "killed", -signal.SIGKILL if signalled else None, job.kill_reason)
        node.stop()
        return {"stopping": True}
