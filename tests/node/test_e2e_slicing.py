"""End to end, real processes and sockets: three jobs time-sliced 1:1:2 on one virtual GPU.

Their working sets (600 MiB each on a 1 GiB GPU) do not fit two at a time, so gmuxd must time-slice. Over the
window in which all three are running, each job's share of GPU time must be within ±10% of its weight's
share, and every job must end bit-identical to a run of the same script without gmux.
"""
import time

import pytest

from node_harness import TRAIN, paced, result, start_py, unpace

STEPS = "3000"
QUANTUM = 0.25
# Paced at 4 ms a step (12 s of GPU time each for 3,000 steps) until the test has seen the rounds it judges, then
# at full speed: a step count alone gave no round at all on a loaded machine, where each start took seconds.
# (At 2 ms and 6,000 steps as long a margin cost twice the steps, each a few tenths of a ms of CPU, in the jobs
# and in their references; a mini-batch that a quantum overshoots by is still under 2% of it.)
# Pacing changes no number, so the solo references run unpaced.
PACE_S = "0.004"
ROUNDS = 8   # (4 left a share 10.1% off once in CI: a quantum overshot by a mini-batch weighs more)
# The transparent-mode test's jobs: 2,000 steps, paced at 5 ms (10 s each: the first still runs once the second
# has started, however slowly) until each has been suspended twice.
HOOK_STEPS, HOOK_PACE_S = "2000", "0.005"


def test_weighted_time_slicing_shares_and_bit_identity(node_factory, tmp_path):
    # The references run without gmux, side by side, while the jobs under gmux start (forked warm, they are done
    # long before the jobs' imports, and so before any round is judged); read at the end.
    refs = {}
    procs = []
    for name, batch in (("ab", "32"), ("c", "33")):
        out = tmp_path / f"solo_{name}.json"
        procs.append(start_py(TRAIN, str(out), STEPS, "--batch", batch))
        refs[name] = out
    node = node_factory("--virtual-gpus", "1x1GiB", "--quantum", str(QUANTUM), "--no-pack")
    jobs = {}
    for name, weight, batch in (("a", "1", "32"), ("b", "1", "32"), ("c", "2", "33")):
        p = node.launch(f"{TRAIN}", str(tmp_path / f"{name}.json"), STEPS, "--batch", batch,
                        *paced(tmp_path, PACE_S), "--attach",
                        opts=["--no-hook", "--mem", "600MiB", "--weight", weight])
        jobs[name] = node.job_of(p.pid)
    # Sample GPU time until enough rounds are seen (or the first job ends). Shares are judged over whole rounds:
    # from the start of one turn of the weight-2 job to the start of a later one (a window cut mid-round is off
    # by up to a quantum). The window must hold at least 3 rounds, enough for ±10% when a quantum overshoots by a
    # mini-batch.
    starts = []
    max_resident_mem = 0
    was_running = True
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and len(starts) <= ROUNDS:
        ps = node.ps()
        by = {j["id"]: j for j in ps["jobs"]}
        max_resident_mem = max(max_resident_mem, ps["gpus"][0]["resident_mem"])
        if any(by[j]["state"] in ("exited", "failed", "killed", "lost") for j in jobs.values()):
            break
        running = by[jobs["c"]]["state"] == "running"
        # Counted from when the slicer has absorbed start-up (a job's first turn includes its process start
        # and overshoots the quantum; stride scheduling pays that back over the next rounds): weighted GPU
        # times within two quanta of each other.
        # At a turn of C, jobs a and b must have had equally many turns (stride may split C's two quanta by
        # one of them): their weighted times within half a quantum.
        vts = [by[j]["vtime"] for j in jobs.values()]
        level = None not in vts and max(vts) - min(vts) <= 1.0
        even = None not in vts and abs(vts[0] - vts[1]) <= QUANTUM / 2
        if running and not was_running and (starts or level) and even:
            starts.append({n: by[j]["gpu_seconds"] for n, j in jobs.items()})
        was_running = running
        time.sleep(0.03)
    unpace(tmp_path)
    assert len(starts) > ROUNDS, f"only {len(starts) - 1} rounds observed\n" + node.log()
    first, last = starts[0], starts[-1]
    used = {n: last[n] - first[n] for n in jobs}
    total = sum(used.values())
    shares = {n: used[n] / total for n in used}
    print(f"GPU-time shares over {len(starts) - 1} rounds ({total:.1f} GPU-s):", shares)
    for n, expected in (("a", 0.25), ("b", 0.25), ("c", 0.5)):
        assert shares[n] == pytest.approx(expected, rel=0.10), shares
    assert max_resident_mem <= 1 << 30      # never two 600 MiB jobs on the 1 GiB GPU at once
    for p in node.procs:
        assert p.wait(180) == 0
    for p in procs:
        assert p.wait(120) == 0
    ps = node.ps()
    for n, j in jobs.items():
        info = next(x for x in ps["jobs"] if x["id"] == j)
        assert info["state"] == "exited" and info["suspends"] >= 3, info
        assert result(tmp_path / f"{n}.json")["sha256"] == result(refs["c" if n == "c" else "ab"])["sha256"], n
    assert ps["gpus"][0]["switches"] >= 10


def test_unmodified_scripts_time_sliced_through_the_hook(node_factory, tmp_path):
    """Transparent mode: plain torch scripts, boundaries from the optimizer hook gmux-launch installs."""
    ref = start_py(TRAIN, str(tmp_path / "solo.json"), HOOK_STEPS)
    node = node_factory("--virtual-gpus", "1x1GiB", "--quantum", "0.5", "--no-pack")
    procs = [node.launch(f"{TRAIN}", str(tmp_path / f"t{i}.json"), HOOK_STEPS, *paced(tmp_path, HOOK_PACE_S),
                         opts=["--mem", "600MiB"]) for i in range(2)]
    ids = [node.job_of(p.pid) for p in procs]
    node.wait_for(lambda: all(node.job(j)["suspends"] >= 2 for j in ids), 120, lambda: node.ps())
    unpace(tmp_path)
    for p in procs:
        assert p.wait(120) == 0
    assert ref.wait(120) == 0
    solo = result(tmp_path / "solo.json")["sha256"]
    for i, j in enumerate(ids):
        info = node.job(j)
        assert info["state"] == "exited" and info["suspends"] >= 2, info
        assert result(tmp_path / f"t{i}.json")["sha256"] == solo
