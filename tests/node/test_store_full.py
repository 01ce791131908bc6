"""A full disk (or any failed write) never takes gmuxd down and loses nothing it acknowledged.

Before: with gmuxd's runtime directory on a full filesystem, gmuxd exited about 8 s later ("database or disk is
full", then "cannot rollback - no transaction is active"). SQLite's max_page_count makes the database full here
exactly as a full disk does (SQLITE_FULL), without needing a small filesystem."""
import os

from gmux.node.jobs import Job
from gmux.node.store import Store
from gmux_testkit import BIG_ARGV, fill_db
from node_harness import ask, register


def test_a_full_database_is_survived_and_caught_up(tmp_path):
    path = str(tmp_path / "g.db")
    store = Store(path)
    fill_db(store.db)
    ids = [store.next_job_id() for _ in range(3)]
    jobs = [Job(i, "t", "", ["python", "x" * 20000]) for i in ids]
    for j in jobs:
        store.save(j)                                   # each fails: kept for later, no exception
    d = store.decide(0, "start", [ids[0]], {"n": 1}, "started while the disk was full")
    store.save_many(jobs)                               # a flush while still full: still kept
    assert store.failing and "full" in store.failing and d["text"].startswith("started")
    assert len(set(ids)) == 3
    store.db.execute("PRAGMA max_page_count=1073741823")   # space again
    store.save_many([])
    assert store.failing is None
    store.close()
    again = Store(path)
    assert sorted(j.id for j in again.load()) == sorted(ids)
    assert [x["text"] for x in again.decisions()] == ["started while the disk was full"]
    assert again.next_job_id() not in ids               # ids stay unique across the outage and a restart
    again.close()


def test_gmuxd_keeps_serving_while_its_database_is_full(daemon):
    fill_db(daemon.store.db)
    a = register(daemon, b"job-a", BIG_ARGV)
    b = register(daemon, b"job-b", BIG_ARGV)
    assert a["job"] != b["job"]
    daemon._last_flush = 0.0
    daemon.tick()                                       # the flush fails inside: the loop goes on
    ps = ask(daemon, "ps", admin=daemon.admin)
    assert ps["ok"] and {j["id"] for j in ps["data"]["jobs"]} == {a["job"], b["job"]}
    assert "full" in ps["data"]["daemon"]["store"]
    assert daemon.internal_errors == 0
    daemon.store.db.execute("PRAGMA max_page_count=1073741823")
    daemon._last_flush = 0.0
    daemon.tick()
    assert ask(daemon, "ps", admin=daemon.admin)["data"]["daemon"]["store"] is None
    assert {j.id for j in daemon.store.load()} == {a["job"], b["job"]}


def test_a_job_ends_although_its_files_cannot_be_removed(daemon):
    """On a filesystem gone read-only, removing an ended job's spill file failed (for another reason than its
    absence): the job was never finished, its share never freed. Here its directory is replaced by a file, which
    refuses the removal to any user."""
    a = register(daemon, b"job-a")
    ckpts = daemon.rundir.checkpoints()
    os.rename(ckpts, ckpts + ".away")
    open(ckpts, "w").close()
    assert ask(daemon, "bye", b"job-a", job=a["job"], token=a["token"], status=0)["ok"]
    assert daemon.jobs[a["job"]].state == "exited"
    assert daemon.slicers[0].entries == {}
