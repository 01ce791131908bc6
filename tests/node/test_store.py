"""The job table and decisions survive closing and reopening the database (a daemon restart)."""
import sqlite3

from gmux.node.jobs import Job
from gmux.node.store import Store


def test_jobs_and_decisions_persist(tmp_path):
    path = str(tmp_path / "g.db")
    s = Store(path)
    assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    ids = [s.next_job_id() for _ in range(3)]
    assert ids == ["j1", "j2", "j3"]
    j = Job(ids[0], "tok", "n", ["python", "t.py"], "/", pid=42, starttime=7, gpu=1, weight=2.0, mem=5, state="running")
    j.gpu_seconds, j.suspends, j.rate_solo, j.held = 12.5, 3, 9.5, True
    s.save(j)
    j.state = "suspended"
    s.save(j)
    s.decide(1, "keep", ["j1", "j2"], {"sum": 1.4}, "kept")
    s.close()
    s2 = Store(path)
    (k,) = s2.load(only_live=True)
    assert (k.id, k.token, k.argv, k.pid, k.starttime, k.gpu, k.weight, k.state) == \
        ("j1", "tok", ["python", "t.py"], 42, 7, 1, 2.0, "suspended")
    assert (k.gpu_seconds, k.suspends, k.rate_solo, k.held) == (12.5, 3, 9.5, True)
    assert s2.next_job_id() == "j4"       # ids are never reused
    (d,) = s2.decisions()
    assert d["numbers"] == {"sum": 1.4} and d["jobs"] == ["j1", "j2"]
    k.state = "exited"
    s2.save(k)
    assert s2.load(only_live=True) == []
    assert sqlite3.connect(path).execute("SELECT count(*) FROM jobs").fetchone()[0] == 1
