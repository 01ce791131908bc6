"""Sweep evidence behind gmux's priority: how much a sibling's service says about a job is learned from the
cluster's completions (near 1 for real sweeps, near 0 for independent jobs that merely arrive together), and a
waiting sibling of a long-served job ranks behind a fresh job of another sweep."""
import random

import pytest

from gmux.cluster.policies import make_policy
from gmux.cluster.policies.api import JobView
from gmux.cluster.policies.sweeps import Sweeps

H = 3600.0


def view(i, t, gpus=4):
    return JobView(job_id=i, num_gpus=gpus, job_type="('D', 4)", submit_time=float(t))


def calibrate(sweeps, alike: bool, seed: int = 0, first_id: int = 0) -> int:
    """60 sweeps of three 4-GPU jobs submitted a second apart, an hour and more between sweeps; each member's
    service is that of its sweep (within 10%) or drawn on its own."""
    rng = random.Random(seed)
    jid, t = first_id, 0.0
    for _ in range(60):
        length = H * rng.lognormvariate(0, 2)
        ids = list(range(jid, jid + 3))
        for i, m in enumerate(ids):
            sweeps.join(view(m, t + i))
        for i, m in enumerate(ids):
            s = length * (1 + 0.1 * (i % 2) - 0.05 * i) if alike else H * rng.lognormvariate(0, 2)
            sweeps.observe(m, s)
            sweeps.complete(m, s)
        jid, t = jid + 3, t + 4 * H
    return jid


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_share_is_learned_high_for_real_sweeps_and_low_for_independent_jobs(seed):
    alike, independent = Sweeps(60.0, 0.3), Sweeps(60.0, 0.3)
    calibrate(alike, True, seed)
    calibrate(independent, False, seed)
    assert alike.share > 0.7
    assert independent.share < 0.25


def test_a_sibling_of_a_long_served_job_ranks_behind_a_fresh_job_of_another_sweep():
    pol = make_policy("gmux", sweep_gap_s=60.0)
    n = calibrate(pol.sweeps, True)
    t = 1e6
    a, b, c = view(n, t), view(n + 1, t + 1), view(n + 2, t + 2 * H)       # a, b one sweep; c its own
    for v in (a, b, c):
        pol.sweeps.join(v)
    assert pol.sweeps.observe(a.job_id, 4 * 20 * H) == [b.job_id]           # a has run 20 h: b's rank moves
    assert pol.sweeps.bound(b.job_id) == pytest.approx(pol.sweeps.share * 4 * 20 * H)
    assert pol.sweeps.bound(c.job_id) == 0.0
    # Without the sweep, b (submitted first) would come first: same class, same (zero) service.
    assert pol.waiting_key(b) > pol.waiting_key(c)
    assert pol.sweeps.observe(a.job_id, 4 * 20 * H + 1) == []                # same grid point: nobody moves


def test_a_finished_sweep_is_forgotten_but_the_latest_of_a_size_stays_joinable():
    sw = Sweeps(60.0, 0.3)
    sw.join(view(0, 0))
    sw.observe(0, 100.0)
    sw.complete(0, 100.0)
    sw.join(view(1, 30))                       # within the gap of the latest 4-GPU arrival: same sweep
    assert sw.bound(1) == 0.0 and sw._sweep[1] == 0
    sw.join(view(2, 10 * H))                   # a new sweep; the old one, now empty, goes once 1 finishes
    sw.observe(1, 50.0)
    sw.complete(1, 50.0)
    assert 0 not in sw._members and set(sw._members) == {2}
    ratios = len(sw._ratios)
    sw.complete(2, None)                       # left without running: no evidence, but it leaves
    assert len(sw._ratios) == ratios and 2 not in sw._sweep and not sw._members[2]
    with pytest.raises(ValueError):
        Sweeps(-1.0, 0.3)


def test_a_job_seen_again_stays_in_the_sweep_it_joined():
    """Released from a hold, a job arrives again long after its sweep: it must not start a new chain (nor pull
    the chain's last submission back to its own), or the next true sweep would not be recognised."""
    sweeps = Sweeps(gap_s=1800.0, quantile=0.5)
    sweeps.share = 0.5                  # as if learned: a member needs at least half its sweep's most
    a, b = view(1, 0), view(2, 10)
    sweeps.join(a)
    sweeps.join(b)
    sweeps.join(a)                      # seen again at a later decision
    sweeps.join(view(3, 1805))          # within the gap of b, the sweep's latest submission
    sweeps.observe(1, 5 * H)
    assert sweeps.bound(3) == sweeps.bound(2) == 2.5 * H


def test_two_users_jobs_are_never_siblings_however_close_they_arrive():
    """gmux-scheduler knows who submitted each job (and a trace may say): a chain is one user's arrivals of one GPU
    count, so another user's job submitted in between neither joins nor breaks it. Without owners (Philly) every
    job is of one anonymous owner, as before."""
    sweeps = Sweeps(gap_s=1800.0, quantile=0.5)
    sweeps.share = 0.5
    alice = [JobView(job_id=i, num_gpus=4, job_type="A", submit_time=600.0 * i, owner="alice") for i in (0, 2, 4)]
    bob = [JobView(job_id=i, num_gpus=4, job_type="A", submit_time=600.0 * i, owner="bob") for i in (1, 3)]
    for v in sorted(alice + bob, key=lambda v: v.submit_time):
        sweeps.join(v)
    assert sweeps.observe(0, 10 * H) == [2, 4]           # alice's siblings move; bob's jobs do not
    assert sweeps.bound(4) == 5 * H and sweeps.bound(1) == sweeps.bound(3) == 0.0
    anonymous = Sweeps(gap_s=1800.0, quantile=0.5)
    anonymous.share = 0.5
    for v in sorted(alice + bob, key=lambda v: v.submit_time):
        anonymous.join(view(v.job_id, v.submit_time))
    anonymous.observe(0, 10 * H)
    assert anonymous.bound(1) == anonymous.bound(4) == 5 * H


def test_a_sweep_emptied_while_latest_is_forgotten_once_a_new_one_takes_its_chain():
    """Bookkeeping stays bounded by the jobs in the system, however many users and sweeps pass through."""
    sweeps = Sweeps(gap_s=60.0, quantile=0.3)
    for i in range(1000):
        v = JobView(job_id=i, num_gpus=1 + i % 4, job_type="A", submit_time=3600.0 * i, owner=f"user{i % 7}")
        sweeps.join(v)
        sweeps.observe(i, 100.0)
        sweeps.complete(i, 100.0)
    assert len(sweeps._members) == len(sweeps._top) == len(sweeps._latest) <= 28


def test_a_stream_of_short_jobs_chained_to_a_long_one_is_not_queued_behind_it(table):
    """No owners, one GPU count: a long 8-GPU job, then a stream of 8-GPU jobs of a minute or two, each
    submitted as the one before ends, are one endless sweep. The sibling bound (share x the long job's service)
    passed every completion the law had seen, which put the newcomers in its last queue, in arrival order behind
    the long job; nothing completed while it ran, so nothing corrected the share: FIFO's average JCT. (The pairs
    do not fit together: packing beside the long job would hide it.)"""
    from sim_harness import job, run
    rng = random.Random(0)
    jobs = [job(0, 0, 20000, gpus=8)] + [job(k, 10 + 111 * (k - 1), rng.uniform(60, 140), gpus=8)
                                         for k in range(1, 1500)]
    mean = {}
    for name in ("fifo", "gmux"):
        _, res, _ = run(name, jobs, table({}), machines=1, per=8, check=False)
        mean[name] = sum(r[3] - r[1] for r in res.jobs) / len(res.jobs)
    assert mean["gmux"] < 0.2 * mean["fifo"], mean
