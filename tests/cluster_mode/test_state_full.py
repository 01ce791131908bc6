"""A full disk under the scheduler's --state never stops it answering its daemons.

Before: every node_report raised "database or disk is full" (an internal error each, with its traceback), no
daemon was answered, so each fenced itself and suspended every cluster job, while `gmux ps --cluster` said all was
well. SQLite's max_page_count makes the database full here exactly as a full disk does."""
import time

from gmux.cluster.scheduler.client_handlers import ClientHandlers
from gmux.cluster.scheduler.state import CJob, Machine, State
from gmux_testkit import BIG_ARGV as BIG, fill_db
from test_unheard import event, report, sched  # noqa: F401 (sched: a scheduler without daemons)


def test_a_full_state_database_is_survived_and_caught_up(tmp_path):
    path = str(tmp_path / "state.db")
    st = State(path)
    fill_db(st.db)
    ids = [st.next_id() for _ in range(3)]
    jobs = [CJob(i, BIG, "/") for i in ids]
    for j in jobs:
        st.save(j)                                          # each fails: kept for later, no exception
    st.save_machine(Machine("m1", [{"index": 0, "mem_total": 1}], "tcp://127.0.0.1:1"))
    d = st.decide("start", ids[0], "started while the disk was full")
    st.save_many([])                                        # a flush while still full: still kept
    assert st.failing and "full" in st.failing and d["text"].startswith("started") and d["cjob"] == ids[0]
    assert len(set(ids)) == 3
    st.db.execute("PRAGMA max_page_count=1073741823")       # space again
    st.save_many([])
    assert st.failing is None
    st.close()
    again = State(path)
    assert sorted(again.load_jobs()) == sorted(ids) and list(again.load_machines()) == ["m1"]
    assert [x["text"] for x in again.decisions()] == ["started while the disk was full"]
    assert again.next_id() not in ids                       # ids stay unique across the outage and a restart
    again.close()


def test_the_scheduler_answers_reports_and_says_so_while_its_state_is_full(sched):
    fill_db(sched.state.db)
    sched.jobs["c1"].argv = BIG
    errors = sched.internal_errors
    report(sched)
    event(sched, "checkpointed", "", step=12, xfers=[])
    sched.tick(time.monotonic())
    assert sched.internal_errors == errors
    ps = ClientHandlers(sched).ps("tester", b"x", {"all": True}, None)
    assert "full" in ps["store"] and [j["cjob"] for j in ps["jobs"]] == ["c1"]
    sched.state.db.execute("PRAGMA max_page_count=1073741823")
    sched.tick(time.monotonic())
    sched.state.save_many([])
    assert ClientHandlers(sched).ps("tester", b"x", {"all": True}, None)["store"] is None


def test_an_id_a_daemon_runs_that_the_state_lost_is_never_given_again(sched):
    """Killed while its state could not be written, a restarted scheduler gave a new job the id of one a daemon
    still ran (c20): the old process was reported as the new job, which never ran."""
    report_jobs = [{"cjob": "c20", "local": "j7", "state": "suspended", "step": 5, "gpu": 0, "held": True}]
    sched._daemon_node_report("m1", b"m1", {"name": "m1", "gpus": [{"index": 0, "mem_total": 1 << 30}],
                                            "transfer": "tcp://127.0.0.1:1", "jobs": report_jobs}, None)
    assert sched.state.next_id() == "c21"
