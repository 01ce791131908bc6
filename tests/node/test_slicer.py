"""The time-slicer as a pure object, driven by a fake clock and instant (or delayed) acknowledgements."""
import pytest

from gmux.node.slicer import Slicer

GiB = 1 << 30


class Sim:
    """Plays the jobs: acknowledges every command after `delay` seconds; checks memory at every step."""

    def __init__(self, slicer, delay=0.0):
        self.s, self.delay, self.now = slicer, delay, 0.0
        self.inflight = []
        self.log = []

    def run(self, until, dt=0.05):
        while self.now < until:
            for kind, job in self.s.tick(self.now):
                self.inflight.append((self.now + self.delay, kind, job))
                self.log.append((self.now, kind, job))
            for item in [i for i in self.inflight if i[0] <= self.now]:
                self.inflight.remove(item)
                self.s.acked(item[2], item[1], self.now)
            mem = sum(self.s.entries[j].mem or 0 for j in self.s.resident)
            assert mem <= self.s.mem_total, f"resident set {self.s.resident} exceeds the GPU at t={self.now}"
            self.now += dt


def test_weighted_shares_follow_weights():
    s = Slicer(0, 16 * GiB, quantum=1.0)
    for j, w in (("a", 1), ("b", 1), ("c", 2)):
        s.add(j, w, 10 * GiB, 0.0)       # any two exceed the GPU: strictly time-sliced
    sim = Sim(s, delay=0.02)
    sim.run(40.0)
    used = {j: s.used(j, sim.now) for j in "abc"}
    total = sum(used.values())
    for j, share in (("a", 0.25), ("b", 0.25), ("c", 0.5)):
        assert used[j] / total == pytest.approx(share, rel=0.1), used


def test_never_two_resident_when_they_do_not_fit_even_with_slow_acks():
    s = Slicer(0, 16 * GiB, quantum=0.5)
    s.add("a", 1, 9 * GiB, 0.0)
    s.add("b", 1, 9 * GiB, 0.0)
    sim = Sim(s, delay=0.4)              # acknowledgements take most of a quantum
    sim.run(20.0)                        # Sim asserts the memory bound at every step
    assert s.switches >= 10


def test_resume_only_after_every_suspend_is_acknowledged():
    s = Slicer(0, 16 * GiB, quantum=1.0)
    s.add("a", 1, 9 * GiB, 0.0)
    s.add("b", 1, 9 * GiB, 0.0)
    assert s.tick(0.0) == [("resume", "a")]
    s.acked("a", "resume", 0.1)
    assert s.tick(0.5) == []
    assert s.tick(1.2) == [("suspend", "a")]
    assert s.tick(1.3) == []             # a has not acknowledged: b must not start
    s.acked("a", "suspend", 1.4)
    assert s.tick(1.45) == [("resume", "b")]


def test_single_slot_is_never_switched():
    s = Slicer(0, 16 * GiB, quantum=0.1)
    s.add("a", 1, None, 0.0)
    sim = Sim(s)
    sim.run(5.0)
    assert sim.log == [(0.0, "resume", "a")]


def test_pack_runs_together_and_unpack_time_slices():
    s = Slicer(0, 16 * GiB, quantum=1.0)
    s.add("a", 1, 4 * GiB, 0.0)
    s.add("b", 1, 4 * GiB, 0.0)
    sim = Sim(s)
    sim.run(2.0)
    s.pack(frozenset("ab"))
    sim.run(4.0)
    assert s.resident == {"a", "b"}
    s.unpack(frozenset("ab"))
    sim.run(8.0)
    assert len(s.resident) == 1


def test_pack_that_does_not_fit_is_refused():
    s = Slicer(0, 16 * GiB)
    s.add("a", 1, 10 * GiB, 0.0)
    s.add("b", 1, 10 * GiB, 0.0)
    with pytest.raises(ValueError):
        s.pack(frozenset("ab"))
    s.add("c", 1, None, 0.0)             # unknown working set: never packed
    assert not s.fits(frozenset("ac"))


def test_held_job_is_suspended_and_skipped_then_returns():
    s = Slicer(0, 16 * GiB, quantum=1.0)
    s.add("a", 1, 9 * GiB, 0.0)
    s.add("b", 1, 9 * GiB, 0.0)
    sim = Sim(s)
    sim.run(0.5)
    assert s.resident == {"a"}
    s.hold("a")
    sim.run(5.0)
    assert s.resident == {"b"} and s.used("a", sim.now) < 0.6
    s.release("a")
    sim.run(10.0)
    assert s.used("a", sim.now) > 2


def test_removed_job_frees_the_gpu_at_once():
    s = Slicer(0, 16 * GiB, quantum=100.0)
    s.add("a", 1, 9 * GiB, 0.0)
    s.add("b", 1, 9 * GiB, 0.0)
    sim = Sim(s)
    sim.run(1.0)
    assert s.resident == {"a"}
    s.remove("a", sim.now)               # killed: no suspend to wait for
    sim.run(1.2)
    assert s.resident == {"b"}


def test_failed_suspend_keeps_job_running_and_no_overcommit():
    s = Slicer(0, 16 * GiB, quantum=1.0)
    s.add("a", 1, 9 * GiB, 0.0)
    s.add("b", 1, 9 * GiB, 0.0)
    s.tick(0.0)
    s.acked("a", "resume", 0.0)
    assert s.tick(1.5) == [("suspend", "a")]
    s.acked("a", "suspend", 1.6, ok=False)
    assert s.resident == {"a"} and s.tick(1.7) == []


def test_newcomer_does_not_monopolise():
    s = Slicer(0, 16 * GiB, quantum=1.0)
    s.add("a", 1, 9 * GiB, 0.0)
    sim = Sim(s)
    sim.run(30.0)                         # a alone for 30 s
    s.add("b", 1, 9 * GiB, sim.now)
    start = sim.now
    sim.run(50.0)
    ua = s.used("a", sim.now) - 30.0
    ub = s.used("b", sim.now)
    assert ua / (ua + ub) == pytest.approx(0.5, abs=0.1), (ua, ub, sim.now - start)


def test_a_command_of_the_daemons_own_holds_the_slicer_until_it_is_over():
    s = Slicer(0, 100, quantum=1.0)
    s.add("a", 1.0, 10, 0.0)
    s.add("b", 1.0, 10, 0.0)
    assert s.tick(0.0) == [("resume", "a")]
    s.acked("a", "resume", 0.0)
    s.mark_busy("b", "spill")
    assert s.busy_with("b") == "spill" and s.busy_with("a") is None
    assert s.tick(5.0) == []          # a quantum is over, but b is busy: no switch
    s.clear_busy("b")
    assert s.busy_with("b") is None and s.tick(5.0) == [("suspend", "a")]
