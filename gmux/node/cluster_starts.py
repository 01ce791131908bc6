"""Starts of cluster jobs on this machine, from the scheduler's start to the job's first boundary here.

A start (fresh, a restart from a checkpoint, or a move's target) runs one `gmux-launch --no-hook` per rank,
which registers with gmuxd itself. Until every rank is seen past a boundary the start is `starting`: the link
looks at gmuxd more often, tells the scheduler once every rank waits for the checkpoint it restores from
(`ready`: a move's source may now suspend), then that it `started`, or that it failed. The checkpoints it
restores from (received from another machine, or still arriving) are deleted once the start is over either
way: the state then lives in the processes, and the scheduler keeps its own newest periodic copy for recovery.
One that is still arriving is deleted once it completes (`arrived`).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import Callable, Optional

from gmux import protocol
from gmux.rundir import RuntimeDir
from gmux.node.cluster_records import gang_record, ranks_by_job
from gmux.node.warm_pool import WarmPool
from gmux.util.sizes import format_size
from gmux.util.text import printable, tail
from gmux.util.rendezvous import free_port, rendezvous_env

log = logging.getLogger("gmux.cluster_link")

FULL_BELOW = 1 << 20     # bytes free on a log's filesystem under which a silent failed start is put down to it


class Starts:
    def __init__(self, rundir: RuntimeDir, event: Callable[..., None], warm: Optional[WarmPool] = None,
                 reader_gone: Callable[[str], None] = lambda path: None):
        self.rundir = rundir
        self.event = event                      # the link's: (event, cjob, detail="", **data) to the scheduler
        self.warm = warm                        # interpreters with torch imported, for the next start's ranks
        self.reader_gone = reader_gone          # the receiver's: a checkpoint still arriving has no reader now
        self.children: dict[int, subprocess.Popen] = {}
        self.spawned: dict[str, list] = {}     # cjob -> pid of each rank's process started for it last
        self.starting: dict[str, float] = {}   # cjob -> when started here, until it is seen past a boundary
        self.ready: set = set()                # of those, the ones said "ready" (every rank awaits its checkpoint)
        self.restoring: dict[str, list] = {}   # cjob -> received checkpoints its new processes restore from
        self.unwanted: set = set()             # those dropped while still arriving: deleted once they complete
        self.cancelled: set[str] = set()       # starts killed before gmuxd knew their processes
        self.exits: dict[int, int] = {}        # pid -> exit status, of a starting job's process that has ended
        self.logs: dict[int, tuple] = {}       # pid -> (its log, the log's size when it started)

    def begin(self, cjob: str, paths: list) -> None:
        """A start from the checkpoints at `paths` (none: a fresh one); its processes come from `spawn`."""
        self.spawned[cjob] = []         # until the processes exist, no record speaks for the job
        self.cancelled.discard(cjob)
        self.restoring[cjob] = paths
        self.starting[cjob] = time.monotonic()
        self.ready.discard(cjob)

    def spawn(self, cjob: str, a: dict, paths: list) -> None:
        """Starts every rank's process (on a worker thread); gmuxd learns the gang from each rank's
        --gang/--rank/--world."""
        world = len(a["gpus"])
        port = free_port() if world > 1 else None   # a new rendezvous at every start: the old may be held
        env = {**os.environ, **a.get("env", {})}
        env.pop("GMUX_JOB_TOKEN", None)
        env.pop("GMUX_JOB_ID", None)    # gmux-launch sets the job's own; another's would mark it as that job's
        for var, arg in (("GMUX_RESTORE_WAIT", "restore_wait"), ("GMUX_LEASE_S", "lease_s")):
            env.pop(var, None)
            if a.get(arg):
                env[var] = repr(float(a[arg]))
        os.makedirs(self.rundir.logs(), exist_ok=True)
        procs, how = [], []
        for rank, gpu in enumerate(a["gpus"]):
            name = cjob if world == 1 else f"{cjob}.{rank}"
            cmd = [sys.executable, "-m", "gmux.cli.launch", "--runtime-dir", self.rundir.root, "--no-hook",
                   "--name", name, "--gpu", str(gpu), "--weight", repr(float(a.get("weight") or 1.0))]
            if a.get("mem") is not None:
                cmd += ["--mem", f"{a['mem']}B"]
            if paths:
                cmd += ["--restore", paths[rank]]
            if world > 1:
                cmd += ["--gang", cjob, "--rank", str(rank), "--world", str(world)]
            rank_env = {**env, **rendezvous_env(world, port, rank)} if world > 1 else env
            log_path = os.path.join(self.rundir.logs(), f"{name}.cluster.log")
            log_from = os.path.getsize(log_path) if os.path.exists(log_path) else 0
            warm, why = (None, "no pool") if self.warm is None else \
                self.warm.take(cmd[3:] + ["--", *a["argv"]], rank_env, a["cwd"] or None, log_path)
            how.append("warm" if warm else f"cold: {why}")
            if warm is not None:
                procs.append(warm)
                self.logs[warm.pid] = (log_path, log_from)
                continue
            try:
                with open(log_path, "ab") as out:
                    procs.append(subprocess.Popen(cmd + ["--", *a["argv"]], cwd=a["cwd"] or None, env=rank_env,
                                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                  start_new_session=True))
                self.logs[procs[-1].pid] = (log_path, log_from)
            except OSError as e:
                for p in procs:          # a gang without one of its ranks would wait for it for ever
                    p.kill()
                    p.wait()
                    self.logs.pop(p.pid, None)
                self._over(cjob)
                self.event("start_failed", cjob, f"could not start rank {rank}: {e}")
                return
        for p in procs:
            self.children[p.pid] = p
        self.spawned[cjob] = [p.pid for p in procs]  # gmux-launch registers its own pid: names this incarnation
        if cjob in self.cancelled:
            for p in procs:
                p.kill()
            return
        log.info("started %s (pids %s, %s)%s", cjob, self.spawned[cjob], "; ".join(how),
                 " restoring" if paths else "")

    def cancel(self, cjob: str) -> None:
        """Kills the processes of a start that gmuxd may not know yet (the worker spawning them may not even be
        done: it kills what it spawned when it sees the start cancelled), and forgets the start."""
        self.cancelled.add(cjob)
        for pid in self.spawned.get(cjob) or []:
            p = self.children.get(pid)
            if p is not None and p.poll() is None:
                p.kill()
        self._over(cjob)

    def abandon(self, cjob: str) -> None:
        """The scheduler gives up the move this start is the target of, its source's send lost: killed unless it
        is over, and said as failed. One that is over has said so (started, or failed), and that event reaches
        the scheduler before anything said here: a start that restored goes on."""
        if cjob in self.starting:
            self.cancel(cjob)
            self.event("start_failed", cjob, "its move was given up: the checkpoint it waited for will not come")

    def reap(self) -> None:
        for pid, p in list(self.children.items()):
            status = p.poll()
            if status is not None:
                del self.children[pid]   # reaped: gmuxd reads how it ended from the exit record...
                if any(pid in self.spawned.get(cjob, ()) for cjob in self.starting):
                    self.exits[pid] = status     # ...unless it never registered (`unregistered`)

    def unregistered(self, jobs: list) -> None:
        """Every job gmuxd has a record of, live and ended (`jobs`, read after `reap`): a start one of whose
        processes ended without gmuxd ever hearing of it failed before it registered (gmux-launch refused: a
        --mem no GPU here has, an unreadable checkpoint...). Without this the scheduler would wait for a job that
        will never show and send its start again and again. The other ranks, waiting for it, are stopped."""
        if not self.exits:
            return
        known = {j.get("pid") for j in jobs}
        for cjob in list(self.starting):
            pids = self.spawned.get(cjob) or []
            gone = [(rank, pid) for rank, pid in enumerate(pids) if pid in self.exits and pid not in known]
            if not gone:
                continue
            rank, pid = gone[0]
            said = [ln for ln in self._said(pid).splitlines() if ln.strip()]
            silent = "" if said else _no_room(self.logs.get(pid, ("", 0))[0])
            self.cancel(cjob)
            self.event("start_failed", cjob, (f"rank {rank}: " if len(pids) > 1 else "")
                       + f"gmux-launch exited with status {self.exits[pid]} before gmuxd heard of it"
                       + (f": {printable(said[-1].strip(), limit=300)}" if said else silent))
        live = {pid for cjob in self.starting for pid in self.spawned.get(cjob) or []}
        self.exits = {pid: s for pid, s in self.exits.items() if pid in live}

    def _said(self, pid: int) -> str:
        """What a process of this start wrote to its log (appended to by every start of that name)."""
        path, since = self.logs.get(pid, ("", 0))
        try:
            size = os.path.getsize(path)
        except OSError:
            return ""
        return tail(path, min(4096, max(0, size - since)))

    def watched(self) -> bool:
        """Whether a start that restores is at a step the link should look for often: its processes are getting
        ready (a move's source computes on until they are), or its checkpoints have all arrived (the source holds
        the job until it has passed a boundary here). In between, while the bytes stream, a look would only take
        CPU from the stream."""
        return any(paths and (cjob not in self.ready or all(os.path.exists(p) for p in paths))
                   for cjob, paths in self.restoring.items() if cjob in self.starting)

    def look(self, live: list, world: dict) -> None:
        """gmuxd's live jobs (`live`; cjob -> its number of ranks in `world`), looked at while starts are under
        way: the events they owe. A rank missing from them makes its job's record "waiting", so no event comes
        until a full report says how it ended."""
        for cjob, by_rank in ranks_by_job(live, self.spawned).items():
            if cjob in self.starting and world.get(cjob):
                self.observe(cjob, gang_record(cjob, world[cjob], by_rank, bool(self.restoring.get(cjob))), by_rank,
                             world[cjob])

    def observe(self, cjob: str, rec: dict, by_rank: dict, world: int) -> None:
        """What gmuxd says of a job (`rec`, the link's record of it; `by_rank`, gmuxd's record of each rank):
        the events a start it is in owes the scheduler."""
        if cjob not in self.starting:
            return
        if (cjob not in self.ready and len(by_rank) == world
                and all((j.get("report") or {}).get("awaiting_restore") for j in by_rank.values())):
            self.ready.add(cjob)       # every rank waits for its checkpoint: a move's source may suspend
            self.event("ready", cjob)
        # (boundless: only a start from nothing; one restoring is started once it has restored, at a step)
        if rec["state"] in ("running", "suspended") and (rec["step"] > 0 or rec.get("boundless")
                                                         and not self.restoring.get(cjob)):
            self._over(cjob)
            self.event("started", cjob, step=rec["step"], local=rec["local"])
        elif rec["state"] in protocol.FINAL_STATES:
            self._over(cjob)           # a job that finished before it was seen running needs no event
            if not (rec["state"] == "exited" and rec["exit_status"] == 0):
                self.event("start_failed", cjob, f"{rec['state']}: {rec['detail']}")

    def arrived(self, path: str) -> bool:
        """A checkpoint has arrived complete at `path`: whether it was dropped meanwhile (and is now deleted)."""
        if path not in self.unwanted:
            return False
        self.unwanted.discard(path)
        os.unlink(path)
        return True

    def _over(self, cjob: str) -> None:
        """The start is over (started, failed or cancelled): its received checkpoints go."""
        self.starting.pop(cjob, None)
        self.ready.discard(cjob)
        for pid in self.spawned.get(cjob) or []:
            self.logs.pop(pid, None)
        if self.warm is not None and not self.starting:
            self.warm.fill()           # the next warm interpreters import torch now, not beside a start
        for path in self.restoring.pop(cjob, []):
            try:
                os.unlink(path)
            except FileNotFoundError:
                self.unwanted.add(path)     # a move whose new process failed while its checkpoint streamed
                self.reader_gone(path)      # (its source hears at once, not once it waited out the transfer)


def _no_room(log_path: str) -> str:
    """Why a start that failed said nothing, where its log's filesystem is full (a full disk fails gmux-launch
    before it registers, and the same full disk swallows its last words)."""
    where = os.path.dirname(log_path)
    try:
        st = os.statvfs(where)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    return (f"; nothing reached its log: the filesystem of {where} has {format_size(free)} free"
            if free < FULL_BELOW else "")
