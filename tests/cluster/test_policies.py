"""Each policy on small hand-made traces whose right answer is known."""
import pytest

from sim_harness import finish, first_run, job, run
from gmux.cluster.policies import Event, EventKind, JobState, JobView, MachineView, PolicyError, Snapshot, make_policy


def test_fifo_keeps_arrival_order_and_never_backfills(table):
    jobs = [job(0, 0, 100, gpus=2), job(1, 1, 50, gpus=2), job(2, 2, 10, gpus=1)]
    _, res, by = run("fifo", jobs, table(), machines=1, per=2)
    assert [finish(by, i) for i in range(3)] == [100, 150, 160]   # job 2 waits behind job 1 though 1 GPU is idle
    assert res.counters["suspends"] == 0


def test_fifo_bf_backfills_a_job_that_fits_past_one_that_does_not(table):
    jobs = [job(0, 0, 100, gpus=2), job(1, 1, 50, gpus=2), job(2, 2, 10, gpus=1)]
    _, _, strict = run("fifo", jobs, table(), machines=1, per=3)
    _, res, bf = run("fifo-bf", jobs, table(), machines=1, per=3)
    assert first_run(strict, 2) == 100                      # strict FIFO: behind job 1, which waits for job 0
    assert first_run(bf, 2) == 2 and finish(bf, 2) == 12    # backfilled into the idle GPU at once
    assert finish(bf, 1) == 150 and res.counters["suspends"] == 0


def test_tiresias_uses_its_published_queues_and_preempts_only_across_them(table):
    assert make_policy("tiresias").thresholds == (3250.0, 7200.0)
    # Job 0 (one GPU) passes 3,250 GPU-s at t=3250: job 1, arriving later, then preempts it; job 2, arriving
    # while job 1 (same queue 0) runs, does not preempt job 1 and waits.
    jobs = [job(0, 0, 5000), job(1, 4000, 1000), job(2, 4100, 10)]
    _, res, by = run("tiresias", jobs, table(), machines=1, per=1)
    assert first_run(by, 1) == 4000 and finish(by, 1) == pytest.approx(5000.3)
    assert first_run(by, 2) == pytest.approx(5000.3) and res.counters["suspends"] == 1


def test_sjf_runs_the_shorter_waiting_job_first(table):
    jobs = [job(0, 0, 100, gpus=2), job(1, 1, 50, gpus=2), job(2, 2, 10, gpus=1)]
    _, _, by = run("sjf", jobs, table(), machines=1, per=2)
    assert first_run(by, 2) == 100 and finish(by, 2) == 110
    assert finish(by, 1) == 160


def test_srtf_preempts_for_a_shorter_remaining_job(table):
    jobs = [job(0, 0, 1000), job(1, 100, 10)]
    _, res, by = run("srtf", jobs, table(), machines=1, per=1)
    assert finish(by, 1) == pytest.approx(110.3)            # it waits 0.3 s for job 0's state to leave the GPU
    assert finish(by, 0) == pytest.approx(1010.6)          # 10 s lost to job 1, 0.6 s to suspend + resume
    assert res.counters["suspends"] == 1


def test_tiresias_las_preempts_the_job_with_more_service(table):
    jobs = [job(0, 0, 1000), job(1, 500, 10)]
    _, res, by = run("tiresias", jobs, table(), machines=1, per=1, thresholds=(100.0,))
    assert first_run(by, 1) == 500 and finish(by, 1) == pytest.approx(510.3)   # after job 0's 0.3 s copy-out
    assert finish(by, 0) == pytest.approx(1010.6)
    assert res.counters["suspends"] == 1


def test_tiresias_demotes_a_job_at_every_threshold_it_crosses_in_one_run(table):
    # Job 1 preempts job 0 (queue 1) at t=120, passes 100 GPU-s (queue 1: no preemption within a queue) and
    # then 200 GPU-s in the same run: queue 2, so job 0 (queue 1) must take the GPU back at ~320 s. With only its
    # first crossing noticed, job 1 kept queue 1 and ran to its end (job 0 finished at ~2,000 s).
    jobs = [job(0, 0, 1000), job(1, 120, 1000)]
    _, res, by = run("tiresias", jobs, table(), machines=1, per=1, thresholds=(100.0, 200.0))
    assert res.counters["suspends"] == 2
    assert finish(by, 0) < finish(by, 1) and finish(by, 0) == pytest.approx(1201.2, abs=1.0)


def test_tiresias_does_not_preempt_within_a_queue(table):
    jobs = [job(0, 0, 50), job(1, 10, 10)]                  # both under the 100 GPU-s threshold
    _, res, by = run("tiresias", jobs, table(), machines=1, per=1, thresholds=(100.0,))
    assert finish(by, 0) == 50 and finish(by, 1) == 60
    assert res.counters["suspends"] == 0


def test_gandiva_undoes_a_pack_that_loses(table):
    # B with C packs at 0.5 + 0.4 = 0.9 < 1 + margin: introspection must undo it and remember the pair.
    pol = make_policy("gandiva")
    jobs = [job(0, 0, 1000, jtype="B"), job(1, 10, 1000, jtype="C")]
    _, res, by = run(pol, jobs, table(), machines=1, per=1)
    assert res.counters["packs"] == 1 and res.counters["unpacks"] == 1
    assert frozenset(("('B', 1)", "('C', 1)")) in pol.losing_pairs
    # Packed 120 s (measurement window) at 0.5, then time-sliced at ~0.49: job 0 ends well after 1000 s.
    assert finish(by, 0) > 1500


def test_gandiva_keeps_a_pack_that_wins(table):
    jobs = [job(0, 0, 1000, jtype="A"), job(1, 10, 1000, jtype="B")]   # 0.8 + 0.7 = 1.5
    _, res, by = run("gandiva", jobs, table(), machines=1, per=1)
    assert res.counters["packs"] == 1 and res.counters["unpacks"] == 0
    assert finish(by, 1) == pytest.approx(10 + 1000 / 0.7, rel=0.05) or finish(by, 1) < 10 + 1000 / 0.7 + 1


def test_gandiva_time_slices_when_a_pair_does_not_fit(table):
    jobs = [job(0, 0, 100, jtype="C"), job(1, 0, 100, jtype="C")]      # C with C: does not fit
    _, res, by = run("gandiva", jobs, table(), machines=1, per=1)
    assert res.counters["packs"] == 0
    assert first_run(by, 1) == 0                                      # progress at once, by time-slicing
    assert finish(by, 0) == pytest.approx(200 / (1 - 0.6 / 60), rel=0.01)


def _fragmented():
    # m0: long + short, m1: long + short; the shorts end at t=6, leaving one idle GPU on each machine;
    # then a 2-GPU job arrives and fits nowhere without moving a long job.
    return [job(0, 0, 10000), job(1, 1, 5), job(2, 2, 10000), job(3, 3, 3), job(4, 20, 100, gpus=2)]


@pytest.mark.parametrize("policy", ["gandiva", "gmux"])
def test_migration_defragments_for_a_multi_gpu_job(table, policy):
    _, res, by = run(policy, _fragmented(), table(), machines=2, per=2)
    assert res.counters["migrations"] == 1
    # The long job moves to the other machine, and the GPU it leaves stays its until the move's target has
    # restored (the source streams from its live memory): the 2-GPU job waits the whole 2-s flat move.
    assert first_run(by, 4) == 20 and finish(by, 4) == pytest.approx(122.0)


def test_fifo_without_migration_waits_for_the_fragmentation_to_clear(table):
    _, res, by = run("fifo", _fragmented(), table(), machines=2, per=2)
    assert res.counters["migrations"] == 0 and first_run(by, 4) == 10000


def test_gandiva_consolidates_a_spread_job_when_a_machine_frees(table):
    # A 2-GPU job that must start spread over two machines moves onto one when a machine empties.
    # m0: A (long) + B (ends t=100); m1: C (ends t=500) + D (ends t=50). E starts spread at t=110 on the
    # holes B and D left, runs at the unconsolidated rate (0.5 in this table), and moves beside itself on m1
    # when C ends.
    jobs = [job(0, 0, 10000), job(1, 0, 100), job(2, 0, 500), job(3, 0, 50), job(4, 110, 1000, gpus=2)]
    _, res, by = run("gandiva", jobs, table(), machines=2, per=2, defrag_moves=0)
    assert first_run(by, 4) == 110
    assert res.counters["migrations"] == 1
    assert finish(by, 4) == pytest.approx(500 + 2.0 + (1000 - 0.5 * 390))


def test_gandiva_grows_and_shrinks_an_elastic_job(table):
    jobs = [job(0, 0, 1000, gpus=2, elastic=True), job(1, 100, 100, gpus=2)]
    _, res, by = run("gandiva", jobs, table(), machines=1, per=4)
    assert res.counters["grows"] >= 1 and res.counters["shrinks"] >= 1
    assert first_run(by, 1) == 100                      # the grown job gives GPUs back at once
    assert finish(by, 0) < 1000                         # it ran faster while it had the spare GPUs


def test_gmux_packs_only_where_measurement_says_it_beats_preemption(table):
    pol = make_policy("gmux", explore=False, base_gpu_s=500.0, levels=2)
    eng_jobs = [job(0, 0, 10000, jtype="A"), job(1, 1000, 100, jtype="B")]
    _, res, _ = run(pol, eng_jobs, table(), machines=1, per=1)
    assert res.counters["packs"] == 0                   # never measured, no exploration: suspend, don't pack
    assert res.counters["suspends"] == 1


def test_gmux_suspends_the_older_job_of_a_losing_pack(table):
    pol = make_policy("gmux")
    jobs = [job(0, 0, 10000, jtype="B"), job(1, 0, 5000, jtype="C"), job(2, 7000, 10, jtype="B")]
    _, res, by = run(pol, jobs, table(), machines=1, per=1, base_gpu_s=1e6)
    assert res.counters["packs"] >= 1
    assert frozenset(("('B', 1)", "('C', 1)")) in pol.losing_pairs
    assert res.counters["suspends"] >= 1


def test_actions_that_would_lose_or_double_place_a_job_are_refused(table):
    from gmux.cluster.policies.api import Place, Policy

    class Greedy(Policy):
        name = "bad"

        def decide(self, snap, event):
            if event.kind is EventKind.ARRIVAL:
                return [Place(event.job_id, (0,)), Place(event.job_id, (1,))]
            return []

    with pytest.raises(PolicyError, match="is running, expected pending"):
        run(Greedy(), [job(0, 0, 10)], table(), machines=1, per=2)

    class Packer(Policy):
        name = "bad"

        def decide(self, snap, event):
            if event.kind is EventKind.ARRIVAL and event.job_id == 0:
                return [Place(0, (0,))]
            if event.kind is EventKind.ARRIVAL:
                from gmux.cluster.policies.api import Pack
                return [Pack(1, 0)]
            return []

    with pytest.raises(PolicyError, match="does not fit"):
        run(Packer(), [job(0, 0, 10, jtype="C"), job(1, 1, 10, jtype="C")], table(), machines=1, per=1)


def test_policy_that_strands_a_job_is_reported(table):
    from gmux.cluster.policies.api import Policy
    from gmux.cluster.sim.engine import SimulationError

    class Lazy(Policy):
        name = "lazy"

        def decide(self, snap, event):
            return []

    with pytest.raises(SimulationError, match="left 1 job"):
        run(Lazy(), [job(0, 0, 10)], table())


def test_policies_are_pure_functions_of_the_snapshot():
    """Same snapshot and event, same actions; nothing in the snapshot changes."""
    machines = [MachineView(m, tuple(range(m * 4, m * 4 + 4))) for m in range(2)]
    for name in ("fifo", "sjf", "srtf", "tiresias", "gandiva", "gmux"):
        outs = []
        for _ in range(2):
            snap = Snapshot(machines, now=5.0)
            for i in range(3):
                snap.add_job(JobView(job_id=i, num_gpus=2, job_type="('A', 1)", submit_time=float(i),
                                     remaining_hint=10.0, duration_hint=10.0))
            before = repr(sorted((j.job_id, j.state, j.gpus) for j in snap.jobs.values()))
            outs.append(make_policy(name).decide(snap, Event(EventKind.ARRIVAL, job_id=2)))
            assert repr(sorted((j.job_id, j.state, j.gpus) for j in snap.jobs.values())) == before
        assert outs[0] == outs[1] and len([a for a in outs[0] if hasattr(a, "gpus")]) == 3, name


def test_a_policy_that_never_lets_time_advance_is_reported_as_a_livelock(table):
    from gmux.cluster.policies.api import Place, Policy, SetTimer
    from gmux.cluster.sim.engine import Engine, SimulationError, make_machines

    class Insomniac(Policy):
        name = "insomniac"

        def decide(self, snap, event):
            acts = [SetTimer(snap.now, "again")]
            if event.kind is EventKind.ARRIVAL:
                acts.append(Place(event.job_id, (0,)))
            return acts

    eng = Engine(make_machines(1, 1), [job(0, 0, 10)], Insomniac(), table())
    eng.MAX_SAME_INSTANT = 1000
    with pytest.raises(SimulationError, match="livelock"):
        eng.run()


@pytest.mark.parametrize("name", ["sjf", "srtf"])
def test_jobs_submitted_at_one_instant_are_all_seen_before_the_first_decision(table, name):
    """A batch (four long, four short jobs at t=0 on four GPUs): decided arrival by arrival, SJF started the long
    ones, which came first in the trace, and SRTF started them and suspended them at once."""
    jobs = [job(i, 0, 1000) for i in range(4)] + [job(i, 0, 10) for i in range(4, 8)]
    _, res, by = run(name, jobs, table(), machines=1, per=4)
    assert [finish(by, i) for i in range(4, 8)] == [10] * 4 and [first_run(by, i) for i in range(4)] == [10] * 4
    assert res.counters["suspends"] == 0


def test_any_number_of_jobs_submitted_at_one_instant_is_no_livelock(table):
    from gmux.cluster.sim.engine import Engine, make_machines

    eng = Engine(make_machines(1, 8), [job(i, 0, 10) for i in range(50)], make_policy("fifo"), table())
    eng.MAX_SAME_INSTANT = 10
    assert len(eng.run().jobs) == 50

@pytest.mark.parametrize("name", ["sjf", "srtf", "tiresias", "gmux"])
def test_priority_policies_follow_a_fresh_snapshot_whose_jobs_changed(name):
    """gmux-scheduler builds a new snapshot per decision; jobs may come and go in between with equal counts."""
    machines = [MachineView(0, (0, 1))]
    pol = make_policy(name)

    def snapshot(ids, running):
        snap = Snapshot(machines, now=100.0)
        for i in ids:
            v = JobView(job_id=i, num_gpus=1, job_type="('A', 1)", submit_time=float(i), remaining_hint=50.0,
                        duration_hint=50.0, attained=10.0 if i in running else 0.0, updated_at=100.0)
            snap.add_job(v)
            if i in running:
                snap.set_state(v, JobState.RUNNING)
                snap.attach(v, (running.index(i),))
        return snap

    pol.decide(snapshot([1, 2, 3, 4], [1, 2]), Event(EventKind.TICK))
    acts = pol.decide(snapshot([5, 6, 7, 8], [5, 6]), Event(EventKind.TICK))   # same counts, all new jobs
    assert all(a.job_id in (5, 6, 7, 8) for a in acts if hasattr(a, "job_id"))


def test_a_re_key_chain_follows_the_job_and_a_timer_from_an_earlier_run_is_ignored():
    """Each crossing arms the next re-key; a timer left from a run that ended is dropped, so suspends and resumes
    never pile up chains of timers for one job."""
    from gmux.cluster.policies import SetTimer
    pol = make_policy("tiresias", thresholds=(100.0, 200.0, 300.0))
    snap = Snapshot([MachineView(0, (0,))], now=0.0)
    v = JobView(job_id=0, num_gpus=1, job_type="('A', 1)", submit_time=0.0)
    snap.add_job(v)
    acts = pol.decide(snap, Event(EventKind.ARRIVAL, job_id=0))
    timer = next(a for a in acts if isinstance(a, SetTimer))
    assert timer.at == pytest.approx(100.0) and timer.key[:2] == ("rekey", 0)
    snap.set_state(v, JobState.RUNNING)
    snap.attach(v, (0,))
    v.service_rate, v.last_start = 1.0, 0.0
    snap.now = 100.0 + 1e-6
    again = [a for a in pol.decide(snap, Event(EventKind.TIMER, key=timer.key)) if isinstance(a, SetTimer)]
    assert len(again) == 1 and again[0].at == pytest.approx(200.0) and again[0].key == timer.key
    stale = ("rekey", 0, timer.key[2] - 1)
    assert not [a for a in pol.decide(snap, Event(EventKind.TIMER, key=stale)) if isinstance(a, SetTimer)]


def test_gmux_ranks_a_job_that_would_idle_a_wider_gang_by_the_gpus_it_really_holds(table):
    # One 1-GPU job arrives while an 8-GPU job runs: suspending the gang for it would leave 7 GPUs idle, so it
    # counts as 8 x its 60 GPU-s (queue 3) and waits for the gang to pass 960 GPU-s (queue 4, at t=120) instead of
    # preempting at once (its own queue 0 against the gang's 3 at t=60). Plain ranking: at once.
    jobs = [job(0, 0, 1000, gpus=8), job(1, 60, 50)]
    _, res, by = run("gmux", jobs, table(), min_run_s=0.0)
    assert first_run(by, 1) == pytest.approx(120.0, abs=0.01) and res.counters["suspends"] == 1
    _, _, plain = run("gmux", jobs, table(), min_run_s=0.0, idle_aware=False)
    assert first_run(plain, 1) == pytest.approx(60.0, abs=0.01)


def test_gmux_suspends_a_wider_gang_at_once_when_waiting_jobs_take_the_rest(table):
    jobs = [job(0, 0, 1000, gpus=8)] + [job(i, 60, 50) for i in range(1, 9)]
    _, res, by = run("gmux", jobs, table(), min_run_s=0.0)
    assert all(first_run(by, i) == pytest.approx(60.0, abs=0.01) for i in range(1, 9))
    assert res.counters["suspends"] == 1


@pytest.mark.parametrize("machines", [[], [MachineView(0, ())]], ids=["no machine up", "a machine without GPUs"])
@pytest.mark.parametrize("name", ["fifo", "fifo-bf", "sjf", "srtf", "tiresias", "gandiva", "gmux"])
def test_a_cluster_with_no_gpu_up_places_nothing_and_does_not_fail(name, machines):
    """gmux-scheduler asks for decisions while every machine may be down (one killed, the others late with
    their reports): waiting jobs, of one GPU and of several, stay waiting (a Gandiva scheduler once died here
    dividing by the GPUs per machine, 0)."""
    pol = make_policy(name)
    for kind in (EventKind.ARRIVAL, EventKind.TICK, EventKind.COMPLETION):
        snap = Snapshot(machines, now=50.0)
        for i, n in enumerate((1, 2, 4)):
            snap.add_job(JobView(job_id=i, num_gpus=n, job_type="('A', 1)", submit_time=float(i),
                                 remaining_hint=10.0, duration_hint=10.0))
        acts = pol.decide(snap, Event(kind, job_id=2 if kind is EventKind.ARRIVAL else None))
        assert not [a for a in acts if hasattr(a, "gpus")], (name, acts)


@pytest.mark.parametrize("last_ends_at", [1030.0, 2000.0], ids=["a GPU frees within the delay", "none frees"])
def test_gmux_newcomer_waits_its_own_expected_run_for_a_free_gpu_before_it_suspends_anyone(table, last_ends_at):
    # Eight 1-GPU jobs fill the machine; a 50-s job arrives at t=1000. Nothing is learned yet, so it expects a
    # minute (GRID0) and waits that long for a GPU to free by itself: job 7's end at 1030 s serves it with no
    # suspend; with none ending by 1060 s it displaces one then. Without the delay it displaces one at once.
    jobs = [job(i, 0, 10_000) for i in range(7)] + [job(7, 0, last_ends_at), job(8, 1000, 50)]
    _, res, by = run("gmux", jobs, table())
    if last_ends_at < 1060:
        assert first_run(by, 8) == pytest.approx(last_ends_at, abs=0.5) and res.counters["suspends"] == 0
    else:
        assert first_run(by, 8) == pytest.approx(1060.0, abs=1.0) and res.counters["suspends"] == 1
    _, eager, by = run("gmux", jobs, table(), preempt_delay=0.0)
    assert first_run(by, 8) == pytest.approx(1000.0, abs=1.0) and eager.counters["suspends"] == 1


def test_gmux_refuses_a_negative_or_nan_preempt_delay():
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="preempt_delay"):
            make_policy("gmux", preempt_delay=bad)


@pytest.mark.parametrize("pairs", [None, {}])
def test_gandiva_serves_a_narrow_job_before_wide_ones_submitted_after_it(table, pairs):
    """Four 8-GPU jobs time-slice (or pack on) the machine's 8 GPUs; a 1-GPU job comes, then four more 8-GPU jobs.
    Each wide job joined a share as another ended, so no GPU ever went idle for the narrow one, which waited for
    all of them (FIFO among waiting jobs, as the policy says)."""
    jobs = [job(i, i, 10_000, gpus=8) for i in range(4)] + [job(4, 100, 60)] + \
        [job(i, 100 * (i - 3), 10_000, gpus=8) for i in range(5, 9)]
    _, _, by = run("gandiva", jobs, table(pairs), machines=1, per=8)
    assert first_run(by, 4) < min(first_run(by, i) for i in range(5, 9))


@pytest.mark.parametrize("name", ["gmux", "gmux-law"])
def test_a_batch_arriving_as_the_law_changes_leaves_no_stale_entry_behind(table, name):
    """gmux-law learns each job's size at its arrival: a changed law emptied the keys but not the list beside
    them, and the second job of a batch, filed already by the first one's decision, was listed twice; once it
    had run and ended, the next decision looked it up (KeyError in the Philly replay at x0.35). Here the law is
    taken to change before every decision."""
    from gmux.cluster.sim.engine import Engine, make_machines
    from sim_harness import FLAT

    pol = make_policy(name)
    listed, decide = [], pol.decide

    def as_the_law_changes(snap, event):
        pol._model_version = None
        out = decide(snap, event)
        listed.append((len(pol._waiting), len(pol._keys)))
        return out

    pol.decide = as_the_law_changes
    jobs = [job(0, 0, 10_000), job(1, 10, 100), job(2, 10, 200), job(3, 400, 50), job(4, 500, 50)]
    res = Engine(make_machines(1, 2), jobs, pol, table(), FLAT, check=True).run()
    assert sorted(r[0] for r in res.jobs) == [0, 1, 2, 3, 4]
    assert all(w == k for w, k in listed), listed
