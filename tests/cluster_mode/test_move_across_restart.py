"""gmux-scheduler killed in the middle of a move, while the target's new process starts: the restarted scheduler
carries the move on from SQLite (it sends at once, since the target's "ready" may have gone with the old process),
and the job ends bit-identical, moved once, never restarted. The scheduler's side of a move from its table: a move
recovered from SQLite, and a move's events from its two machines in either order."""
import json
import os
import signal

from cluster_harness import Solo, paced, spawned, unpace, wait_for

STEPS = "6000"


def test_a_move_under_way_survives_a_scheduler_restart(cluster_factory, tmp_path):
    c = cluster_factory(policy="gandiva", machines=("m1", "m2"))
    args = (STEPS, "--batch", "20", *paced(tmp_path, "0.003"))
    ref = Solo(tmp_path, "ref", *args)
    c.wait_machines(2)
    out = tmp_path / "moved.json"
    cjob = c.submit(str(out), *args)
    first = wait_for(lambda: (lambda j: j["state"] == "running" and j["step"] > 200 and j)(c.job(cjob)), 60,
                     "job running")
    src = first["machine"]
    dst = "m2" if src == "m1" else "m1"
    c.call("c_migrate", cjob=cjob, machine=dst, gpu=1)
    # The target's new process is spawned (cold: it imports torch for seconds before it is ready): held there
    # (SIGSTOP) while the scheduler is killed and started again, so that it cannot be ready before.
    target = spawned(tmp_path, dst, cjob, 30)
    os.kill(target, signal.SIGSTOP)
    c.sched.send_signal(signal.SIGKILL)
    c.sched.wait()
    # (had the target been ready before the kill, the move would have gone on without the restart's help)
    assert "migrate_out" not in [d["kind"] for d in _decisions(tmp_path) if d["cjob"] == cjob]
    c.start_scheduler()
    os.kill(target, signal.SIGCONT)
    moved = wait_for(lambda: (lambda j: j["migrations"] == 1 and j["state"] == "running" and j)(c.job(cjob)), 90,
                     lambda: f"the move carried on: {c.job(cjob)}")
    assert moved["machine"] == dst
    text = " ".join(d["text"] for d in c.ps()["decisions"] if d.get("cjob") == cjob)
    assert "the scheduler restarted while they started" in text and f"restored on {dst}" in text
    unpace(tmp_path)
    jobs = c.wait_done([cjob], 180)
    assert jobs[cjob]["migrations"] == 1 and jobs[cjob]["restarts"] == 0
    res = json.loads(out.read_text())
    assert res["sha256"] == ref["sha256"] and res["steps"] == int(STEPS) and res["restored_at"] > 0


def _decisions(tmp_path) -> list:
    """The decisions the killed scheduler had written (its SQLite, read directly)."""
    import sqlite3
    db = sqlite3.connect(tmp_path / "sched" / "scheduler.db")
    try:
        return [{"kind": k, "cjob": json.loads(j)[0] if j and json.loads(j) else None}
                for k, j in db.execute("SELECT kind, jobs FROM decisions")]
    finally:
        db.close()


def test_a_jobs_move_is_kept_in_sqlite_and_an_older_database_gains_none(tmp_path):
    from gmux.cluster.scheduler.state import CJob, State
    st = State(str(tmp_path / "s.db"))
    move = {"stage": "sending", "since": 12.5, "target": "m2", "endpoint": "tcp://h:1", "xfer": "c1-m1-7"}
    st.save(CJob("c1", ["python", "t.py"], "/", state="migrating", machine="m2", source="m1", move=move))
    st.save(CJob("c2", ["python", "t.py"], "/"))
    st.close()
    jobs = State(str(tmp_path / "s.db")).load_jobs()
    assert jobs["c1"].move == move and jobs["c2"].move == {}
    # a database an older gmux-scheduler wrote, without the column: every job loads with no move under way
    import sqlite3
    db = sqlite3.connect(tmp_path / "s.db")
    db.execute("ALTER TABLE jobs DROP COLUMN move")
    db.commit()
    db.close()
    assert State(str(tmp_path / "s.db")).load_jobs()["c1"].move == {}


def _migrating(tmp_path, stage):
    """A scheduler started over a table whose job c1 is moving from m1 to m2, at `stage`."""
    import time
    from gmux.cluster.scheduler.service import Options, Scheduler
    from gmux.cluster.scheduler.state import CJob, Machine, State
    from gmux.wire import keys
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    st = State(str(tmp_path / "state" / "scheduler.db"))
    move = {"stage": stage, "since": 5.0, "target": "m2", "endpoint": "tcp://127.0.0.1:1", "xfer": "c1-m1-1"}
    st.save(CJob("c1", ["python", "t.py"], "/", state="migrating", machine="m2", gpu=0, rank_gpus=[0],
                 source="m1", source_gpus=[0], move=move))
    for m in ("m1", "m2"):
        st.save_machine(Machine(m, [{"index": 0, "mem_total": 1 << 30}], "tcp://127.0.0.1:1", last_seen=time.time()))
    st.close()
    return Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*"))


def test_a_source_not_yet_reconnected_is_asked_again_and_the_move_stays_warming(tmp_path):
    """A restarted scheduler's first ticks come before the machines' links are back: the migrate_out cannot be
    delivered, and the move must not be taken as sending (it would wait for a send nobody makes)."""
    import time
    from gmux.cluster.scheduler.moves import WARM_WAIT_S
    from gmux.cluster.scheduler.state import State
    s = _migrating(tmp_path, "warming")
    try:
        job = s.jobs["c1"]
        assert job.move["since"] == -WARM_WAIT_S          # recovered: to be sent at once
        for _ in range(3):
            s.moves.expire(time.monotonic())
        assert job.move["stage"] == "warming" and job.state == "migrating"
        assert "migrate_out" not in [d["kind"] for d in s.recent]
        assert State(str(tmp_path / "state" / "scheduler.db")).load_jobs()["c1"].move["stage"] == "warming"
    finally:
        s.close()


# A move's two links speak on two paths: the target's "started" (the job restored and past a boundary there) can
# reach the scheduler before the source's "migrate_sent". The move completes on the first; the second still logs
# the transfer's figures, which `gmux ps --cluster` and the migration benchmarks read.
SENT = {"xfers": ["c1-m1-1"], "bytes": 4096, "sealed_bytes": 4096, "seconds": 0.25}


def _event(s, machine, ev, data):
    s._daemon_node_event(machine, machine.encode(), {"cjob": "c1", "event": ev, "data": data}, None)


def _sent(s) -> list:
    return [d for d in s.recent if d["kind"] == "migrate_sent"]


def test_the_sources_migrate_sent_after_the_targets_started_still_logs_the_transfer(tmp_path):
    s = _migrating(tmp_path, "sending")
    try:
        _event(s, "m2", "started", {"step": 40, "local": "j1"})
        job = s.jobs["c1"]
        assert job.state == "running" and job.machine == "m2" and job.migrations == 1 and job.source is None
        assert _sent(s) == []
        _event(s, "m1", "migrate_sent", SENT)
        [d] = _sent(s)
        assert d["numbers"]["bytes"] == 4096 and "sent m1 -> m2" in d["text"]
        assert job.state == "running" and job.machine == "m2" and job.migrations == 1   # the move stays done
        _event(s, "m1", "migrate_sent", SENT)       # (a repeat, or one from another machine, is not logged)
        _event(s, "m2", "migrate_sent", SENT)
        assert len(_sent(s)) == 1
    finally:
        s.close()


def test_in_the_usual_order_the_transfer_is_logged_once(tmp_path):
    s = _migrating(tmp_path, "sending")
    try:
        _event(s, "m1", "migrate_sent", SENT)
        assert s.jobs["c1"].move["stage"] == "sent"
        _event(s, "m2", "started", {"step": 40, "local": "j1"})
        assert len(_sent(s)) == 1 and s.jobs["c1"].migrations == 1 and s.jobs["c1"].state == "running"
    finally:
        s.close()


def test_a_given_up_move_recovered_asks_its_machine_again_and_settles_on_its_answer(tmp_path):
    """A move given up waits for one machine's answer to an "abandon": a scheduler restarted before it heard it
    asked nobody again (a failed target's source) or trusted that it had been told (an abandoned move's target),
    and the job stayed "migrating" for good. Recovered, each is asked again, and the answer settles the move."""
    import time
    # (a move recorded before moves said whether the job ran: taken as running, its source resumes it)
    for stage, asked, answer in (("target_failed", ("m1", "abandon", "c1", {"of": "send", "resume": True}),
                                  ("m1", "migrate_failed")),
                                 ("abandoned", ("m2", "abandon", "c1", {"of": "start"}), ("m2", "start_failed"))):
        where = tmp_path / stage
        s = _migrating(where, stage)
        try:
            sent = []
            s._action = lambda machine, action, cjob, **args: sent.append((machine, action, cjob, args)) or True
            s.moves.expire(time.monotonic())
            assert sent == [asked]
            s.moves.expire(time.monotonic())        # told: not asked again at every tick
            assert sent == [asked]
            _event(s, *answer, {})
            job = s.jobs["c1"]
            assert job.state == "running" and job.machine == "m1" and job.source is None and job.move == {}
        finally:
            s.close()
