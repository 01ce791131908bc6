"""What gmux-scheduler does for its clients (`gmux submit/ps/kill/suspend/resume/migrate --cluster`): each request
comes with the name of the client key it was signed with, which the service learned from CurveZMQ, never from
the message.

A job belongs to the key that submitted it: only that key, or one named an admin (`gmux-scheduler --admin`),
may kill, hold, release or move it. Every client may list every job.

A user's hold (`gmux suspend --cluster`) takes the job away from the policy: it is suspended where it runs (its
state kept in its machine's host memory, as for a policy Suspend), its GPUs kept for it (the policy is not shown
them), and nothing resumes it until its user says so; one not placed yet waits unplaced. Released (`gmux resume
--cluster`), it is the policy's again, suspended or pending, and runs in its turn. A local `gmux suspend` on its
machine is not a hold: the scheduler, which counts the job running there, resumes it
(gmux.cluster.scheduler.unheard).
"""
from __future__ import annotations

import statistics
import time
from typing import Optional

from gmux import protocol
from gmux.cluster.policies import Event, EventKind
from gmux.cluster.scheduler.driver import gang_problem
from gmux.cluster.scheduler.state import CJob
from gmux.cluster.scheduler.waiting import waiting_reasons
from gmux.util.sizes import format_size


class ClientHandlers:
    def __init__(self, scheduler):
        self.s = scheduler

    def table(self) -> dict:
        return {"c_submit": self.submit, "c_ps": self.ps, "c_kill": self.kill, "c_suspend": self.hold,
                "c_resume": self.release, "c_migrate": self.migrate}

    def _own(self, name: str, job: CJob, what: str) -> None:
        if name != job.owner and name not in self.s.opt.admins:
            raise protocol.ProtocolError(f"{what}: {job.cjob} belongs to {job.owner or 'no recorded owner'}, not to "
                                         f"{name}; only its owner or an admin (gmux-scheduler --admin NAME) may act "
                                         f"on it")

    def submit(self, name, ident, msg, data):
        ranks = msg.get("ranks", 1)
        most = max((len(m.gpus) for m in self.s.machines.values()), default=None)
        if most is not None and ranks > most:
            raise protocol.ProtocolError(f"submit: --ranks {ranks}: no machine has {ranks} GPUs (the most any "
                                         f"machine of this cluster has is {most}); a gang runs on one machine, "
                                         f"one rank per GPU")
        mem = msg.get("mem")
        largest = max(((r["mem_total"], m.name) for m in self.s.machines.values() for r in m.gpus), default=None)
        if mem is not None and largest is not None and mem > largest[0]:
            # (gmuxd would refuse it on every machine, and each refusal count as a failed start)
            raise protocol.ProtocolError(f"submit: --mem {format_size(mem)}: no machine has a GPU that large (the "
                                         f"largest: {format_size(largest[0])}, on {largest[1]})")
        same = next((j.cjob for j in self.s.jobs.values() if msg.get("name") and j.name == msg["name"]
                     and j.owner == name and not j.final and not j.kill_requested), None)
        if same:    # (following a submit's "try again" must not run the script twice)
            raise protocol.ProtocolError(f"submit: your job {same} is named {msg['name']!r} and runs on: give "
                                         f"this one another --name, or end that one first")
        job = CJob(self.s.state.next_id(), list(msg["argv"]), msg["cwd"], dict(msg.get("env") or {}),
                   msg.get("name") or "", ranks, mem, float(msg.get("weight", 1.0)),
                   msg.get("ckpt_every", self.s.opt.ckpt_every), owner=name)
        self.s.jobs[job.cjob] = job
        self.s.state.save(job)
        self.s._log("submit", job.cjob, f"{job.cjob} submitted by {name}: {' '.join(job.argv)[:200]}")
        self.s.events.append(Event(EventKind.ARRIVAL, job_id=job.cjob))
        return {"cjob": job.cjob}

    def ps(self, name, ident, msg, data):
        jobs = [{k: getattr(j, k) for k in ("cjob", "name", "state", "machine", "gpu", "gpus", "rank_gpus", "ranks",
                                            "source", "local", "step", "owner",
                                            "rate_now", "rate_solo", "attained", "gpu_seconds", "restarts",
                                            "migrations", "ckpt_step", "detail", "exit_status")}
                for j in self.s.jobs.values() if msg.get("all", True) or not j.final]
        why = waiting_reasons(self.s.jobs, self.s.machines)
        for j in jobs:
            if not j["detail"] and j["cjob"] in why:
                j["detail"] = why[j["cjob"]]
        ms = [{"name": m.name, "state": m.state, "gpus": len(m.gpus), "seen_s_ago": time.time() - m.last_seen}
              for m in self.s.machines.values()]
        dm = sorted(self.s.decision_ms)
        return {"jobs": jobs, "machines": ms, "policy": self.s.driver.policy.name,
                "decisions": list(self.s.recent)[-30:], "bad_messages": self.s.bad_messages,
                "internal_errors": self.s.internal_errors, "store": self.s.state.failing,
                "checkpoints_in": {"completed": self.s.receiver.completed, "sealed_bytes": self.s.receiver.sealed_bytes,
                                   "dropped_sealed": self.s.receiver.dropped_sealed},
                "decision_ms": {"n": len(dm), "p50": dm[len(dm) // 2] if dm else None,
                                "p99": dm[min(len(dm) - 1, int(len(dm) * 0.99))] if dm else None,
                                "mean": statistics.fmean(dm) if dm else None}}

    def kill(self, name, ident, msg, data):
        job = self._live(msg["cjob"], "kill", name)
        self._own(name, job, "kill")
        job.kill_requested = True
        if job.machine is None:
            job.set("killed", f"killed by {name} before it started")
            job.finished = time.time()
        else:
            self.s.moves.give_up_for_kill(job)
            self.s._action(job.machine, "kill", job.cjob)
            if job.state == "starting" and job.local is None:
                # Not seen on its machine yet: the kill cancels its start there (killing what it spawned), and
                # nothing will report on it, so it ends here, or a stalled start would be sent again.
                job.set("killed", f"killed by {name} while it started on {job.machine}")
                job.finished = time.time()
        self.s.state.save(job)
        return {"cjob": job.cjob}

    def hold(self, name, ident, msg, data):
        job = self._live(msg["cjob"], "suspend", name)
        self._own(name, job, "suspend")
        if job.state in ("starting", "migrating"):
            raise protocol.ProtocolError(f"suspend: {job.cjob} is {job.state} (to {job.machine}); hold it once it "
                                         f"runs there")
        if job.state != "held":
            running, where = job.state == "running", f" on {job.machine}" if job.machine else ""
            job.set("held", f"held by {name}{where}; `gmux resume --cluster ADDRESS {job.cjob}` lets it run")
            if running:
                self.s._action(job.machine, "suspend", job.cjob)
            self.s.state.save(job)
            self.s._log("hold", job.cjob, f"{job.cjob} held by {name}{where}")
        return {"cjob": job.cjob, "state": job.state}

    def release(self, name, ident, msg, data):
        job = self._live(msg["cjob"], "resume", name)
        self._own(name, job, "resume")
        if job.state != "held":
            raise protocol.ProtocolError(f"resume: {job.cjob} is not held by its user (it is {job.state}); "
                                         f"the policy decides when it runs")
        placed = job.machine is not None
        job.start_failures = 0
        job.set("suspended" if placed else "pending", f"released by {name}: runs in its turn")
        self.s.events.append(Event(EventKind.TICK) if placed else Event(EventKind.ARRIVAL, job_id=job.cjob))
        self.s.state.save(job)
        self.s._log("release", job.cjob, f"{job.cjob} released by {name}")
        return {"cjob": job.cjob, "state": job.state}

    def _find(self, cjob: str, who: str) -> Optional[CJob]:
        """The job of that id, or the caller's live job of that --name (one at most: submit refuses a second). One
        being killed has given its name up: `gmux kill --cluster x; gmux submit --cluster --name x` was refused
        ("your job c18 is named 'x' and runs on") while the kill reached its machine."""
        named = [j for j in self.s.jobs.values() if j.name == cjob and not j.final and j.owner == who]
        return self.s.jobs.get(cjob) or next((j for j in named if not j.kill_requested), None) or \
            next(iter(named), None)

    def _live(self, cjob: str, what: str, who: str) -> CJob:
        job = self._find(cjob, who)
        if job is not None and job.kill_requested and what != "kill" and not job.final:
            raise protocol.ProtocolError(f"{what}: {job.cjob} is being killed")
        if job is None or job.final:
            raise protocol.ProtocolError(f"{what}: no live job {cjob!r} (an id, or the --name of a live job of "
                                         f"yours); gmux ps --cluster lists them")
        return job

    def migrate(self, name, ident, msg, data):
        job = self._find(msg["cjob"], name)
        m = self.s.machines.get(msg["machine"])
        if job is None or job.state != "running":
            raise protocol.ProtocolError(f"migrate: {msg['cjob']!r} is not a running job (it is "
                                         f"{job.state if job else 'unknown'})")
        self._own(name, job, "migrate")
        if job.kill_requested:      # (a move's new processes would be started for it on the target)
            raise protocol.ProtocolError(f"migrate: {job.cjob} is being killed")
        if job.boundless:
            # (a copy elsewhere would start from the beginning while this one computed on, for minutes)
            raise protocol.ProtocolError(f"migrate: {job.cjob} has reached no boundary since it started (its "
                                         f"script has not called gmux.job.attach() and trained a step), so it "
                                         f"cannot be checkpointed and moved; a script that never does (an "
                                         f"unmodified one) is never moved, and a machine lost under it restarts it "
                                         f"from the beginning")
        if job.unmovable and (m is None or m.name != job.machine):
            raise protocol.ProtocolError(f"migrate: {job.cjob} would not continue exactly in a new process: "
                                         f"{job.unmovable}; it runs on at {job.machine}")
        gpus = [msg["gpu"] + r for r in range(job.gpus)]
        if m is None or m.state != "up" or not set(gpus) <= {g["index"] for g in m.gpus}:
            raise protocol.ProtocolError(f"migrate: no GPU{'s' if job.gpus > 1 else ''} "
                                         f"{', '.join(map(str, gpus))} on an up machine {msg['machine']!r}"
                                         + (f" (rank r of {job.cjob}'s {job.gpus} goes to GPU {msg['gpu']}+r)"
                                            if job.gpus > 1 else ""))
        if m.name == job.machine and gpus == (job.rank_gpus or [job.gpu]):
            raise protocol.ProtocolError(f"migrate: {job.cjob} is already on {m.name} GPU {msg['gpu']}")
        if m.name == job.machine and job.gpus > 1:
            raise protocol.ProtocolError(f"migrate: {job.cjob} is a gang: it moves between machines only")
        problem = gang_problem(job, m.name, tuple(gpus), self.s.jobs)
        if problem:     # (a start there would wait for the gang's GPU while its source gave up its own)
            raise protocol.ProtocolError(f"migrate: {job.cjob} cannot go to {m.name} GPU {msg['gpu']}: {problem}; "
                                         f"it runs on at {job.machine}")
        if m.name == job.machine:
            job.gpu, job.rank_gpus = msg["gpu"], [msg["gpu"]]
            self.s._action(job.machine, "move", job.cjob, gpu=msg["gpu"])
        else:
            self.s.moves.start(job, m.name, gpus, f"asked by {name}")
            if job.state != "migrating":        # given up at once (its target's link is not connected)
                raise protocol.ProtocolError(f"migrate: {job.detail}; it runs on at {job.machine}: try again "
                                             f"in a moment")
        self.s.state.save(job)
        return {"cjob": job.cjob, "from": job.source or job.machine, "to": m.name}
