"""End to end: packing with introspection keeps a pair that gains and unpacks a pair that interferes.

On virtual GPUs jobs compute on the CPU. Two jobs that saturate their device (here: compute only while
holding their virtual GPU's lock, as kernels filling every SM do) run at about half speed each when packed:
the sum of packed/solo rates is ~1, no gain. Two jobs that mostly wait for input (sleep) run at nearly full
speed together (sum ~2). Plain core contention would show interference too, but on a shared 2-core machine
whose other load varies it is too noisy for a test that must pass or fail for the right reason.
"""
import time

from node_harness import TRAIN


def test_gaining_pair_kept_interfering_pair_unpacked(node_factory, tmp_path):
    node = node_factory("--virtual-gpus", "2x1GiB", "--quantum", "1", "--pack-window", "3", "--pack-margin", "0.5")
    kinds = {}
    # Launch order alternates so that placement (least loaded GPU) puts each kind on its own GPU.
    for i, (kind, extra) in enumerate((("compute", ["--exclusive", "--hidden", "512", "--depth", "2", "--batch", "256"]),
                                       ("waiting", ["--sleep", "0.01"]),
                                       ("compute", ["--exclusive", "--hidden", "512", "--depth", "2", "--batch", "256"]),
                                       ("waiting", ["--sleep", "0.01"]))):
        p = node.launch(f"{TRAIN}", str(tmp_path / f"{i}.json"), "10000000", *extra, "--attach",
                        opts=["--no-hook", "--mem", "300MiB"])
        kinds[node.job_of(p.pid)] = kind
    ps = node.ps()
    gpu_of = {j["id"]: j["gpu"] for j in ps["jobs"]}
    compute = sorted(j for j, k in kinds.items() if k == "compute")
    waiting = sorted(j for j, k in kinds.items() if k == "waiting")
    assert len({gpu_of[j] for j in compute}) == 1 and len({gpu_of[j] for j in waiting}) == 1

    def decisions():
        return [d for d in node.call("decisions", limit=100)["decisions"] if d["kind"] in ("keep", "unpack")]
    node.wait_for(lambda: len(decisions()) >= 2, 90, "two packing decisions")
    by_jobs = {tuple(d["jobs"]): d for d in decisions()}
    keep = by_jobs[tuple(waiting)]
    unpack = by_jobs[tuple(compute)]
    print("kept:", keep["text"])
    print("unpacked:", unpack["text"])
    assert keep["kind"] == "keep" and keep["numbers"]["sum"] > 1.5
    assert unpack["kind"] == "unpack" and unpack["numbers"]["sum"] <= 1.5
    for d in (keep, unpack):            # the numbers behind the decision are logged with it
        assert set(d["numbers"]) >= {"solo", "packed", "normalised", "sum", "margin"}
        assert all(v > 0 for v in d["numbers"]["solo"].values())
    # Afterwards: the kept pair runs together; the unpacked pair is time-sliced, one at a time.
    time.sleep(2.5)
    samples = []
    for _ in range(8):
        g = {x["index"]: x for x in node.ps()["gpus"]}
        samples.append((set(g[gpu_of[waiting[0]]]["resident"]), set(g[gpu_of[compute[0]]]["resident"])))
        time.sleep(0.25)
    assert sum(w == set(waiting) for w, _ in samples) >= 6, samples
    assert all(len(c) <= 1 for _, c in samples), samples
    assert len({frozenset(c) for _, c in samples if c}) >= 1
