"""gmuxd's tables in SQLite (WAL): jobs and decisions survive a daemon restart.

Writes happen on state changes and on a periodic flush of measurements, not on every report, so a busy
daemon is not bound by fsync (gmux.util.db: WAL, transactions, the decision log).
"""
from __future__ import annotations

import json
from typing import Iterable, Optional

from gmux.node.jobs import IDENTITY, Job
from gmux.util.db import DecisionLog, open_db, transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, token TEXT NOT NULL, name TEXT, argv TEXT, cwd TEXT, pid INTEGER, starttime INTEGER,
    gpu INTEGER, weight REAL, mem INTEGER, state TEXT, managed INTEGER, created REAL, detail TEXT,
    exit_status INTEGER, stats TEXT
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


class Store:
    def __init__(self, path: str):
        self.path = path
        self.db = open_db(path)
        self.db.executescript(SCHEMA)
        self.log = DecisionLog(self.db)

    def next_job_id(self) -> str:
        """Job ids are never reused, also across restarts, so logs and checkpoints never collide."""
        with transaction(self.db):
            row = self.db.execute("SELECT value FROM meta WHERE key='next_job'").fetchone()
            n = int(row[0]) if row else 1
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('next_job', ?)", (str(n + 1),))
        return f"j{n}"

    def save(self, job: Job) -> None:
        r = job.row()
        cols = list(IDENTITY) + ["stats"]
        vals = [json.dumps(r["argv"]) if c == "argv" else json.dumps(r["stats"]) if c == "stats"
                else int(r[c]) if c == "managed" else r[c] for c in cols]
        self.db.execute(f"INSERT INTO jobs ({','.join(cols)}) VALUES ({','.join('?' * len(cols))}) "
                        f"ON CONFLICT(id) DO UPDATE SET {','.join(f'{c}=excluded.{c}' for c in cols[1:])}", vals)

    def save_many(self, jobs: Iterable[Job]) -> None:
        with transaction(self.db):
            for j in jobs:
                self.save(j)

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
        return self.log.record(kind, text, jobs, numbers, gpu)

    def decisions(self, limit: int = 100) -> list[dict]:
        return self.log.recent(limit)

    def close(self) -> None:
        self.db.close()
