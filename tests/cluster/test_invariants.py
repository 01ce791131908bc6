"""Invariants at every event of randomised runs, for every policy: no GPU over-committed in memory (at most one
unit runs at a time, a unit is one job or a pair measured to fit), no job lost or placed twice, every job
completes exactly once with all its work done, and busy GPU-time equals the GPU-time attributed to jobs.
Engine.check_invariants() does the per-event checks; this file drives it with hypothesis."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim_harness import job, run
from gmux.cluster.policies import POLICIES

JOB = st.tuples(st.integers(0, 3000), st.integers(1, 4000), st.sampled_from([1, 1, 1, 1, 2, 4, 8]),
                st.sampled_from("ABC"), st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(JOB, min_size=1, max_size=40), st.sampled_from([(1, 8), (2, 4), (3, 4)]))
def test_every_policy_keeps_the_invariants(table, spec, shape):
    machines, per = shape
    tput = table()
    jobs = []
    for i, (submit, dur, gpus, jtype, elastic) in enumerate(spec):
        gpus = min(gpus, machines * per)
        jobs.append(job(i, submit, dur, gpus=gpus, jtype=jtype if gpus == 1 else None, elastic=elastic))
    events = []
    for name in POLICIES:
        eng, res, by = run(name, jobs, tput, machines=machines, per=per,
                           **({"thresholds": (50.0, 500.0)} if name == "tiresias" else {}))
        assert sorted(by) == list(range(len(jobs))), name                     # each job completed once
        assert len(res.jobs) == len(jobs), name
        for jid, submit, first, fin, gpus, work, *_ in res.jobs:
            assert submit <= first <= fin, name
            # No job beats running alone on its GPUs (elastic jobs may, with more GPUs).
            if not jobs[jid].elastic:
                assert fin - submit >= work - 1e-6, name
        useful = sum(j.duration * j.num_gpus for j in jobs)
        held = sum(r[9] for r in res.jobs)
        assert abs(held - res.busy_gpu_s) <= 1e-6 * max(1.0, held), name      # GPU-time conserved
        if name == "fifo":
            assert abs(res.busy_gpu_s - useful) <= 1e-6 * useful               # nothing shared: busy == work
        events.append(res.decisions)
    assert all(e >= 2 * len(jobs) for e in events)
