"""Which of gmuxd's records speaks for a cluster job: the process the link started last; after the link restarted
(it no longer knows those pids), the live one, so that an ended incarnation with a higher number (a start that
failed after the job came back, a copy released) never reports a running job as ended."""
from gmux.node.cluster_records import gang_record, ranks_by_job


def rec(local, name, state, pid, **kw):
    return {"id": local, "name": name, "state": state, "pid": pid, "step": kw.get("step", 5), "gpu": 0,
            "exit_status": kw.get("exit_status"), "detail": kw.get("detail", "")}


def test_after_a_link_restart_the_live_record_speaks_for_the_job():
    jobs = [rec("j4", "c1", "running", 40), rec("j9", "c1", "failed", 90, exit_status=1),
            rec("j2", "c2", "killed", 20), rec("j3", "c2", "exited", 30, exit_status=0),
            rec("j5", "c3.0", "running", 50), rec("j6", "c3.1", "running", 60), rec("j8", "c3.1", "killed", 80),
            rec("j7", "not-a-cluster-job", "running", 70)]
    by_job = ranks_by_job(jobs, {})
    assert {c: {r: j["id"] for r, j in ranks.items()} for c, ranks in by_job.items()} == \
        {"c1": {0: "j4"}, "c2": {0: "j3"}, "c3": {0: "j5", 1: "j6"}}
    assert gang_record("c1", 1, by_job["c1"])["state"] == "running"
    assert gang_record("c3", 2, by_job["c3"])["state"] == "running"
    # The link that started them knows their pids: the last start speaks, live or not.
    by_job = ranks_by_job(jobs, {"c1": [90]})
    assert by_job["c1"][0]["id"] == "j9"


def test_a_job_computing_with_no_boundary_seen_is_said_to_run_boundless_unless_it_restores():
    """A cluster job whose steps gmux does not see stayed "starting" for its whole life (and could be neither
    suspended nor moved), ending "done" at step 0: step 0 was all the scheduler could go by."""
    def one(state, started, step=0):
        return {0: {**rec("j1", "c1", state, 10, step=step), "started": started}}
    assert gang_record("c1", 1, one("running", False))["boundless"]
    assert not gang_record("c1", 1, one("running", False), restoring=True)["boundless"]    # still restoring
    assert not gang_record("c1", 1, one("running", True, 5))["boundless"]                   # its steps are seen
    assert not gang_record("c1", 1, one("waiting", False))["boundless"]
    assert not gang_record("c1", 2, one("running", False))["boundless"]                     # a rank missing
    assert not gang_record("c1", 1, one("failed", False))["boundless"]


def test_the_scheduler_counts_a_boundless_job_running(tmp_path):
    import time

    from gmux.cluster.scheduler.service import Options, Scheduler
    from gmux.cluster.scheduler.state import CJob, Machine
    from gmux.wire import keys
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    s = Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*"))
    try:
        s.machines = {"m1": Machine("m1", [{"index": 0, "mem_total": 1 << 30}], "tcp://127.0.0.1:1",
                                    last_seen=time.time())}
        s.jobs = {"c1": CJob("c1", ["python", "t.py"], "/", state="starting", machine="m1", gpu=0, rank_gpus=[0],
                             owner="tester")}
        for boundless, expected in ((False, "starting"), (True, "running")):
            s._daemon_node_report("m1", b"m1", {"name": "m1", "gpus": [{"index": 0, "mem_total": 1 << 30}],
                                                "transfer": "tcp://127.0.0.1:1",
                                                "jobs": [{"cjob": "c1", "local": "j1", "state": "running", "step": 0,
                                                          "gpu": 0, "boundless": boundless}]}, None)
            assert s.jobs["c1"].state == expected
    finally:
        s.close()


def test_a_start_that_restores_is_not_started_before_it_has_restored(tmp_path):
    """A move's target waiting for its checkpoint computes nothing yet shows running, not started: taken for a
    boundless job, it was reported started at step 0, the source was released and the job's work lost."""
    from gmux.node.cluster_starts import Starts
    from gmux.rundir import RuntimeDir
    said = []
    starts = Starts(RuntimeDir(str(tmp_path / "rt")), lambda ev, cjob, detail="", **d: said.append((ev, cjob, d)),
                    None)
    waiting = {**rec("j1", "c1", "running", 10, step=0), "started": False, "report": {"awaiting_restore": True}}
    for restoring, report in ((["x"], {"awaiting_restore": True}), (["x"], {}), ([], {"awaiting_restore": True})):
        starts.begin("c1", restoring)
        by_rank = {0: {**waiting, "report": report}}
        starts.observe("c1", gang_record("c1", 1, by_rank, bool(restoring)), by_rank, 1)
        assert [e for e in said if e[0] == "started"] == [], (restoring, report)
    starts.begin("c1", [])                     # a start from nothing, computing with no boundary: it runs
    by_rank = {0: {**waiting, "report": {}}}
    starts.observe("c1", gang_record("c1", 1, by_rank), by_rank, 1)
    assert [e[0] for e in said if e[0] == "started"] == ["started"]


def test_a_gang_that_failed_is_told_by_the_rank_that_failed_not_by_the_peer_killed_for_it():
    """Rank 1 raised; rank 0, killed by gmuxd as its peer, spoke for the gang (the lowest rank ended), and the
    scheduler showed a signal from outside gmux where the rank's RuntimeError was (an outside tester)."""
    by_rank = {0: rec("j5", "c1.0", "killed", 50, detail="rank 1 of its gang failed"),
               1: rec("j6", "c1.1", "failed", 60, exit_status=1, detail="RuntimeError: rank 1 fails at step 100")}
    r = gang_record("c1", 2, by_rank)
    assert r["state"] == "failed" and r["exit_status"] == 1, r
    assert r["detail"] == "rank 1: RuntimeError: rank 1 fails at step 100", r
    by_rank[1]["state"] = "killed"                   # both killed (a user's kill): the lowest rank, as before
    assert gang_record("c1", 2, by_rank)["detail"].startswith("rank 0: ")


def test_a_job_whose_gmuxd_gave_its_gpus_to_others_is_said_parked_on_rank_0s():
    def rank(i, parked, state="held"):
        return {"id": f"j{i}", "name": f"c1.{i}", "state": state, "gpu": None if parked else i,
                "parked_gpus": [i + 2] if parked else [], "held": True}
    assert gang_record("c1", 1, {0: rank(0, True)})["parked_gpu"] == 2
    assert gang_record("c1", 2, {0: rank(0, True), 1: rank(1, True)})["parked_gpu"] == 2
    assert gang_record("c1", 2, {0: rank(0, True), 1: rank(1, False)})["parked_gpu"] is None   # one still there
    assert gang_record("c1", 1, {0: rank(0, False)})["parked_gpu"] is None
    assert gang_record("c1", 1, {0: rank(0, True, "exited")})["parked_gpu"] is None


def test_a_job_a_rank_of_which_is_unmovable_says_why_for_the_scheduler():
    """The scheduler did not know: it accepted a move of such a job and started its processes on the target, whose
    restore the source then refused. The record now says which rank, and why, in the rank's own report's words."""
    def rank(i, unmovable=None, state="running"):
        return {**rec(f"j{i}", f"c1.{i}", state, 10 + i), "report": {"movable": unmovable is None,
                                                                    "unmovable": unmovable}}
    assert "unmovable" not in gang_record("c1", 2, {0: rank(0), 1: rank(1)})
    assert gang_record("c1", 2, {0: rank(0), 1: rank(1, "an optimizer attach() was not given")})["unmovable"] == \
        "rank 1: an optimizer attach() was not given"
    assert gang_record("c1", 1, {0: rank(0, "x" * 2000)})["unmovable"] == "x" * 500
    assert "unmovable" not in gang_record("c1", 2, {0: rank(0), 1: rank(1, "gone", state="exited")})
