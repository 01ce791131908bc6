"""Moves between virtual GPUs in the job's own process (gmux.node.moves), in an in-process gmuxd whose sends are
recorded: the suspend at the boundary, the seat moving from one slicer to the other, the resume with the target's
environment; a move given up with the job where it was; a job ending mid-move; real GPUs and --new-process taking
the checkpoint-and-new-process path; a transparent job moved by defragmentation."""
import time

from gmux import protocol
from node_harness import GiB, ask, register

MiB = 1 << 20


def commands(d, identity):
    return [m for i, m in d.sent if i == identity and m["type"] == "command"]


def replies(d, identity=b"c"):
    return [m for i, m in d.sent if i == identity and m["type"] == "reply"]


def ack(d, identity, reg, cmd, ok=True, state=None, **result):
    d.sent.clear()
    d.server.receive(identity, [protocol.encode("result", 9, job=reg["job"], token=reg["token"], cmd=cmd["cmd"],
                                                kind=cmd["kind"], result={"ok": ok, **result},
                                                **({"state": state} if state else {}))])


def tick(d):
    d.sent.clear()
    d.tick()


def started(d, identity, **kw):
    """A registered job, started on its GPU (its first resume acknowledged)."""
    reg = register(d, identity, **kw)
    tick(d)
    (go,) = commands(d, identity)
    assert go["kind"] == "resume"
    ack(d, identity, reg, go, state="running")
    return reg


def asked_to_move(daemon_factory):
    """A job running on GPU 0 of two, asked to move to GPU 1: (the daemon, the job's registration, the suspend
    the move sent it)."""
    d = daemon_factory((GiB, GiB))
    a = started(d, b"a", mem=256 * MiB)
    d.sent.clear()
    ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1)
    (stop,) = commands(d, b"a")
    return d, a, stop


def seats(d, job):
    """Where the slicers hold `job`: (GPU, resident, busy) for each slicer that has it."""
    return [(g, job in s.resident, s.busy_with(job)) for g, s in d.slicers.items() if job in s.entries]


def test_a_running_job_suspends_its_seat_moves_and_it_resumes_on_the_target(daemon_factory):
    d = daemon_factory((GiB, GiB))
    a = started(d, b"a", mem=256 * MiB)
    job = d.jobs[a["job"]]
    assert job.gpu == 0 and seats(d, a["job"]) == [(0, True, None)]
    d.sent.clear()
    assert ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1) is None    # the reply waits for the suspend
    (stop,) = commands(d, b"a")
    assert stop["kind"] == "suspend" and stop["args"] == {}
    assert seats(d, a["job"]) == [(0, True, "move")]     # its memory is on GPU 0 until it has suspended
    tick(d)
    assert job.state == "suspending" and "moving to GPU 1 in its own process" in job.detail
    assert not commands(d, b"a")                          # the source's slicer waits for it
    used = d.slicers[0].used(a["job"], time.monotonic())
    ack(d, b"a", a, stop, state="suspended", bytes=5 * MiB)
    (reply,) = replies(d)
    assert reply["ok"], reply
    data = reply["data"]
    assert data["path"] == "in process" and (data["from"], data["gpu"], data["kind"]) == (0, 1, "migrate")
    # The seat moved, with its GPU time; the target's resume left with the acknowledgement, with its environment.
    assert seats(d, a["job"]) == [(1, False, "resume")] and not d.slicers[0].entries
    assert job.gpu == 1 and job.migrations == 1 and job.gpu_seconds >= used and job.host_bytes == 5 * MiB
    (go,) = commands(d, b"a")
    assert go["kind"] == "resume" and go["args"]["gpu"] == 1 and go["args"]["env"]["GMUX_VIRTUAL_GPU"] == "1"
    ack(d, b"a", a, go, state="running")
    assert seats(d, a["job"]) == [(1, True, None)] and job.host_bytes == 0
    moved = [x for x in d.decisions if x["kind"] == "moved"]
    assert len(moved) == 1 and f"moved {a['job']} in process from GPU 0 to GPU 1" in moved[0]["text"]
    tick(d)
    ps = ask(d, "ps", admin=d.admin)["data"]
    (row,) = ps["jobs"]
    assert row["gpu"] == 1 and row["state"] == "running" and row["detail"] == "moved in process from GPU 0 to GPU 1"
    assert [(g["jobs"], g["resident"]) for g in ps["gpus"]] == [([], []), ([a["job"]], [a["job"]])]
    assert [g["resident_mem"] for g in ps["gpus"]] == [0, 256 * MiB]


def test_a_suspended_job_moves_at_once_and_a_held_one_stays_held(daemon_factory):
    d = daemon_factory((GiB, GiB))
    a = started(d, b"a", mem=256 * MiB)
    ask(d, "suspend", admin=d.admin, job=a["job"])
    (stop,) = commands(d, b"a")
    ack(d, b"a", a, stop, state="suspended")
    r = ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1)
    assert r["ok"] and r["data"]["path"] == "in process" and r["data"]["suspended_already"], r
    assert not commands(d, b"a")     # held by its user: moved, not resumed
    assert seats(d, a["job"]) == [(1, False, None)] and d.jobs[a["job"]].held
    assert "stays suspended, held by its user" in d.decisions[-1]["text"]
    ask(d, "resume", admin=d.admin, job=a["job"])
    (go,) = commands(d, b"a")
    assert go["kind"] == "resume" and go["args"]["env"]["GMUX_VIRTUAL_GPU"] == "1"


def test_a_move_onto_a_busy_gpu_waits_for_its_turn_there(daemon_factory):
    d = daemon_factory((GiB, GiB), quantum=600.0)
    a, b = started(d, b"a", mem=256 * MiB), started(d, b"b", mem=256 * MiB)
    assert (d.jobs[a["job"]].gpu, d.jobs[b["job"]].gpu) == (0, 1)
    d.sent.clear()
    ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1)
    (stop,) = commands(d, b"a")
    ack(d, b"a", a, stop, state="suspended")
    assert replies(d)[0]["ok"] and "in its turn, after " + b["job"] in d.decisions[-1]["text"]
    assert seats(d, a["job"]) == [(1, False, None)] and seats(d, b["job"]) == [(1, True, None)]
    assert not commands(d, b"a") and not commands(d, b"b")    # b's turn (600 s) goes on


def test_the_target_is_checked_again_once_the_job_has_suspended(daemon_factory):
    d = daemon_factory((GiB, 512 * MiB))
    a = started(d, b"a", mem=256 * MiB)
    d.sent.clear()
    ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1)
    (stop,) = commands(d, b"a")
    # Before its boundary the job reports a peak past the target's size.
    d.server.receive(b"a", [protocol.encode("report", 8, job=a["job"], token=a["token"],
                                            report={"mem_peak": 768 * MiB}, state="running")])
    ack(d, b"a", a, stop, state="suspended")
    (reply,) = replies(d)
    assert not reply["ok"] and "needs 768.0MiB, GPU 1 has 512.0MiB" in reply["error"], reply
    assert "stays on GPU 0, suspended, and resumes there in its turn" in reply["error"]
    # Nothing of it on GPU 1; on GPU 0 it is suspended, no longer busy, and resumed there at once (alone there).
    assert not d.slicers[1].entries and d.jobs[a["job"]].gpu == 0 and d.jobs[a["job"]].target_gpu is None
    (go,) = commands(d, b"a")
    assert go["kind"] == "resume" and go["args"]["env"]["GMUX_VIRTUAL_GPU"] == "0"
    assert seats(d, a["job"]) == [(0, False, "resume")]
    assert "given up" in [x for x in d.decisions if x["kind"] == "migrate"][-1]["text"]


def test_a_jobs_peak_is_the_largest_reported_not_the_last(daemon_factory):
    # Each report's peak is since the report before: the larger phase (an evaluation) comes again, so a smaller
    # report must not shrink what the slicer admits beside the job.
    d = daemon_factory((GiB,))
    a = started(d, b"a")
    for peak in (300 * MiB, 40 * MiB):
        d.server.receive(b"a", [protocol.encode("report", 8, job=a["job"], token=a["token"],
                                                report={"mem_peak": peak, "mem_boundary": 30 * MiB},
                                                state="running")])
    job = d.jobs[a["job"]]
    assert job.mem_peak == 300 * MiB and job.mem_boundary == 30 * MiB and job.working_set() == 300 * MiB
    assert d.slicers[0].entries[a["job"]].mem == 300 * MiB


def test_a_failed_suspend_leaves_the_job_running_where_it_was(daemon_factory):
    d, a, stop = asked_to_move(daemon_factory)
    ack(d, b"a", a, stop, ok=False, error="no host memory", state="running")
    (reply,) = replies(d)
    assert not reply["ok"] and "no host memory" in reply["error"] and "runs on GPU 0 as before" in reply["error"]
    assert seats(d, a["job"]) == [(0, True, None)] and not d.slicers[1].entries


def test_a_job_that_ends_mid_move_leaves_both_gpus_clean(daemon_factory):
    d = daemon_factory((GiB, GiB))
    for when in ("suspending", "moved"):
        a = started(d, f"a-{when}".encode(), mem=256 * MiB)
        gpu = d.jobs[a["job"]].gpu
        d.sent.clear()
        ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1 - gpu)
        (stop,) = commands(d, f"a-{when}".encode())
        if when == "moved":      # it suspended, its seat moved; it dies before its resume there is answered
            ack(d, f"a-{when}".encode(), a, stop, state="suspended")
        d.sent.clear()
        d.server.receive(f"a-{when}".encode(), [protocol.encode("bye", 7, job=a["job"], token=a["token"],
                                                                status=-9, reason="killed")])
        if when == "suspending":
            (reply,) = replies(d)
            assert not reply["ok"] and f"job {a['job']} ended" in reply["error"], reply
        assert d.jobs[a["job"]].state == "failed" and seats(d, a["job"]) == []
        for s in d.slicers.values():
            assert not s.entries and not s.resident and not s.pending, (when, s.entries, s.pending)
        ps = ask(d, "ps", admin=d.admin)["data"]
        assert all(g["jobs"] == [] and g["resident_mem"] == 0 for g in ps["gpus"]), ps["gpus"]
    # Both GPUs take new jobs as before.
    b, c = started(d, b"b", mem=GiB), started(d, b"c", mem=GiB)
    assert {d.jobs[b["job"]].gpu, d.jobs[c["job"]].gpu} == {0, 1}


def test_real_gpus_and_new_process_take_the_checkpoint_path(daemon_factory):
    for virtual, fields in ((False, {}), (True, {"new_process": True})):
        d = daemon_factory((GiB, GiB), virtual=virtual)
        a = started(d, b"a", mem=256 * MiB, migratable=True)
        d.sent.clear()
        assert ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1, **fields) is None
        (cmd,) = commands(d, b"a")
        assert cmd["kind"] == "migrate" and cmd["args"]["path"].endswith(f"{a['job']}.ckpt")
        assert d.slicers[0].busy_with(a["job"]) == "migrate"
        again = ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1, **fields)    # refused only for now
        assert not again["ok"] and again["busy"] is True, again
        assert "is on its way to GPU 1 in a new process" in again["error"], again
        ack(d, b"a", a, cmd)
        (reply,) = replies(d)
        assert reply["ok"] and reply["data"]["path"] == "new process", reply
        # Its old process has checkpointed and left the GPU; its new one has not registered yet. Moved again, it
        # was sent a command it never took, and the GPU it had left failed at every tick from then on (KeyError,
        # 48 a second) and ran no job again (an outside tester's, 3 of 3).
        again = ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1, **fields)
        assert not again["ok"] and again["busy"] is True, again
        assert "is on its way to GPU 1 in a new process; move it once it has arrived" in again["error"], again
        for _ in range(3):
            tick(d)
        assert d.internal_errors == 0 and a["job"] not in d.slicers[0].pending
        t = started(d, b"t", mem=256 * MiB)    # transparent mode: a new process cannot restore it
        r = ask(d, "migrate", admin=d.admin, job=t["job"], gpu=1 - d.jobs[t["job"]].gpu, **fields)
        assert not r["ok"] and "transparent mode" in r["error"] and "busy" not in r, r
        assert ("leave out --new-process" in r["error"]) == virtual


def test_a_transparent_job_is_moved_in_process_to_free_gpus_for_a_multi_gpu_job(daemon_factory):
    d = daemon_factory((16 * GiB,) * 3)
    a, b = started(d, b"a", mem=GiB), started(d, b"b", mem=GiB)    # transparent mode, on GPUs 0 and 1
    c = register(d, b"c", gpus=2)
    tick(d)
    defrag = next(x for x in d.decisions if x["kind"] == "defrag")
    assert [(m["job"], m["src"], m["dst"]) for m in defrag["numbers"]["moves"]] == [(a["job"], 0, 1)]
    (stop,) = commands(d, b"a")
    assert stop["kind"] == "suspend"      # moved in its own process: nothing to restore in a new one
    ack(d, b"a", a, stop, state="suspended")
    tick(d)
    assert d.jobs[a["job"]].gpu == 1 and d.jobs[c["job"]].exclusive_gpus == [0, 2]
    assert seats(d, a["job"]) == [(1, False, None)] and seats(d, b["job"]) == [(1, True, None)]


def test_a_job_that_does_not_reach_its_boundary_has_its_move_given_up(daemon_factory):
    d, a, stop = asked_to_move(daemon_factory)
    tick(d)
    assert not replies(d) and seats(d, a["job"]) == [(0, True, "move")]    # within its deadline: waited for
    d.slicers[0].entries[a["job"]].sent_at -= 5.0     # as if sent 5 s ago (its deadline: the 1 s floor)
    tick(d)
    (reply,) = replies(d)
    assert not reply["ok"] and "did not suspend within 5.0 s" in reply["error"], reply
    assert "stays on GPU 0" in reply["error"]
    assert "given up: it did not suspend" in [x for x in d.decisions if x["kind"] == "migrate"][-1]["text"]
    # Its suspend, still with it, is GPU 0's slicer's own now: nothing of it on GPU 1, and once it suspends at
    # last it is resumed where it was.
    assert seats(d, a["job"]) == [(0, True, "suspend")] and not d.slicers[1].entries
    assert d.jobs[a["job"]].target_gpu is None
    ack(d, b"a", a, stop, state="suspended")
    assert not replies(d)
    tick(d)
    (go,) = commands(d, b"a")
    assert go["kind"] == "resume" and go["args"]["env"]["GMUX_VIRTUAL_GPU"] == "0"
    assert not [x for x in d.decisions if x["kind"] == "moved"]


def test_a_daemon_restarted_mid_move_keeps_the_job_where_it_was(daemon_factory, tmp_path):
    d = daemon_factory((GiB, GiB), root=str(tmp_path / "rt"))
    a = started(d, b"a", mem=256 * MiB)
    d.sent.clear()
    ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1)
    (stop,) = commands(d, b"a")
    tick(d)
    d._flush(force=True)
    again = daemon_factory((GiB, GiB), root=str(tmp_path / "rt"))     # the same tables, as after a crash
    # It knows nothing of the move: the job is on GPU 0, suspending as far as it knows, and believed only once
    # it says; its process is not waited for to re-register (as a migrating job's would be).
    assert seats(again, a["job"]) == [(0, True, "confirm")] and not again.slicers[1].entries
    # The job took the old daemon's suspend at its boundary: its answer finds nothing in flight, and its
    # heartbeat says what it is; it is resumed on GPU 0.
    ack(again, b"a", a, stop, state="suspended")
    again.server.receive(b"a", [protocol.encode("heartbeat", 8, job=a["job"], token=a["token"],
                                                state="suspended")])
    tick(again)
    (go,) = commands(again, b"a")
    assert go["kind"] == "resume" and go["args"]["env"]["GMUX_VIRTUAL_GPU"] == "0"
