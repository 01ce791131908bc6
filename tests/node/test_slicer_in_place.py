"""A job held in place for a cross-machine move (gmux.job.job: its suspend copies nothing out) keeps its memory on
the GPU without computing: the slicer must count that memory until the job resumes or leaves, must not charge it
GPU time, and must resume it (a command, though nothing is copied back) before it computes again. Fake clock."""
import pytest

from gmux.node.pacing import Pacing
from gmux.node.slicer import Slicer

GiB = 1 << 30


def slicer(*mems, total=10 * GiB):
    s = Slicer(0, total, quantum=1.0, pacing=Pacing(floor=1.0, k=3.0, c=2.0))
    for i, m in enumerate(mems):
        s.add("abc"[i], 1, m, 0.0, resident=(i == 0))
    return s


def held_in_place(s, job="a", t=0.1):
    """`job` is held for a move in place and acknowledges its suspend at `t`; returns what the slicer sent."""
    s.hold(job, to_boundary=True, in_place=True)
    sent = s.tick(t)
    assert ("suspend", job) in sent and s.suspend_args(job) == {"in_place": True}
    s.acked(job, "suspend", t, in_place=True)
    return sent


def test_a_job_suspended_in_place_keeps_its_memory_and_is_charged_no_gpu_time():
    s = slicer(6 * GiB)
    held_in_place(s)
    assert s.is_kept("a") and "a" in s.resident and not s.computing("a")
    used = s.used("a", 0.1)
    for t in (0.5, 2.0, 5.0):
        assert s.tick(t) == []                   # nobody needs its memory: it keeps it
    assert s.used("a", 5.0) == used and "a" in s.resident


def test_a_kept_job_suspends_for_real_when_another_needs_its_memory():
    s = slicer(6 * GiB, 6 * GiB)                 # b does not fit beside a
    held_in_place(s)
    sent = s.tick(0.5)
    assert ("suspend", "a") in sent and s.suspend_args("a") == {}    # this time it copies its state out
    for t in (0.6, 2.0):
        assert ("resume", "b") not in s.tick(t)   # (its move's checkpoint still being written)
    s.acked("a", "suspend", 2.5)
    assert "a" not in s.resident and not s.is_kept("a")
    assert ("resume", "b") in s.tick(2.6)


def test_a_kept_job_leaving_the_machine_frees_its_memory():
    s = slicer(6 * GiB)
    held_in_place(s)
    s.remove("a", 5.0)                           # the move succeeded: the job leaves, its memory with it
    assert s.resident == set()


def test_a_job_that_fits_beside_a_kept_one_runs_meanwhile():
    s = slicer(3 * GiB, 3 * GiB)
    held_in_place(s)
    assert ("resume", "b") in s.tick(0.2)
    s.acked("b", "resume", 0.2)
    assert s.computing("b") and s.resident == {"a", "b"}


def test_a_failed_move_resumes_the_kept_job_before_it_computes_again():
    s = slicer(6 * GiB)
    held_in_place(s)
    s.release("a")                               # the move failed: the link resumes the job where it was
    assert s.suspend_args("a") == {} and not s.entries["a"].held
    sent = s.tick(0.5)
    assert ("resume", "a") in sent and not s.computing("a")
    s.acked("a", "resume", 0.6)
    assert s.computing("a") and not s.is_kept("a")
    assert s.used("a", 1.6) - s.used("a", 0.6) == pytest.approx(1.0)    # charged again once it runs


def test_a_kept_job_is_not_taken_for_freed_by_its_own_heartbeat():
    # Its agent says "suspended" while it waits at its boundary: its memory is still there.
    s = slicer(6 * GiB)
    held_in_place(s)
    s.observed("a", "suspended", 0.3)
    assert "a" in s.resident and s.is_kept("a")


def test_a_plain_hold_still_frees_the_memory():
    s = slicer(6 * GiB, 6 * GiB)
    s.hold("a", to_boundary=True)
    assert s.suspend_args("a") == {}
    s.tick(0.1)
    s.acked("a", "suspend", 0.1)
    assert "a" not in s.resident and not s.is_kept("a") and ("resume", "b") in s.tick(0.2)
