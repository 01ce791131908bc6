"""gmux-scheduler's cluster state in SQLite (WAL): machines, jobs, decisions. The one source of truth across
scheduler restarts; the daemons' reports refresh the measured parts of it every half second.

A write that fails (a full disk, an I/O error) never stops the scheduler answering: it serves from memory (every
daemon unanswered would suspend the cluster's jobs), keeps what was not written and writes it at the next flush,
`failing` says what is wrong (shown by `gmux ps --cluster`), and job ids stay unique from a counter in memory.

Cluster job states:
  pending    no machine; the policy places it (after a loss, from its last checkpoint if it has one)
  starting   a start was sent to `machine` (or its checkpoint is on the way there); not yet seen running
  running    its gmuxd runs it (time-sliced or packed there as that gmuxd decides)
  suspended  held by the scheduler (policy Suspend); its state is in host RAM on `machine`
  held       held by its user (`gmux suspend --cluster`): suspended on `machine` (none: it waits unplaced) until
             `gmux resume --cluster`; the policy sees neither it nor its GPUs, which stay kept for it. A job whose
             start failed START_TRIES times in a row is held too, unplaced, as Slurm holds a job whose launch failed
  migrating  being moved from `source` to `machine`: checkpoint on the way; the source releases it only
             after `machine` has restored it
  done / failed / killed   final
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import sqlite3
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Callable, Iterator, Optional

from gmux.util.db import DecisionLog, FallibleWrites, open_db, transaction
from gmux.util.text import digits

log = logging.getLogger("gmux-scheduler")

LIVE = ("pending", "starting", "running", "suspended", "held", "migrating")
START_TRIES = 3       # a start that fails this often in a row fails again (a --mem no GPU has, a broken checkpoint)
FINAL = ("done", "failed", "killed")


@dataclass
class CJob:
    cjob: str
    argv: list
    cwd: str
    env: dict = field(default_factory=dict)
    name: str = ""
    gpus: int = 1                      # its ranks: a gang of n processes, one per GPU, all on one machine
    mem: Optional[int] = None
    weight: float = 1.0
    ckpt_every: Optional[float] = None
    submitted: float = field(default_factory=time.time)
    state: str = "pending"
    machine: Optional[str] = None
    gpu: Optional[int] = None          # rank 0's GPU on `machine`
    rank_gpus: list = field(default_factory=list)   # every rank's GPU on `machine`, by rank (empty: not placed)
    ranks: list = field(default_factory=list)       # a gang's ranks as `machine` last reported them
    source: Optional[str] = None       # the machine a migration leaves from
    source_gpus: list = field(default_factory=list)  # and its GPUs there, by rank (where a failed move leaves it)
    move: dict = field(default_factory=dict)        # the move under way, if any (gmux.cluster.scheduler.moves)
    local: Optional[str] = None        # the job id on `machine`'s gmuxd
    ended_local: Optional[str] = None  # MACHINE/LOCAL of the copy it last restarted from (its record may linger)
    step: int = 0
    boundless: bool = False            # computing with no boundary yet (its machine's word): not checkpointable
    unmovable: Optional[str] = None    # why a new process would not continue it exactly now (its machine's word)
    parked: bool = False               # suspended, its GPUs given to others: it resumes on them (its machine's word)
    attained: float = 0.0              # GPU-seconds on machines it has left
    gpu_seconds: float = 0.0           # GPU-seconds on `machine` (from its reports)
    rate_now: Optional[float] = None
    rate_solo: Optional[float] = None
    mem_peak: Optional[int] = None
    first_run: Optional[float] = None
    ckpt_paths: list = field(default_factory=list)  # newest complete periodic checkpoint: a file per rank, one step
    ckpt_step: Optional[int] = None
    restarts: int = 0
    start_failures: int = 0            # starts that failed since it last ran (or since its user released it)
    migrations: int = 0
    since: float = field(default_factory=time.time)   # when it entered its state
    kill_requested: bool = False
    detail: str = ""
    exit_status: Optional[int] = None
    finished: Optional[float] = None
    owner: Optional[str] = None        # the client key that submitted it: only it or an admin may act on it

    @property
    def final(self) -> bool:
        return self.state in FINAL

    def set(self, state: str, detail: Optional[str] = None) -> None:
        if state != self.state:
            self.state, self.since = state, time.time()
        if detail is not None:
            self.detail = detail


_JSON = ("argv", "env", "rank_gpus", "source_gpus", "ranks", "ckpt_paths", "move")
_COLS = [f.name for f in fields(CJob)]
_NUMBERS = [f for f in fields(CJob) if isinstance(f.default, (int, float)) and not isinstance(f.default, bool)]
_FLAGS = [f.name for f in fields(CJob) if isinstance(f.default, bool)]


@dataclass
class Machine:
    name: str
    gpus: list                  # [{"index", "mem_total"}]
    transfer: str               # tcp endpoint of its cluster link's checkpoint receiver
    last_seen: float = 0.0
    state: str = "up"           # up / lost
    joined: float = field(default_factory=time.time)
    ident: str = ""             # routing id of the gmuxd that speaks for it (NAME/BOOT: one per process)


class State:
    def __init__(self, path: str):
        if os.path.exists(path) and os.path.getsize(path) == 0:
            # (what a crash or a full disk leaves of a file never synced): opened, it would be a new cluster
            # that has forgotten every job
            raise sqlite3.DatabaseError("it is empty (0 bytes)")
        self.db = open_db(path)
        # Untyped columns (SQLite keeps each value's type): the dataclass above is the schema.
        self.db.execute(f"CREATE TABLE IF NOT EXISTS jobs (cjob TEXT PRIMARY KEY, seq INTEGER, {', '.join(_COLS[1:])})")
        have = {row[1] for row in self.db.execute("PRAGMA table_info(jobs)")}
        for col in _COLS:
            if col not in have:      # a database written by an older gmux-scheduler
                self.db.execute(f"ALTER TABLE jobs ADD COLUMN {col}")
        self.db.execute("CREATE TABLE IF NOT EXISTS machines (name TEXT PRIMARY KEY, data TEXT)")
        self.db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        self.log = DecisionLog(self.db)
        self.path = path
        self.writes = FallibleWrites(path, log)   # (its `failing`: what is wrong, until writes work again)
        self._unsaved: dict[str, CJob] = {}
        self._unsaved_machines: dict[str, Machine] = {}
        self._undecided: list[tuple] = []
        row = self.db.execute("SELECT v FROM meta WHERE k='seq'").fetchone()
        self._seq = int(row[0]) if row else 0    # the last job id given, also while the database refuses writes

    # --- jobs ---
    def next_id(self) -> str:
        self._seq += 1
        self.writes.attempt(self._save_seq)
        return f"c{self._seq}"

    def ids_past(self, cjob: str) -> None:
        """No id up to `cjob`'s is given (a job a daemon runs that this state does not know: written before a
        crash on a full disk)."""
        n = _number(cjob)
        if n > self._seq:
            self._seq = n
            self.writes.attempt(self._save_seq)

    def _save_seq(self) -> None:
        with transaction(self.db):
            row = self.db.execute("SELECT v FROM meta WHERE k='seq'").fetchone()
            self._seq = max(self._seq, int(row[0]) if row else 0)
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('seq', ?)", (str(self._seq),))

    def save(self, job: CJob) -> None:
        if not self.writes.attempt(lambda: self._save(job)):
            self._unsaved[job.cjob] = job

    def _save(self, job: CJob) -> None:
        d = asdict(job)
        for k in _JSON:
            d[k] = json.dumps(d[k])
        for k in _FLAGS:
            d[k] = int(d[k])
        cols = ", ".join(_COLS)
        self.db.execute(f"INSERT OR REPLACE INTO jobs (seq, {cols}) VALUES (?, {', '.join('?' * len(_COLS))})",
                        [_number(job.cjob)] + [d[c] for c in _COLS])

    def save_many(self, jobs) -> None:
        """A flush: these jobs, and whatever earlier writes could not store, in one transaction."""
        jobs = {**self._unsaved, **{j.cjob: j for j in jobs}}

        def write():
            with transaction(self.db):
                for j in jobs.values():
                    self._save(j)
                for m in self._unsaved_machines.values():
                    self._save_machine(m)
                for d in self._undecided:
                    self.log.record(*d)
            self._save_seq()
        if self.writes.attempt(write):
            if self.writes.failing is not None:
                log.warning("%s takes writes again: %d jobs, %d machines and %d decisions written", self.path,
                            len(jobs), len(self._unsaved_machines), len(self._undecided))
            self.writes.failing, self._unsaved, self._unsaved_machines, self._undecided = None, {}, {}, []
        else:
            self._unsaved = jobs

    def load_jobs(self) -> dict[str, CJob]:
        out = {}
        for row in self.db.execute(f"SELECT {', '.join(_COLS)} FROM jobs ORDER BY seq"):
            d = dict(zip(_COLS, row))
            for k in _JSON:
                d[k] = json.loads(d[k]) if d[k] is not None else {} if k in ("env", "move") else []
            for k in _FLAGS:
                d[k] = bool(d[k])          # (None: a column an older gmux-scheduler's database did not have)
            for f in _NUMBERS:
                if d[f.name] is None:
                    d[f.name] = f.default       # a column an older gmux-scheduler's database did not have
            out[d["cjob"]] = CJob(**d)
        return out

    # --- machines ---
    def save_machine(self, m: Machine) -> None:
        if not self.writes.attempt(lambda: self._save_machine(m)):
            self._unsaved_machines[m.name] = m

    def _save_machine(self, m: Machine) -> None:
        self.db.execute("INSERT OR REPLACE INTO machines VALUES (?, ?)", (m.name, json.dumps(asdict(m))))

    def load_machines(self) -> dict[str, Machine]:
        return {name: Machine(**json.loads(data)) for name, data in self.db.execute("SELECT name, data FROM machines")}

    # --- decisions ---
    def decide(self, kind: str, cjob: Optional[str], text: str, numbers: Optional[dict] = None) -> dict:
        args = (kind, text, [cjob] if cjob else [], numbers, None, time.time())
        out = []
        if not self.writes.attempt(lambda: out.append(self.log.record(*args))):
            self._undecided.append(args)
            return _with_cjob(self.log.entry(*args))
        return _with_cjob(out[0])

    def decisions(self, limit: int = 100) -> list[dict]:
        return [_with_cjob(d) for d in self.log.recent(limit)]

    @property
    def failing(self) -> Optional[str]:
        return self.writes.failing

    def close(self) -> None:
        self.db.close()


def _with_cjob(d: dict) -> dict:
    """A scheduler decision concerns one cluster job (or none): shown as `cjob`."""
    return {**d, "cjob": d["jobs"][0] if d["jobs"] else None}


@contextlib.contextmanager
def claimed_state_dir(statedir: str, on_refusal: Callable[[], object]) -> Iterator[int]:
    """Makes the state directory (0700) and takes its lock (yielded: the caller closes it once done) for the block
    that opens the scheduler. If the block raises (keys refused, the address taken, the database damaged),
    `on_refusal` closes what it opened, and what it added to the directory is removed (the lock still held), the
    directory too if it was made here: a refusal changes nothing. Another scheduler on it is refused first."""
    made = None                   # the outermost directory made here
    path = os.path.abspath(statedir)
    while not os.path.exists(path):
        made, path = path, os.path.dirname(path)
    os.makedirs(statedir, mode=0o700, exist_ok=True)
    before = set(os.listdir(statedir))
    try:
        lock = lock_state_dir(statedir)
    except BaseException:
        if made:
            shutil.rmtree(made, ignore_errors=True)
        raise
    try:
        yield lock
    except BaseException:
        on_refusal()
        for path in ([made] if made else [os.path.join(statedir, e) for e in set(os.listdir(statedir)) - before]):
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        os.close(lock)
        raise


def lock_state_dir(statedir: str) -> int:
    """One scheduler per state directory: two would each take the other's jobs for lost and start them again."""
    fd = os.open(os.path.join(statedir, "scheduler.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OSError(f"another gmux-scheduler is running on {statedir}; stop it first, or give this one its own "
                      f"--state") from None
    return fd


def _number(cjob: str) -> int:
    """The number of a cluster job id c<N>, else 0."""
    return int(cjob[1:]) if cjob[:1] == "c" and digits(cjob[1:]) else 0
