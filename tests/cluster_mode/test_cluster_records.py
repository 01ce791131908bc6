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
