"""A move's two links speak on two paths: the target's "started" (the job restored and past a boundary there) can
reach gmux-scheduler before the source's "migrate_sent". The move completes on the first; the second still
logs the transfer's figures, which `gmux ps --cluster` and the migration benchmarks read."""
import time

from gmux.cluster.scheduler.service import Options, Scheduler
from gmux.cluster.scheduler.state import CJob, Machine, State
from gmux.wire import keys

SENT = {"xfers": ["c1-m1-1"], "bytes": 4096, "sealed_bytes": 4096, "seconds": 0.25}


def _scheduler(tmp_path) -> Scheduler:
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    st = State(str(tmp_path / "state" / "scheduler.db"))
    move = {"stage": "sending", "since": 5.0, "target": "m2", "endpoint": "tcp://127.0.0.1:1", "xfer": "c1-m1-1"}
    st.save(CJob("c1", ["python", "t.py"], "/", state="migrating", machine="m2", gpu=0, rank_gpus=[0],
                 source="m1", source_gpus=[0], move=move))
    for m in ("m1", "m2"):
        st.save_machine(Machine(m, [{"index": 0, "mem_total": 1 << 30}], "tcp://127.0.0.1:1", last_seen=time.time()))
    st.close()
    return Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*"))


def _event(s, machine, ev, data):
    s._daemon_node_event(machine, machine.encode(), {"cjob": "c1", "event": ev, "data": data}, None)


def _sent(s) -> list:
    return [d for d in s.recent if d["kind"] == "migrate_sent"]


def test_the_sources_migrate_sent_after_the_targets_started_still_logs_the_transfer(tmp_path):
    s = _scheduler(tmp_path)
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
    s = _scheduler(tmp_path)
    try:
        _event(s, "m1", "migrate_sent", SENT)
        assert s.jobs["c1"].move["stage"] == "sent"
        _event(s, "m2", "started", {"step": 40, "local": "j1"})
        assert len(_sent(s)) == 1 and s.jobs["c1"].migrations == 1 and s.jobs["c1"].state == "running"
    finally:
        s.close()
