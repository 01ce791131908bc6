"""gmuxd's tables in SQLite (WAL): jobs and decisions survive a daemon restart.

Writes happen on state changes and on a periodic flush of measurements, not on every report, so a busy
daemon is not bound by fsync (gmux.util.db: WAL, transactions, the decision log).

A write that fails (a full disk, an I/O error) never takes gmuxd down: the daemon serves from its tables in
memory, what was not written is kept and written again at the next flush, `failing` says what is wrong (shown by
`gmux ps`), and job ids stay unique from an in-memory counter until the database takes writes again.
"""
from __future__ import annotations

import json
import logging
import sqlite3
import time
from typing import Iterable, Optional

from gmux.node.jobs import IDENTITY, Job
from gmux.util.db import DecisionLog, FallibleWrites, open_db, transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, token TEXT NOT NULL, name TEXT, argv TEXT, cwd TEXT, pid INTEGER, starttime INTEGER,
    gpu INTEGER, weight REAL, mem INTEGER, state TEXT, managed INTEGER, created REAL, detail TEXT,
    exit_status INTEGER, stats TEXT
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


log = logging.getLogger("gmux.store")


class Store:
    def __init__(self, path: str):
        self.path = path
        try:
            self.db = open_db(path)
            self.db.executescript(SCHEMA)
            row = self.db.execute("SELECT value FROM meta WHERE key='next_job'").fetchone()
        except sqlite3.DatabaseError as e:
            raise RuntimeError(f"{path}: gmuxd's job table cannot be read ({e}). Jobs the gmuxd before this one "
                               f"started may still run, unsupervised; their logs are in logs/ beside it. To start "
                               f"with an empty table, move {path} (with its -wal and -shm files) aside") from None
        self.log = DecisionLog(self.db)
        self.writes = FallibleWrites(path, log)   # (its `failing`: what is wrong, until writes work again)
        self._unsaved: dict[str, Job] = {}        # jobs whose last state is not in the database yet
        self._undecided: list[tuple] = []         # decisions not in the database yet
        self._next = int(row[0]) if row else 1    # the next job id, also while the database refuses writes
        self.new = row is None      # no table before this start (none yet, or it was lost): ids are not known

    def ids_from(self, n: int) -> None:
        """No job id below `n` is given (ids a table lost are still on files: logs, checkpoints), also by a
        gmuxd started after this one (written at once, as next_job_id writes)."""
        if n > self._next:
            self._next = n
            self.writes.attempt(self._save_counter)

    def next_job_id(self) -> str:
        """Job ids are never reused once anything of their job exists, also across restarts, so logs and
        checkpoints never collide (a refused submit's, of which nothing is left, are given back: `unused`)."""
        n = self._next
        self._next += 1
        self.writes.attempt(self._save_counter)
        return f"j{n}"

    def gave(self, job_id: str) -> bool:
        """Whether this table gave the id (to a job it may since have forgotten)."""
        return int(job_id[1:]) < self._next

    def mark(self) -> str:
        """The id the next job takes (unused() gives it back with every id given after it)."""
        return f"j{self._next}"

    def unused(self, job_id: str) -> None:
        """This id and every one given after it went to no job (a submit or registration refused): the next job
        takes it, as if the refusal had never been."""
        n, given = int(job_id[1:]), self._next
        if given > n:
            self._next = n
            self.writes.attempt(lambda: self.db.execute("UPDATE meta SET value=? WHERE key='next_job' AND value=?",
                                                (str(n), str(given))))

    def _save_counter(self) -> None:
        with transaction(self.db):
            row = self.db.execute("SELECT value FROM meta WHERE key='next_job'").fetchone()
            self._next = max(self._next, int(row[0]) if row else 1)
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('next_job', ?)", (str(self._next),))

    def save(self, job: Job) -> None:
        if not self.writes.attempt(lambda: self._save(job)):
            self._unsaved[job.id] = job

    def _save(self, job: Job) -> None:
        r = job.row()
        cols = list(IDENTITY) + ["stats"]
        vals = [json.dumps(r["argv"]) if c == "argv" else json.dumps(r["stats"]) if c == "stats"
                else int(r[c]) if c == "managed" else r[c] for c in cols]
        self.db.execute(f"INSERT INTO jobs ({','.join(cols)}) VALUES ({','.join('?' * len(cols))}) "
                        f"ON CONFLICT(id) DO UPDATE SET {','.join(f'{c}=excluded.{c}' for c in cols[1:])}", vals)

    def save_many(self, jobs: Iterable[Job]) -> None:
        """A flush: these jobs, and whatever earlier writes could not store, in one transaction."""
        jobs = {**self._unsaved, **{j.id: j for j in jobs}}

        def write():
            with transaction(self.db):
                for j in jobs.values():
                    self._save(j)
                for d in self._undecided:
                    self.log.record(*d)
            self._save_counter()
        if self.writes.attempt(write):
            if self.writes.failing is not None:
                log.warning("%s takes writes again: %d jobs and %d decisions written", self.path, len(jobs),
                            len(self._undecided))
            self.writes.failing, self._unsaved, self._undecided = None, {}, []
        else:
            self._unsaved = jobs

    def holds(self, job_id: str) -> bool:
        """Whether the table has a row for the job (one that ended long ago is kept here, not in memory)."""
        return self.db.execute("SELECT 1 FROM jobs WHERE id=?", (job_id,)).fetchone() is not None

    def load(self, only_live: bool = False) -> list[Job]:
        cols = list(IDENTITY) + ["stats"]
        q = f"SELECT {','.join(cols)} FROM jobs"
        if only_live:
            q += " WHERE state NOT IN ('exited','failed','killed','lost')"
        jobs = []
        for row in self.db.execute(q + " ORDER BY created, id"):
            d = dict(zip(cols, row))
            stats = json.loads(d.pop("stats") or "{}")
            d["argv"] = json.loads(d["argv"] or "[]")
            d["managed"] = bool(d["managed"])
            job = Job(**d)
            for k, v in stats.items():
                if hasattr(job, k):
                    setattr(job, k, v)
            jobs.append(job)
        return jobs

    def prune(self, ended_before: float) -> int:
        """Forgets jobs that ended before `ended_before` (wall time); returns how many."""
        cur = self.db.execute("DELETE FROM jobs WHERE state IN ('exited','failed','killed','lost') "
                              "AND json_extract(stats, '$.ended') < ?", (ended_before,))
        return cur.rowcount

    def decide(self, gpu: Optional[int], kind: str, jobs: list, numbers: dict, text: str) -> dict:
        args = (kind, text, jobs, numbers, gpu, time.time())
        out = []
        if not self.writes.attempt(lambda: out.append(self.log.record(*args))):
            self._undecided.append(args)
            return self.log.entry(*args)
        return out[0]

    def decisions(self, limit: int = 100) -> list[dict]:
        return self.log.recent(limit)

    @property
    def failing(self) -> Optional[str]:
        return self.writes.failing

    def close(self) -> None:
        self.db.close()
