"""Adopting a job that gmuxd's table lost: a gmuxd restarted over an emptied or deleted table meets jobs that its
predecessor started and that still run. Each is told, at its next message, that gmuxd does not know it (the reply's
`unknown`), and registers again with its id and token, its state and the GPU it was last resumed on. gmuxd takes
it back there, as it re-attaches a job its table kept (daemon.py): its share of the GPU counted again, nothing
sent to it until it says what it does, and sliced like any other job from then on. A job that had not started
(one gmuxd started, or a new process back from a move, registering with its id) is taken back to start: it
waits for its turn, and a moved one restores from its checkpoint.

What cannot be taken back is refused with the reason, and the job runs on as it did: a job of several GPUs or a
gang rank (which GPUs are its own, and its peers, are not known), a job of another GPU layout than this gmuxd's,
and an id that is no job id (whatever claims one must be what gmuxd gives, so that new jobs never collide). An
id is believed only below the next id its table gives, or where gmuxd started without a table (new, or lost; in
a system gmuxd only from a process that began before this gmuxd did, as its predecessor's jobs did): otherwise
any user could move the counter new ids are taken from (a claim of j999999999 made every later id longer than
what gmuxd then took back).
A lost table holds no token to check a claim against: in a system gmuxd a claim becomes its claimer's own job,
under the uid the kernel gives for it, so all another user can do is take an id first from the job that lost it,
which then runs on unsupervised, as it did before adoption existed.
What the lost table alone knew is not taken back: a user's hold (`gmux suspend`: an adopted job is scheduled
again), the host memory a suspended job holds (counted from its next suspend), and in a system gmuxd whether
the job was submitted (its `gmux logs`).
"""
from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING

from gmux.node.jobs import Job
from gmux.rundir import proc_starttime, started_environ
from gmux.wire.server import Refused, Request

if TYPE_CHECKING:
    from gmux.node.daemon import Daemon

JOB_ID = re.compile(r"j[1-9][0-9]{0,17}", re.ASCII)
MOST_IDS = 10 ** 12     # ids a lost table may have given: a claim past it is not believed (it would move every new id)


def adopt(node: "Daemon", req: Request) -> Job:
    """The job of a registration with `adopt`, taken into the table and seated where it is; Refused if not."""
    msg, who, now = req.msg, req.caller, time.monotonic()
    system = node.access.system is not None
    job_id, state, gpu = msg["job"], msg["adopt"], msg.get("on_gpu")
    if not JOB_ID.fullmatch(job_id) or not msg.get("token"):
        raise Refused(f"register: {job_id!r} is not a job id this gmuxd gives, with its token: nothing to adopt")
    if not node.store.gave(job_id):
        if not node.store.new:
            raise Refused(f"register: {job_id} is an id this gmuxd never gave (its table was not lost, and its next "
                          f"id is {node.store.mark()})")
        if int(job_id[1:]) >= MOST_IDS:
            raise Refused(f"register: {job_id} is past any id a gmuxd gives: nothing to adopt")
        began = proc_starttime(who.pid) if system and who is not None else None
        if system and (began is None or began >= proc_starttime(os.getpid())):
            # (a job its predecessor started began before this gmuxd did; at a boot every table is new)
            raise Refused(f"register: {job_id} is not in this gmuxd's new table, and process {msg['pid']} began "
                          f"after this gmuxd did: it is no job of the gmuxd before it, nothing to adopt")
    if node.store.holds(job_id):       # (an ended job gmuxd no longer keeps in memory: its record stays its own)
        raise Refused(f"register: {job_id} is a job this gmuxd has a record of: nothing to adopt")
    if msg.get("gang") or msg.get("gpus", 1) > 1:
        raise Refused(f"register: {job_id} is not in this gmuxd's table (it was lost), and a job of several GPUs "
                      f"or a gang rank cannot be taken back: it runs on unsupervised; end it and submit it again")
    started = state != "waiting" and gpu is not None
    if started and gpu not in node.slicers:
        raise Refused(f"register: {job_id} runs on GPU {gpu}, which this gmuxd does not have "
                      f"(it has {', '.join(map(str, sorted(node.slicers)))})")
    if system:
        node.user_dir(who)
    job = Job(job_id, msg["token"], msg.get("name") or "", list(msg["argv"]), msg.get("cwd", ""),
              weight=float(msg.get("weight", 1.0)), mem=msg.get("mem"))
    job.uid, job.gid = (who.uid, who.gid) if who is not None else (os.getuid(), os.getgid())
    job.pinned = msg.get("gpu")
    job.pid, job.starttime = msg["pid"], proc_starttime(msg["pid"]) if system else msg.get("starttime")
    job.migratable = bool(msg.get("migratable", False))
    job.hook = not job.migratable
    job.identity, job.registered = req.identity, True
    # Submitted (its output in gmuxd's log file, and its process group ended with it), where it can be told: a
    # process gmuxd started as this job has its token in the environment it began with. Not in a system gmuxd,
    # whose logs are not the claimer's to read on a claim.
    job.managed = not system and os.path.exists(node.rundir.log_file(job_id)) and _began_as(job.pid, job.token)
    job.start_window()
    refusal = node.admission.move_refusal(job, gpu) if started else None
    if refusal:        # (a GPU held for another's gang, say: not taken over by a claim)
        raise Refused(f"register: {job_id} cannot be taken back on GPU {gpu}: {refusal}")
    if not started:
        job.state, job.started = "waiting", False
        node.admission.admit(job, "register")
    node.store.ids_from(int(job_id[1:]) + 1)     # (after the last refusal: a refused claim moves nothing)
    node.add_job(job)
    if not started:
        if job.gpu is None:
            node.admission.enqueue(job)
        else:
            node.seat(job, now)
    else:
        job.gpu, job.started = gpu, True
        job.state = "running" if state == "running" else "suspended"
        node.slicers[gpu].add(job.id, job.weight, job.working_set(), now, resident=state == "running", confirm=True)
    node.store.save(job)
    node.decide(job.gpu, "adopted", [job.id], {"state": state, "pid": job.pid},
                f"adopted {job.id} (pid {job.pid}, {state}" + (f" on GPU {gpu}" if started else "") +
                "): a job this gmuxd's table had lost, started by the gmuxd before it")
    return job


def _began_as(pid: int, token: str) -> bool:
    return f"GMUX_JOB_TOKEN={token}".encode() in started_environ(pid)
