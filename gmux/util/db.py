"""SQLite as gmuxd and gmux-scheduler keep their tables: one way to open a database, one way to make a
transaction, and the decision log both write (every decision with its numbers, shown by `gmux decisions`).

WAL with synchronous=NORMAL: durable across a process crash, and `sqlite3 FILE` can read while a daemon
writes. Autocommit (isolation_level=None): each lone write is its own small transaction; a group of writes
goes through `transaction`, which takes the write lock at BEGIN (IMMEDIATE), so two processes sharing a
database never both read a counter and both write it.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from typing import Callable, Iterator, Optional


def open_db(path: str) -> sqlite3.Connection:
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


class FallibleWrites:
    """Writes that may fail (a full disk, an I/O error) without taking their server down: each is tried, and
    `failing` says what the last failed one said, until the server's next flush succeeds and clears it."""

    def __init__(self, path: str, log: logging.Logger):
        self.path, self._log = path, log
        self.failing: Optional[str] = None

    def attempt(self, fn: Callable[[], object]) -> bool:
        try:
            fn()
        except sqlite3.Error as e:
            if self.failing is None:
                self._log.error("cannot write %s: %s; serving from memory and retrying at every flush", self.path, e)
            self.failing = f"cannot write {self.path}: {e}"
            return False
        return True


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        # SQLite may have rolled back itself (a full disk fails the COMMIT): a second ROLLBACK would raise
        # "cannot rollback - no transaction is active" over the error that matters.
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def columns(db: sqlite3.Connection, table: str) -> set:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


class DecisionLog:
    """The `decisions` table: when, on which GPU (None: the machine or the cluster), what kind, which jobs,
    the numbers that decided it, and a sentence saying it."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        db.execute("CREATE TABLE IF NOT EXISTS decisions (seq INTEGER PRIMARY KEY AUTOINCREMENT, t REAL, "
                   "gpu INTEGER, kind TEXT, jobs TEXT, numbers TEXT, text TEXT)")
        have = columns(db, "decisions")
        for col in ("gpu", "jobs"):
            if col not in have:      # a table written by an older gmux-scheduler (one job per row, `cjob`)
                db.execute(f"ALTER TABLE decisions ADD COLUMN {col}")
                if col == "jobs" and "cjob" in have:
                    db.execute("UPDATE decisions SET jobs = json_array(cjob) WHERE cjob IS NOT NULL")

    @staticmethod
    def entry(kind: str, text: str, jobs=(), numbers: Optional[dict] = None, gpu: Optional[int] = None,
              t: Optional[float] = None) -> dict:
        """A decision as it is shown (and written)."""
        return {"t": time.time() if t is None else t, "gpu": gpu, "kind": kind, "jobs": list(jobs),
                "numbers": numbers or {}, "text": text}

    def record(self, kind: str, text: str, jobs=(), numbers: Optional[dict] = None, gpu: Optional[int] = None,
               t: Optional[float] = None) -> dict:
        d = self.entry(kind, text, jobs, numbers, gpu, t)
        self.db.execute("INSERT INTO decisions (t, gpu, kind, jobs, numbers, text) VALUES (?,?,?,?,?,?)",
                        (d["t"], gpu, kind, json.dumps(d["jobs"]), json.dumps(d["numbers"], default=str), text))
        return d

    def recent(self, limit: int = 100) -> list[dict]:
        rows = self.db.execute("SELECT t, gpu, kind, jobs, numbers, text FROM decisions ORDER BY rowid DESC LIMIT ?",
                               (limit,)).fetchall()
        return [{"t": t, "gpu": g, "kind": k, "jobs": json.loads(j or "[]"), "numbers": json.loads(n or "{}"),
                 "text": x} for t, g, k, j, n, x in reversed(rows)]
