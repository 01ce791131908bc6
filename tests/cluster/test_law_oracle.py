"""gmux-law, the yardstick that knows the size law but not the sizes: it learns the law from arrivals (before
anything completes), never ranks a job by its own size, and refuses to run without the simulator's hints."""
import pytest

from gmux.cluster.policies import Event, EventKind, JobView, PolicyError, Snapshot, make_policy
from gmux.cluster.policies.gittins import MIN_SAMPLES
from gmux.cluster.sim.engine import make_machines


def _arrive(pol, snap, jid, duration, gpus=1, t=0.0):
    snap.now = t
    snap.add_job(JobView(jid, gpus, "('A', 1)", submit_time=t, remaining_hint=duration, duration_hint=duration))
    return pol.decide(snap, Event(EventKind.ARRIVAL, jid))


def test_it_knows_the_law_of_what_arrived_before_anything_completes():
    pol, snap = make_policy("gmux-law"), Snapshot(make_machines(1, 4))
    short, long_ = 100.0, 100_000.0
    for i in range(MIN_SAMPLES + 10):              # three in four short: a law no completion has shown yet
        _arrive(pol, snap, i, long_ if i % 4 == 0 else short, t=float(i))
    assert pol.model.version >= 1
    # A job that has run past the short mode is known to face the long one: ~100,000 s left, not ~100.
    assert pol.model.effective(1, 2 * short) > 0.5 * long_
    assert pol.model.effective(1, 0.0) < 0.5 * long_
    learned = make_policy("gmux")                  # the learning policy, given the same arrivals, knows nothing
    snap2 = Snapshot(make_machines(1, 4))
    for i in range(MIN_SAMPLES + 10):
        snap2.now = float(i)
        snap2.add_job(JobView(i, 1, "('A', 1)", submit_time=float(i)))
        learned.decide(snap2, Event(EventKind.ARRIVAL, i))
    assert learned.model.version == 0


def test_a_jobs_rank_never_reads_its_own_size():
    pol, snap = make_policy("gmux-law"), Snapshot(make_machines(1, 1))
    for i in range(MIN_SAMPLES + 10):
        _arrive(pol, snap, i, 50.0 * (1 + i % 7), t=0.0)
    a = JobView("a", 1, "('A', 1)", submit_time=5.0, remaining_hint=1.0, duration_hint=1.0)
    b = JobView("b", 1, "('A', 1)", submit_time=5.0, remaining_hint=1e7, duration_hint=1e7)
    assert pol.waiting_key(a) == pol.waiting_key(b)


def test_it_refuses_to_run_without_hints():
    pol, snap = make_policy("gmux-law"), Snapshot(make_machines(1, 1))
    snap.add_job(JobView("x", 1, "('A', 1)", submit_time=0.0))
    with pytest.raises(PolicyError, match="no duration hint"):
        pol.decide(snap, Event(EventKind.ARRIVAL, "x"))
