"""A spill that fails is not asked for again: a job whose state cannot go to disk (a full disk, a tier that
cannot spill) stays suspended in host memory, in an in-process gmuxd whose sends are recorded. Found by an
outside operator's review: an explicit job's spill by checkpoint failing on a full disk was asked for again at
every tick (660 warnings and 48 decisions in 25 s, each writing tens of MB before failing)."""
import time

from test_move_in_process import MiB, ack, commands, started, tick
from node_harness import GiB, ask


def test_a_spill_by_checkpoint_that_fails_is_not_asked_for_again(daemon_factory):
    d = daemon_factory((GiB,), host_budget=MiB)
    a = started(d, b"a", migratable=True)
    ask(d, "suspend", admin=d.admin, job=a["job"])
    (stop,) = commands(d, b"a")
    ack(d, b"a", a, stop, state="suspended", bytes=64 * MiB)        # held in host memory, past the budget
    tick(d)
    (spill,) = commands(d, b"a")
    assert spill["kind"] == "migrate" and spill["args"]["spill"], spill
    ack(d, b"a", a, spill, ok=False, error="[Errno 28] No space left on device", state="suspended")
    job = d.jobs[a["job"]]
    assert job.spill_refused and job.target_gpu is None and job.gpu == 0, job
    for _ in range(5):
        tick(d)
        assert not commands(d, b"a"), d.sent
    assert "No space left on device" in job.detail


def _suspended_and_resumed(d):
    a = started(d, b"a")
    ask(d, "suspend", admin=d.admin, job=a["job"])
    (stop,) = commands(d, b"a")
    ack(d, b"a", a, stop, state="suspended", bytes=64 * MiB)
    ask(d, "resume", admin=d.admin, job=a["job"])
    (go,) = commands(d, b"a")
    assert go["kind"] == "resume"
    return a, go


def _retried(d, a, wait_s: float):
    """The resume sent again once `wait_s` has passed, and not before."""
    import time
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait_s - 0.05:
        tick(d)
        assert not commands(d, b"a"), d.sent
        time.sleep(0.01)
    while time.monotonic() - t0 < wait_s + 2:
        tick(d)
        sent = commands(d, b"a")
        if sent:
            assert [c["kind"] for c in sent] == ["resume"], sent
            return sent[0]
        time.sleep(0.01)
    raise AssertionError("the failed resume was not tried again")


def test_a_resume_that_keeps_failing_holds_the_job_until_gmux_resume(daemon_factory, monkeypatch):
    # An outside operator flipped a byte of a spill file: the checksum refused it (rightly), and gmuxd sent the
    # resume again about 800 times in 10 s, each reading the whole file, the job shown 'resuming' throughout.
    from gmux.node import resume_retry
    monkeypatch.setattr(resume_retry, "RETRY_S", (0.2, 0.4))
    d = daemon_factory((GiB,))
    a, go = _suspended_and_resumed(d)
    job = d.jobs[a["job"]]
    error = "spill file j1.spill: checksum mismatch"
    for n, wait in enumerate((0.2, 0.4)):
        ack(d, b"a", a, go, ok=False, error=error, state="suspended")
        assert job.held and job.detail == f"resume failed: {error}; tried again in {wait:g} s (try {n + 2} of 3)"
        go = _retried(d, a, wait)
    ack(d, b"a", a, go, ok=False, error=error, state="suspended")
    for _ in range(50):
        tick(d)
        assert not commands(d, b"a"), d.sent
    assert job.held and job.state == "held", job.state
    assert job.detail == f"resume failed: {error} (3 tries); held: gmux resume tries again"
    ask(d, "resume", admin=d.admin, job=a["job"])          # the file put right: asked, it tries again, once
    assert [c["kind"] for c in commands(d, b"a")] == ["resume"]


def test_a_resume_that_failed_for_a_moment_is_tried_again_and_the_job_runs_on(daemon_factory, monkeypatch):
    """The GPU's memory taken for a moment by a program outside gmux: the job stayed held, suspended, until
    someone typed `gmux resume`. Tried again after a wait, it runs; a later failure counts from one again."""
    from gmux.node import resume_retry
    monkeypatch.setattr(resume_retry, "RETRY_S", (0.2, 0.4))
    d = daemon_factory((GiB,))
    a, go = _suspended_and_resumed(d)
    job = d.jobs[a["job"]]
    ack(d, b"a", a, go, ok=False, error="CUDA out of memory", state="suspended")
    go = _retried(d, a, 0.2)
    ack(d, b"a", a, go, state="running")
    tick(d)
    assert not job.held and job.state == "running", (job.state, job.detail)
    assert job.resume_failures == 0 and job.retry_at is None and not d.resume_retries._due


def test_a_users_suspend_while_a_failed_resume_waits_keeps_the_job_held(daemon_factory, monkeypatch):
    from gmux.node import resume_retry
    monkeypatch.setattr(resume_retry, "RETRY_S", (0.2, 0.4))
    d = daemon_factory((GiB,))
    a, go = _suspended_and_resumed(d)
    ack(d, b"a", a, go, ok=False, error="CUDA out of memory", state="suspended")
    ask(d, "suspend", admin=d.admin, job=a["job"])
    import time
    time.sleep(0.3)
    for _ in range(20):
        tick(d)
        assert not commands(d, b"a"), d.sent
    assert d.jobs[a["job"]].held


def test_a_users_suspend_while_the_resume_is_on_its_way_is_not_undone_by_a_retry(daemon_factory, monkeypatch):
    """A review: `gmux suspend` arriving while a resume was in flight found no retry to cancel; the resume then
    failed, a retry was set, and two seconds later it released the job against its user's suspend."""
    import time
    from gmux.node import resume_retry
    monkeypatch.setattr(resume_retry, "RETRY_S", (0.2, 0.4))
    d = daemon_factory((GiB,))
    a, go = _suspended_and_resumed(d)
    ask(d, "suspend", admin=d.admin, job=a["job"])          # the resume is still on its way
    ack(d, b"a", a, go, ok=False, error="CUDA out of memory", state="suspended")
    job = d.jobs[a["job"]]
    time.sleep(0.3)
    for _ in range(20):
        tick(d)
        assert not commands(d, b"a"), d.sent
    assert job.held and job.retry_at is None
    assert job.detail == "resume failed: CUDA out of memory; suspended by its user: gmux resume tries again"
    ask(d, "resume", admin=d.admin, job=a["job"])
    assert [c["kind"] for c in commands(d, b"a")] == ["resume"]


def test_a_job_held_for_another_try_is_released_by_the_next_gmuxd(daemon_factory, monkeypatch):
    """A review: the wait before another try lived only in gmuxd's memory, while the hold and a detail saying
    "tried again in 2 s" were saved: after a restart the job stayed held for ever."""
    import time
    from gmux.node import resume_retry
    monkeypatch.setattr(resume_retry, "RETRY_S", (0.5, 0.5))
    d = daemon_factory((GiB,))
    a, go = _suspended_and_resumed(d)
    ack(d, b"a", a, go, ok=False, error="CUDA out of memory", state="suspended")
    d._flush(force=True)
    again = daemon_factory((GiB,), root=d.rundir.root)
    job = again.jobs[a["job"]]
    assert job.held and job.resume_failures == 1 and job.retry_at is not None
    deadline = time.monotonic() + 3
    while job.held and time.monotonic() < deadline:
        again.tick()
        time.sleep(0.02)
    assert not job.held and job.retry_at is None, job.detail


def test_an_ended_jobs_partial_checkpoints_are_removed_and_its_kept_checkpoint_and_others_stay(daemon_factory):
    # A job killed while writing its spill checkpoint left its temporary file (48 MB, 69 MB) for good.
    import os
    d = daemon_factory((GiB,))
    a = started(d, b"a")
    job = d.jobs[a["job"]]
    ckpt, spill = d.rundir.checkpoint_file(job.id), d.rundir.spill_file(job.id)
    snapshot = d.rundir.checkpoint_file(job.id + ".snapshot")      # (a checkpoint request's, killed mid-write)
    folder = os.path.dirname(ckpt)
    partial = [os.path.join(folder, f".{os.path.basename(p)}.x1y2.tmp") for p in (ckpt, spill, snapshot)]
    other = os.path.join(folder, f".{os.path.basename(d.rundir.checkpoint_file(job.id + '0'))}.x1y2.tmp")
    for p in [ckpt, *partial, other]:
        with open(p, "w") as f:
            f.write("x")
    d.finish(job, "failed", 1, "exit status 1")
    assert not any(os.path.exists(p) for p in partial)
    assert os.path.exists(ckpt) and f"kept in {ckpt}" in job.detail      # a failed job's last state stays
    assert os.path.exists(other)                                          # j10's is not j1's


def test_a_spilled_jobs_state_on_disk_is_shown_and_its_last_report_outlives_a_restart(daemon_factory):
    """An outside user's review: a spilled job showed HOST 0B and nothing else; after a gmuxd restart every job's
    CONTROL was '-' (its last report was not kept)."""
    from rich.console import Console

    from gmux import protocol
    from gmux.cli.tables import jobs_table
    d = daemon_factory((GiB,), host_budget=MiB)
    a = started(d, b"a")
    d.server.receive(b"a", [protocol.encode("report", 8, job=a["job"], token=a["token"],
                                            report={"control": "optimizer hook", "step": 3}, state="running")])
    ask(d, "suspend", admin=d.admin, job=a["job"])
    (stop,) = commands(d, b"a")
    ack(d, b"a", a, stop, state="suspended", bytes=64 * MiB)
    tick(d)
    (spill,) = commands(d, b"a")
    assert spill["kind"] == "spill"
    ack(d, b"a", a, spill, state="suspended", bytes=64 * MiB, path=spill["args"]["path"])
    job = d.jobs[a["job"]]
    assert (job.host_bytes, job.disk_bytes) == (0, 64 * MiB)
    shown = Console(width=250, record=True)
    shown.print(jobs_table({"jobs": [job.public()]}))
    assert "0B (64.0MiB on disk)" in shown.export_text()
    d._flush(force=True)
    again = daemon_factory((GiB,), root=d.rundir.root, host_budget=MiB)
    assert again.jobs[a["job"]].last_report.get("control") == "optimizer hook"
    assert again.jobs[a["job"]].disk_bytes == 64 * MiB
    ask(d, "resume", admin=d.admin, job=a["job"])
    (go,) = commands(d, b"a")
    ack(d, b"a", a, go, state="running")
    assert (job.host_bytes, job.disk_bytes) == (0, 0)


def test_a_move_the_job_refused_leaves_it_free_to_be_moved_again(daemon_factory):
    """An outside tester: a job that refused a move to a new process (a sparse gradient at the boundary) ran on
    where it was, but gmuxd kept it 'on its way to GPU 1' and refused every later move, in its process too."""
    d = daemon_factory((GiB, GiB))
    a = started(d, b"a", migratable=True)
    job = d.jobs[a["job"]]
    assert ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1, new_process=True) is None     # (answered later)
    (move,) = commands(d, b"a")
    assert move["kind"] == "migrate" and move["args"]["gpu"] == 1, move
    why = "the job holds a sparse_coo tensor: checkpoints hold dense tensors only"
    ack(d, b"a", a, move, ok=False, error=why, state="running")
    assert (job.gpu, job.target_gpu, job.spill_refused) == (0, None, False), job
    assert why in job.detail
    tick(d)
    again = ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1, new_process=True)
    assert again is None, again               # asked again: sent again, not refused as a move under way
    assert [c["kind"] for c in commands(d, b"a")] == ["migrate"]


def test_a_hold_said_is_kept_by_a_gmuxd_that_dies_a_moment_later(daemon_factory):
    """An outside user: `gmux suspend` answered "suspended", gmuxd was SIGKILLed within a second (before its next
    flush of the table), and the next gmuxd re-attached the job running, not held."""
    d = daemon_factory((GiB,))
    a = started(d, b"a")
    ask(d, "suspend", admin=d.admin, job=a["job"])
    (stop,) = commands(d, b"a")
    ack(d, b"a", a, stop, state="suspended", bytes=MiB)
    again = daemon_factory((GiB,), root=d.rundir.root)          # (no flush between: as after a SIGKILL)
    assert again.jobs[a["job"]].held


def test_a_suspend_of_a_job_stopped_from_outside_is_answered_at_once(daemon_factory):
    """An outside user: `gmux suspend` of a job someone had SIGSTOPped waited 120 s for an acknowledgement, failed
    asking whether the job was stuck inside a mini-batch, and held the job all the same."""
    import os
    import signal

    from gmux.rundir import proc_starttime
    d = daemon_factory((GiB,))
    a = started(d, b"a", starttime=proc_starttime(d.stand_in_pid))      # (a process gmuxd can identify)
    os.kill(d.stand_in_pid, signal.SIGSTOP)
    try:
        for _ in range(250):
            tick(d)
            if d.slicers[0].entries[a["job"]].frozen:
                break
            time.sleep(0.02)
        assert d.slicers[0].entries[a["job"]].frozen
        reply = ask(d, "suspend", admin=d.admin, job=a["job"])
        assert reply is not None and reply["ok"], reply            # answered now, not in 120 s
        assert reply["data"]["state"] == "held" and "stopped from outside gmux" in reply["data"]["detail"], reply
    finally:
        os.kill(d.stand_in_pid, signal.SIGCONT)
    for _ in range(100):                   # continued: it is held, so it is asked to suspend at its boundary
        tick(d)
        if [c["kind"] for c in commands(d, b"a")] == ["suspend"]:
            break
        time.sleep(0.02)
    else:
        raise AssertionError(f"no suspend once continued: {d.sent}")
    assert d.jobs[a["job"]].held
