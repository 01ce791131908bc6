"""End to end: a job whose mini-batch is longer than the quantum, time-sliced with two short-step jobs.

Its turn stretches to a couple of its mini-batches (gmux.node.pacing), so it is not suspended once per step
(at a 0.2 s quantum and 0.5 s mini-batches it would be, one suspend per step), it always makes its suspend's
deadline (never stopped), and the GPU-seconds of the three jobs add up to the GPU's wall time within 10%.
"""
import time

from node_harness import TRAIN

QUANTUM = "0.2"
WINDOW_S = 10.0


def test_a_long_mini_batch_is_not_suspended_once_per_step_and_gpu_time_adds_up(node_factory, tmp_path):
    node = node_factory("--virtual-gpus", "1x1GiB", "--quantum", QUANTUM, "--no-pack")
    procs = {n: node.launch(TRAIN, str(tmp_path / f"{n}.json"), "100000", "--sleep", "0.005",
                            opts=["--mem", "300MiB"]) for n in ("a", "b")}
    procs["long"] = node.launch(TRAIN, str(tmp_path / "long.json"), "1000", "--sleep", "0.5",
                                opts=["--mem", "300MiB"])
    ids = {n: node.job_of(p.pid) for n, p in procs.items()}
    # Its mini-batch time is measured from its second boundary on.
    node.wait_for(lambda: node.job(ids["long"])["step"] >= 3, 60, lambda: node.ps())
    before, t0 = {j["id"]: j for j in node.ps()["jobs"]}, time.monotonic()
    time.sleep(WINDOW_S)
    after, t1 = {j["id"]: j for j in node.ps()["jobs"]}, time.monotonic()
    delta = {n: {k: after[i][k] - before[i][k] for k in ("step", "suspends", "stops", "gpu_seconds")}
             for n, i in ids.items()}
    accounted = sum(d["gpu_seconds"] for d in delta.values()) / (t1 - t0)
    print(f"over {t1 - t0:.1f} s: {delta}; GPU-seconds / wall time = {accounted:.3f}")
    long = delta["long"]
    assert long["step"] >= 3, delta
    assert long["suspends"] <= 0.7 * long["step"], delta      # about one suspend per two of its steps
    assert long["stops"] == 0, delta
    assert 0.9 <= accounted <= 1.1, accounted
