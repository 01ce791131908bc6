"""Placement decisions as pure functions: single-GPU placement, whole GPUs, and defragmentation plans."""
from gmux.node.placement import GpuView, Occupant, plan_defrag, single_gpu, whole_gpus

GiB = 1 << 30


def job(id, mem=GiB, bytes=GiB, movable=True, why_not=""):
    return Occupant(id, mem, bytes, movable, why_not)


def test_single_gpu_least_loaded_skips_held_gpus_and_keeps_free_ones_free():
    gpus = [GpuView(0, 16 * GiB, [job("a")]), GpuView(1, 16 * GiB, []), GpuView(2, 16 * GiB, [], owner="big")]
    assert single_gpu(gpus, GiB) == 1                       # least loaded
    assert single_gpu(gpus, GiB, keep_free=True) == 0       # a multi-GPU job waits: leave GPU 1 whole
    assert single_gpu(gpus, GiB, pinned=2) is None          # held exclusively: the pinned job waits
    assert single_gpu(gpus, 32 * GiB) is None
    gpus[1].reserved = "gang g"
    assert single_gpu(gpus, GiB) == 0                       # being freed for a waiting gang


def test_whole_gpus_takes_free_ones_reserved_first_and_honours_pins():
    gpus = [GpuView(0, 16 * GiB, []), GpuView(1, 16 * GiB, [job("a")]), GpuView(2, 16 * GiB, [], reserved="u"),
            GpuView(3, 16 * GiB, [], reserved="other")]
    assert whole_gpus(gpus, "u", 1, GiB) == [2]
    assert whole_gpus(gpus, "u", 2, GiB) == [0, 2]
    assert whole_gpus(gpus, "u", 3, GiB) is None           # GPU 1 is busy, GPU 3 is another unit's
    assert whole_gpus(gpus, "u", 1, GiB, pinned=(0,)) == [0]
    assert whole_gpus(gpus, "u", 1, GiB, pinned=(1,)) is None
    assert whole_gpus(gpus, "u", 1, 32 * GiB) is None


def test_defrag_frees_the_gpus_that_cost_the_fewest_bytes():
    gpus = [GpuView(0, 16 * GiB, [job("big", 4 * GiB, 4 * GiB)]),
            GpuView(1, 16 * GiB, [job("small", GiB, GiB)]),
            GpuView(2, 16 * GiB, [job("idle", 2 * GiB, 0)]),      # not started: moves by bookkeeping
            GpuView(3, 16 * GiB, [])]
    plan, why = plan_defrag(gpus, "u", 2, GiB)
    assert why == "" and plan.gpus == [2, 3] and plan.bytes == 0
    assert [(m.job, m.src) for m in plan.moves] == [("idle", 2)] and plan.moves[0].dst in (0, 1)
    plan, _ = plan_defrag(gpus, "u", 3, GiB)
    assert plan.gpus == [1, 2, 3] and plan.bytes == GiB       # "small" rather than "big"
    assert {m.job: m.dst for m in plan.moves} == {"small": 0, "idle": 0}


def test_defrag_never_moves_a_job_onto_a_gpu_too_small_for_it():
    gpus = [GpuView(0, 16 * GiB, [job("a", 12 * GiB)]), GpuView(1, 8 * GiB, [job("b", 4 * GiB)]),
            GpuView(2, 16 * GiB, [])]
    plan, _ = plan_defrag(gpus, "u", 2, GiB)
    # Freeing 0 would need a 12 GiB job on the 8 GiB GPU: free 1 instead, its job going to GPU 0.
    assert plan.gpus == [1, 2] and [(m.job, m.dst) for m in plan.moves] == [("b", 0)]
    gpus[2].owner = "other"      # nowhere left to put the jobs of GPUs 0 and 1
    plan, why = plan_defrag(gpus, "u", 2, GiB)
    assert plan is None and "no way to free 2 whole GPUs" in why and "GPU 2 is held by other" in why


def test_unmovable_jobs_pin_their_gpu_and_the_reason_is_named():
    gpus = [GpuView(0, 16 * GiB, [job("t", movable=False, why_not="transparent mode")]),
            GpuView(1, 16 * GiB, [job("a")]), GpuView(2, 16 * GiB, [job("b")], owner=None),
            GpuView(3, 16 * GiB, [], owner="other")]
    plan, _ = plan_defrag(gpus, "u", 1, GiB)
    assert plan.gpus in ([1], [2]) and len(plan.moves) == 1 and plan.moves[0].dst != 3
    plan, _ = plan_defrag(gpus, "u", 2, GiB)
    assert plan.gpus == [1, 2] and {m.dst for m in plan.moves} == {0}   # both onto the pinned GPU, time-sliced
    plan, why = plan_defrag(gpus, "u", 3, GiB)
    assert plan is None and "t, which cannot move (transparent mode)" in why and "held by other" in why
    plan, why = plan_defrag(gpus, "u", 1, GiB, pinned=(0,))
    assert plan is None and "pinned GPU 0 cannot be freed" in why
