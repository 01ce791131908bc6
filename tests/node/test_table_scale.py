"""gmuxd's table at scale: ended jobs do not pile up, and `gmux ps` always fits one reply, whatever jobs report.

Before: after 3,000 registrations, or with 18 jobs each sending a 60 KB report, `ps` failed ("message of
2623108 bytes exceeds the 1048576-byte limit"), and ended jobs were never removed."""
import msgpack

from gmux import protocol
from node_harness import ask, register


def _ps_size(d, **fields):
    reply = ask(d, "ps", admin=d.admin, **fields)
    assert reply["ok"], reply["error"]
    return len(msgpack.packb(reply)), reply["data"]


def test_three_thousand_registrations_keep_the_table_and_ps_bounded(daemon_factory):
    d = daemon_factory(keep_ended=100)
    for i in range(3000):
        reg = register(d, f"job-{i}".encode(), ["python", "train.py", "--run", str(i), "x" * 500])
        assert ask(d, "bye", f"job-{i}".encode(), job=reg["job"], token=reg["token"], status=0)["ok"]
    d._last_reap = 0.0
    d.tick()
    assert sum(j.final for j in d.jobs.values()) == 100            # the newest 100 ended jobs stay in the table
    assert {j.id for j in d.jobs.values()} == {f"j{i}" for i in range(2901, 3001)}
    size, data = _ps_size(d)
    assert size <= protocol.MAX_FRAME and data["jobs_total"] == 100 and data["jobs_shown"] == 100
    size, data = _ps_size(d, limit=10)
    assert [j["id"] for j in data["jobs"]] == [f"j{i}" for i in range(2991, 3001)]


def test_big_reports_and_argvs_of_many_live_jobs_still_fit_one_ps(daemon_factory):
    d = daemon_factory()
    fat = {f"figure_{k}": "y" * 1000 for k in range(60)}          # as big as a report may be (64 figures)
    for i in range(300):
        reg = register(d, f"job-{i}".encode(), ["python", "t.py", *["--flag"] * 1000])
        assert ask(d, "report", f"job-{i}".encode(), job=reg["job"], token=reg["token"], report=fat)["ok"]
    size, data = _ps_size(d)
    assert size <= protocol.MAX_FRAME
    assert data["jobs_total"] == 300 and data["jobs_shown"] == 100          # live jobs first, at most 100 by default
    job = data["jobs"][0]
    assert len(job["argv"]) == 17 and job["argv"][-1] == "..." and len(job["report"]["figure_0"]) == 64
    _, data = _ps_size(d, limit=300)
    assert data["jobs_shown"] == 300


def test_a_report_beyond_the_typed_bounds_is_refused_and_changes_nothing(daemon):
    reg = register(daemon, b"job-a", ["python", "t.py"])
    ok = ask(daemon, "report", b"job-a", job=reg["job"], token=reg["token"], report={"step": 3})
    assert ok["ok"]
    daemon.sent.clear()
    daemon.server.receive(b"job-a", [msgpack.packb({"v": protocol.VERSION, "type": "report", "id": 6, "job": reg["job"],
                                                    "token": reg["token"], "report": {"blob": "z" * 60_000}})])
    (bad,) = [m for i, m in daemon.sent if m["type"] == "reply"]
    assert not bad["ok"] and "exceeds 1024" in bad["error"]
    assert daemon.jobs[reg["job"]].last_report == {"step": 3}


def test_sqlite_forgets_jobs_ended_before_the_retention(tmp_path):
    import time
    from gmux.node.jobs import Job
    from gmux.node.store import Store
    store = Store(str(tmp_path / "g.db"))
    old = Job("j1", "t", "", ["python"], state="exited", ended=time.time() - 40 * 86400)
    recent = Job("j2", "t", "", ["python"], state="failed", ended=time.time() - 86400)
    live = Job("j3", "t", "", ["python"], state="running")
    for j in (old, recent, live):
        store.save(j)
    assert store.prune(time.time() - 30 * 86400) == 1
    assert sorted(j.id for j in store.load()) == ["j2", "j3"]
    store.close()
